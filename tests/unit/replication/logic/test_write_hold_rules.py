"""A new head's write hold, narrowed to where it is needed (docs/manager.md, "Head leases"):
the node's pure hold bookkeeping (``adopt_holds``, ``release``) and the leader's pure estimate of
what is left of the old head's lease (kayos/manager/member/holds.py), as transcripts with plain
times, and the checks of ``POST /v1/admin/write-hold``. No clock, no processes."""

from __future__ import annotations

import math

import pytest

from kayos import limits
from kayos.errors import InvalidRequest, Unauthenticated
from kayos.identity import ClusterIdentity
from kayos.manager.member.holds import hold_ms, record_grants, shard_heads
from kayos.node.http.lease_api import apply_write_hold
from kayos.replication.logic.lease import (
    NodeLease,
    WriteHold,
    adopt_holds,
    boot_holds,
    lease_won,
    release,
)
from kayos.signing import sign
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

LEASE_MS = limits.head_lease_ms
LEASE_S = LEASE_MS / 1000


def topology(epoch: int, *chains: str) -> Topology:
    addrs = {n: NodeAddr(n, "127.0.0.1", 7101 + i, 7201 + i) for i, n in enumerate("abcde")}
    shards = {i: ShardChain(i, tuple(chain), ()) for i, chain in enumerate(chains)}
    return Topology(epoch, addrs, shards)


# --- the node ----------------------------------------------------------------------------------


def test_a_middle_or_tail_removed_costs_no_hold() -> None:
    assert adopt_holds("a", topology(1, "abc"), topology(2, "ac"), {}, 10.0) == {}
    assert adopt_holds("a", topology(1, "abc"), topology(2, "ab"), {}, 10.0) == {}
    assert adopt_holds("a", topology(1, "ab"), topology(2, "abd"), {}, 10.0) == {}  # a learner in


def test_a_node_that_starts_holds_every_shard_it_heads_until_its_lease() -> None:
    # docs/node-api.md, "Writes after a restart": a's topology may be stale (rule 3 may have
    # given shard 1 to another member while a's store was lost).
    started = topology(7, "abc", "ab", "bca")
    holds = boot_holds("a", started)
    assert holds == {0: WriteHold(7, math.inf), 1: WriteHold(7, math.inf)}
    assert boot_holds("c", started) == {}
    # A head change adopted meanwhile runs its own hold, which the lease does not end.
    changed = adopt_holds("a", started, topology(8, "abc", "ab", "acb"), holds, 10.0)
    assert changed == {**holds, 2: WriteHold(8, 10.0 + LEASE_S)}
    assert lease_won(changed) == {2: WriteHold(8, 10.0 + LEASE_S)}
    # The leader's word on a shard still held from the start gives it an end.
    assert release(holds, 0, 7, 300, 20.0)[0] == WriteHold(7, 20.3, told=True)


def test_the_first_lease_ends_the_holds_of_a_start() -> None:
    lease = NodeLease(managed=True, epoch=7)
    ended: list[bool] = []
    lease.on_held = lambda: ended.append(True)
    assert not lease.granted(lease.ask(), 8, True)  # a later epoch than the node's: kept, no end
    assert ended == []
    assert lease.granted(lease.ask(), 7, True)
    assert ended == [True]


def test_a_new_head_holds_the_whole_lease_until_the_leader_says_less() -> None:
    holds = adopt_holds("b", topology(1, "abc"), topology(2, "bc"), {}, 10.0)
    assert holds == {0: WriteHold(2, 10.0 + LEASE_S)}
    # The old head was silent: nothing of its lease is left.
    assert release(holds, 0, 2, 0, 10.3) == {0: WriteHold(2, 10.3, told=True)}
    # A slow old head answered 100 ms ago: what is left of its lease from then.
    left_ms = LEASE_MS - 100
    assert release(holds, 0, 2, left_ms, 10.05) == {
        0: WriteHold(2, 10.05 + left_ms / 1000, told=True)
    }
    # A release never lengthens a hold.
    assert release(holds, 0, 2, LEASE_MS, 10.5) == {0: WriteHold(2, 10.0 + LEASE_S, told=True)}


def test_a_release_for_an_older_epoch_leaves_a_newer_hold() -> None:
    # b became head at 2, lost it at 3, is head again at 4: the leader's word at epoch 2 did not
    # see the head of epoch 3.
    holds = adopt_holds("b", topology(3, "cb"), topology(4, "bc"), {}, 20.0)
    assert holds == {0: WriteHold(4, 20.0 + LEASE_S)}
    assert release(holds, 0, 2, 0, 20.1) == holds
    assert release(holds, 0, 5, 0, 20.1) == {
        0: WriteHold(4, 20.1, told=True)
    }  # a later view covers it
    assert release(holds, 1, 5, 0, 20.1) == holds  # no hold on that shard
    assert release({}, 0, 5, 0, 20.1) == {}


def test_holds_follow_headship_shard_by_shard() -> None:
    old = topology(1, "abc", "bca")
    holds = adopt_holds("b", old, topology(2, "bc", "bca"), {}, 5.0)
    assert holds == {0: WriteHold(2, 5.0 + LEASE_S)}  # shard 1: b headed it already
    # b stops heading shard 0: its hold goes; a hold still running on another shard stays.
    later = adopt_holds("b", topology(2, "bc", "bca"), topology(3, "cb", "bca"), holds, 5.5)
    assert later == {}
    kept = adopt_holds("b", topology(2, "bc", "bca"), topology(3, "bc", "bc"), holds, 5.5)
    assert kept == holds


# --- the leader --------------------------------------------------------------------------------


def test_grant_times_keep_the_latest_per_epoch_and_forget_ended_leases() -> None:
    times = record_grants({}, [("a", 4, 1_000), ("b", 4, 1_000)], 1_000)
    times = record_grants(times, [("a", 4, 1_200), ("a", 5, 1_200)], 1_200)
    assert times == {"a": {4: 1_200, 5: 1_200}, "b": {4: 1_000}}
    assert record_grants(times, [], 1_000 + LEASE_MS) == {"a": {4: 1_200, 5: 1_200}}
    assert record_grants(times, [], 1_200 + LEASE_MS) == {}


def test_a_dead_head_costs_no_hold() -> None:
    # The leader began at epoch 4 (elected at 0 ms); a granted at epoch 4 until it went silent at
    # 1_000; spliced out at epoch 5 after the detection window (7_000).
    grants = record_grants({}, [("a", 4, 1_000), ("b", 4, 1_000)], 1_000)
    grants = record_grants(grants, [("b", 4, 6_800)], 6_800)
    heads = [(4, "a"), (5, "b")]
    assert hold_ms("b", heads, grants, 0, 7_000) == 0


def test_a_slow_head_that_still_answers_costs_at_most_the_lease() -> None:
    # a answered (and was granted at epoch 4) at 6_900; removed as slow at epoch 5, 7_000.
    grants = record_grants({}, [("a", 4, 6_900)], 6_900)
    assert hold_ms("b", [(4, "a"), (5, "b")], grants, 0, 7_000) == LEASE_MS - 100
    # Grants at the change's epoch or later extend nothing at a that has not adopted it (and a
    # that has adopted it heads nothing): they do not count.
    grants = record_grants(grants, [("a", 5, 7_050), ("a", 6, 7_100)], 7_100)
    assert hold_ms("b", [(4, "a"), (5, "b")], grants, 0, 7_150) == 6_900 + LEASE_MS - 7_150


def test_a_new_leader_counts_its_election_for_older_grants() -> None:
    # Elected at 5_000; the head changed at epoch 9, before it began (epoch 9): older leaders'
    # grants end before 5_000 + head_lease_ms.
    assert hold_ms("b", [(9, "b")], {}, 5_000, 5_300) == LEASE_MS - 300
    assert hold_ms("b", [(9, "b")], {}, 5_000, 5_000 + LEASE_MS + 1) == 0


def test_every_head_in_between_counts_and_unknown_history_holds_the_whole_lease() -> None:
    # a -> c (epoch 5) -> b (epoch 6), between two rounds: c may hold a lease from a grant as a
    # middle at epoch 4, so it counts as well as a.
    grants = record_grants({}, [("a", 4, 1_000), ("c", 4, 1_200)], 1_200)
    heads = [(4, "a"), (5, "c"), (6, "b")]
    assert hold_ms("b", heads, grants, 0, 1_300) == 1_200 + LEASE_MS - 1_300
    # b itself headed before: its own lease is no reason to hold.
    grants = record_grants(grants, [("b", 5, 1_250)], 1_250)
    assert (
        hold_ms("b", [(4, "b"), (5, "a"), (6, "b")], grants, 0, 1_300) == 1_000 + LEASE_MS - 1_300
    )
    assert hold_ms("b", None, grants, 0, 10_000) == LEASE_MS


def test_the_heads_come_from_the_change_records() -> None:
    def record(epoch: int, *chains: str) -> dict[str, object]:
        shards = [{"id": i, "chain": list(c), "moves": []} for i, c in enumerate(chains)]
        return {"entry": epoch, "epoch": epoch, "shards": shards, "queues": []}

    records = [record(3, "abc", "bca"), record(4, "bc", "bca"), record(5, "bc", "ca")]
    start = (3, {0: "a", 1: "b"})
    assert shard_heads(0, start, records, 5) == [(3, "a"), (4, "b"), (5, "b")]
    assert shard_heads(1, start, records, 5) == [(3, "b"), (4, "b"), (5, "c")]
    assert shard_heads(0, start, records[:1] + records[2:], 5) is None  # epoch 4 dropped
    assert shard_heads(0, start, records, 6) is None  # not applied yet
    assert shard_heads(0, (5, {0: "b"}), records, 5) == [(5, "b")]


# --- the message -------------------------------------------------------------------------------


IDENTITY = ClusterIdentity("00000000-0000-4000-8000-000000000001", bytes(range(32)))


def message(body: dict[str, object], purpose: str = "write-hold") -> dict[str, object]:
    return {"body": body, "mac": sign(IDENTITY, purpose, body)}


def test_the_write_hold_message_is_checked_before_it_changes_anything() -> None:
    calls: list[tuple[int, int, int]] = []

    def release_hold(shard: int, epoch: int, hold_ms: int) -> int | None:
        calls.append((shard, epoch, hold_ms))
        return 120

    body = {"epoch": 7, "shard": 0, "hold_ms": 0}
    assert apply_write_hold(IDENTITY, release_hold, message(body)) == {"shard": 0, "held_ms": 120}
    assert calls == [(0, 7, 0)]
    with pytest.raises(Unauthenticated):
        apply_write_hold(IDENTITY, release_hold, message(body, purpose="lease"))
    with pytest.raises(InvalidRequest):
        apply_write_hold(IDENTITY, release_hold, message({**body, "extra": 1}))
    with pytest.raises(InvalidRequest):
        apply_write_hold(IDENTITY, release_hold, message({**body, "hold_ms": -1}))
    assert calls == [(0, 7, 0)]
