"""The node's read lease from the manager (kayos/replication/logic/lease.py): transcripts of the
pure ``decide(state, event)`` with plain times, the heads that hold writes after a splice
(``write_holds``) and the leader's grants (``driver.lease_grants``). docs/manager.md, "Head
leases". No clock, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from kayos import limits
from kayos.manager import Config, ManagerView, TimerTick, decide
from kayos.manager.member.plan import Answer, lease_grants
from kayos.replication.logic.lease import (
    Asked,
    Ended,
    EpochAdopted,
    Granted,
    LeaseEvent,
    LeaseState,
    holds,
    write_holds,
)
from kayos.replication.logic.lease import decide as lease_decide
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

LEASE_S = limits.head_lease_ms / 1000
STEP_S = limits.lease_nonce_interval_ms / 1000


def run(state: LeaseState, events: list[LeaseEvent]) -> tuple[LeaseState, list[str]]:
    notes: list[str] = []
    for event in events:
        state, more = lease_decide(state, event)
        notes += more
    return state, notes


def test_without_a_manager_the_lease_always_holds() -> None:
    state = LeaseState(managed=False, epoch=1)
    assert holds(state, 0.0)
    assert holds(state, 1e9)


def test_a_managed_node_holds_nothing_until_the_leader_answers() -> None:
    state, _ = run(LeaseState(managed=True, epoch=1), [Asked(10.0)])
    assert state.nonce == 1
    assert not holds(state, 10.0)


def test_granted_from_the_time_the_nonce_went_out_and_expires() -> None:
    state, notes = run(LeaseState(managed=True, epoch=3), [Asked(10.0), Granted(1, 3, True)])
    assert notes == []
    assert state.until_s == 10.0 + LEASE_S  # from the ask, not from the answer
    assert holds(state, 10.0 + LEASE_S - 0.001)
    assert not holds(state, 10.0 + LEASE_S)  # expired: no later answer came


def test_a_later_grant_extends_and_an_earlier_one_never_shortens() -> None:
    state, _ = run(
        LeaseState(managed=True, epoch=1),
        [Asked(10.0), Asked(11.0), Granted(2, 1, True), Granted(1, 1, True)],
    )
    assert state.until_s == 11.0 + LEASE_S
    assert state.asks == ()  # a grant forgets its nonce and every older one: replays do nothing


def test_an_epoch_the_node_holds_grants_a_newer_one_extends_nothing() -> None:
    # Granted at an older epoch than the node's: the node adopted the later change, which came
    # after the grant's entry in the log; granted.
    older, _ = run(LeaseState(managed=True, epoch=5), [Asked(1.0), Granted(1, 4, True)])
    assert holds(older, 1.0 + LEASE_S / 2)
    # The manager is past the node's epoch: the node may have left a chain and come back in
    # between. The answer extends nothing; the lease held ends on time.
    state, notes = run(
        LeaseState(managed=True, epoch=4),
        [Asked(1.0), Granted(1, 4, True), Asked(1.5), Granted(2, 5, True)],
    )
    assert notes == []
    assert state.until_s == 1.0 + LEASE_S
    assert not holds(state, 1.0 + LEASE_S)
    # Once the node adopts epoch 5, the answer kept counts, and the next one extends it again.
    state, _ = run(state, [EpochAdopted(5)])
    assert state.until_s == 1.5 + LEASE_S
    assert state.early == ()
    state, _ = run(state, [Asked(2.0), Granted(3, 5, True)])
    assert state.until_s == 2.0 + LEASE_S


def test_an_answer_that_beats_its_topology_counts_once_the_node_adopts_it() -> None:
    # The round that logged epoch 6 answers before the node has the epoch-6 topology: kept.
    state, _ = run(
        LeaseState(managed=True, epoch=5),
        [Asked(1.0), Granted(1, 5, True), Asked(1.2), Granted(2, 6, True)],
    )
    assert state.until_s == 1.0 + LEASE_S
    assert state.early == ((6, 1.2 + LEASE_S),)
    # Adopting an epoch below it does not count it; adopting it (or a later one) does.
    state, _ = run(state, [EpochAdopted(5)])
    assert state.until_s == 1.0 + LEASE_S
    adopted, _ = run(state, [EpochAdopted(6)])
    assert adopted.until_s == 1.2 + LEASE_S
    assert holds(adopted, 1.0 + LEASE_S + 0.1)
    later, _ = run(state, [EpochAdopted(8)])
    assert later.until_s == 1.2 + LEASE_S
    # An answer saying the node is in no chain, or a clean stop, drops what was kept.
    removed, _ = run(state, [Asked(1.3), Granted(3, 6, False), EpochAdopted(6)])
    assert removed.until_s is None
    stopping, _ = run(state, [Ended(), EpochAdopted(6)])
    assert not holds(stopping, 1.2)
    # Only the newest few are kept.
    many: list[LeaseEvent] = []
    for i in range(limits.lease_early_grants_max + 2):
        many += [Asked(2.0 + i * 2 * STEP_S), Granted(3 + i, 7 + i, True)]
    crowded, _ = run(state, many)
    assert len(crowded.early) == limits.lease_early_grants_max
    assert crowded.early[0][0] == 9


def test_removed_while_slow_the_lease_ends_at_the_first_answer() -> None:
    # The manager still hears the node but removed it (slow): the committed answer says it is in
    # no chain, at an epoch the node may not have adopted yet (here it has).
    state, notes = run(
        LeaseState(managed=True, epoch=7),
        [Asked(1.0), Granted(1, 7, True), Asked(1.2), Granted(2, 7, False)],
    )
    assert not holds(state, 1.3)
    assert notes == ["lease ended: the manager's view at epoch 7 has this node in no chain"]


def test_unknown_and_forgotten_nonces_change_nothing() -> None:
    state, _ = run(LeaseState(managed=True, epoch=1), [Granted(9, 1, True)])
    assert state.until_s is None
    # Asks close together reuse the newest nonce (an earlier start: never a longer lease).
    state, _ = run(state, [Asked(5.0), Asked(5.0 + STEP_S / 2)])
    assert state.nonce == 1
    assert len(state.asks) == 1
    # The table keeps the newest lease_nonces_max; the oldest nonce is forgotten.
    events: list[LeaseEvent] = [Asked(6.0 + 2 * i * STEP_S) for i in range(limits.lease_nonces_max)]
    state, _ = run(state, events)
    assert len(state.asks) == limits.lease_nonces_max
    state, _ = run(state, [Granted(1, 1, True)])
    assert state.until_s is None


def topology(epoch: int, chain: str, nodes: str = "abcd") -> Topology:
    addrs = {n: NodeAddr(n, "127.0.0.1", 7101 + i, 7201 + i) for i, n in enumerate(nodes)}
    return Topology(epoch, addrs, {0: ShardChain(0, tuple(chain), ())})


def test_only_a_head_that_changed_holds_writes() -> None:
    assert write_holds("b", topology(1, "abc"), topology(2, "bc")) == {0}  # a removed: b leads
    assert write_holds("a", topology(1, "abc"), topology(2, "ab")) == frozenset()  # tail removed
    assert write_holds("a", topology(1, "abc"), topology(2, "ac")) == frozenset()  # middle
    assert write_holds("a", topology(1, "ab"), topology(2, "abc")) == frozenset()  # a rejoin
    assert write_holds("b", topology(1, "abc"), topology(2, "abc")) == frozenset()  # not head
    assert write_holds("c", topology(1, "abc"), topology(2, "c")) == {0}  # the tail is all left
    # Epochs skipped: another head may have come and gone in between (the leader, which saw only
    # the chain before and after, would not know to count it), so the hold stays whole.
    assert write_holds("a", topology(1, "abc"), topology(3, "abd")) == {0}
    assert write_holds("a", topology(1, "abc"), topology(3, "abc")) == {0}
    assert write_holds("b", topology(1, "abc"), topology(3, "abc")) == frozenset()  # not head


def status(nonce: Any) -> dict[str, Any]:
    return {"node": "x", "epoch": 1, "ready": True, "shards": {}, "lease_nonce": nonce}


def test_the_leader_grants_after_the_commit_with_the_views_epoch() -> None:
    config = Config(detection_window_ms=2_000, suspect_after_ms=1_000)
    view = ManagerView.bootstrap(config, list("abc"), [list("abc")])
    answers = {
        "a": Answer(status(4), 100, 5),
        "b": Answer(status("x"), 100, 5),  # malformed: nothing granted
        "c": Answer(None, 100, 5),  # no answer
    }
    assert lease_grants(view, answers) == [("a", {"epoch": 1, "nonce": 4, "member": True})]
    # c silent past the detection window: spliced out (epoch 2). Its answer, if one came, says
    # it is in no chain, with the new epoch.
    after, _ = decide(view, TimerTick(2_500, (("a", 2_500), ("b", 2_500))))
    assert after.epoch == 2
    grants = lease_grants(after, {n: Answer(status(7), 2_500, 5) for n in "abc"})
    assert grants == [
        ("a", {"epoch": 2, "nonce": 7, "member": True}),
        ("b", {"epoch": 2, "nonce": 7, "member": True}),
        ("c", {"epoch": 2, "nonce": 7, "member": False}),
    ]
