"""The repair reset (campaign seed 11112411, docs/campaigns.md): a head below its durable mark whose
peer's full takeover table names none of its masters resets its store and re-copies everything.
The reset keeps what the head's store vouched for, on a real ``ShardReplica`` over a real store
in a temporary directory:

- the durable mark: a crash inside the reset leaves a store that opens below its mark and
  repairs, never an empty one that verifies and leads with an empty log;
- the store's local metadata: the ``alone`` key of a chain of one (its acknowledged seqs past its
  last mark write survive a crash and a re-make only by it) and the record of the learners it
  counts (a restart keeps counting them only by it).

A lone head left with only learners (the campaign's shape) resets from a learner and leads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.node.replicas import learners
from kayos.node.replicas import repair as peer_repair
from kayos.replication.logic import durablemark, followers
from kayos.replication.shard import catchup
from kayos.replication.shard.local_meta import TAKEOVER_META_KEY, pack_takeover
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from kayos.topology import ShardChain, Topology
from tests.support.links import TEST_IDENTITY, one_shard_topology, until
from tests.support.replicas import (
    cut_head_behind_capped_peers,
    full_table_of_other_masters,
    repaired,
    standalone_replica,
    started,
    stored_keys,
)

pytestmark = pytest.mark.unit

SEED = 20261125
HELD = 10  # entries the cut head's store still holds
MARK = 200  # its durable mark: what it held committed before the cut
PEER_LAST = 500  # what the peer holds
OWN_MASTER = (bytes([1]) + bytes(15), 1)


def _lone_head_topology(learner: str | None = None) -> Topology:
    """Shard 0 is a chain of ``h`` alone; ``learner`` (if any) is a node outside it."""
    ids = ["h"] + ([learner] if learner else [])
    nodes = one_shard_topology(ids).nodes
    return Topology(1, nodes, {0: ShardChain(0, ("h",), ())}, TEST_IDENTITY)


def _cut_store(path: Path, meta: dict[str, object] | None = None) -> None:
    """A store holding ``HELD`` entries under one master, its mark at ``MARK`` (cut short)."""
    path.mkdir(parents=True, exist_ok=True)
    store = ShardStore.open(str(path))
    try:
        keys = [f"k{i}".encode() for i in range(HELD)]
        store.commit_columns(
            keys,
            [b"v"] * HELD,
            meta={TAKEOVER_META_KEY: pack_takeover([OWN_MASTER]), **(meta or {})},
        )
    finally:
        store.close()
    durablemark.write(str(path), MARK)


def _capped_verdict() -> fr.Subscribed:
    """A peer's verdict 0 that the table cap explains: its full table's masters all began after
    the head's last one, and it holds more than the head."""
    table = tuple(full_table_of_other_masters(HELD + 1))
    return fr.Subscribed(0, 0, table, PEER_LAST)


class SimulatedCrash(Exception):
    """The process dies here (power lost): nothing after this line runs."""


@pytest.mark.asyncio
async def test_a_crash_inside_the_repair_reset_keeps_the_durable_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reset empties the store; a crash before the copy is done must leave a store that
    still opens below its mark (and repairs), never one that looks whole and leads empty."""
    print("seed", SEED)
    topology = _lone_head_topology()
    path = tmp_path / "h" / "shards" / "0"
    _cut_store(path)
    replica = standalone_replica(topology, path)
    assert peer_repair.below_mark(replica)

    def crash(directory: str, seq: int) -> None:
        raise SimulatedCrash(f"power lost writing the mark {seq} in {directory}")

    monkeypatch.setattr(catchup.durablemark, "write", crash)
    try:
        await replica.reset_to_repair(_capped_verdict())
    except SimulatedCrash:
        pass  # the process died in the reset: what is on disk is what the restart finds
    monkeypatch.undo()
    replica.store.close()

    restarted = standalone_replica(topology, path)
    try:
        assert durablemark.read(str(path)) == MARK, "the reset deleted the durable mark"
        assert restarted.repairing
        assert peer_repair.below_mark(restarted), (
            "a head whose store the reset emptied opened as whole: it would lead with nothing"
        )
    finally:
        restarted.close()


@pytest.mark.asyncio
async def test_the_repair_reset_keeps_a_lone_heads_alone_key(tmp_path: Path) -> None:
    """A chain of one keeps the local key ``alone`` while it runs so (set before it takes a
    write, docs/replication-protocol.md): the reset must not leave it leading without it."""
    print("seed", SEED)
    topology = _lone_head_topology()
    path = tmp_path / "h" / "shards" / "0"
    _cut_store(path)
    replica = standalone_replica(topology, path)
    try:
        assert replica.store.meta.get(durablemark.ALONE_META_KEY) is not None
        assert await replica.reset_to_repair(_capped_verdict())
        assert replica.store.last_seq == 0
        assert replica.marked_committed == MARK
        assert replica.store.meta.get(durablemark.ALONE_META_KEY) is not None, (
            "the reset dropped the alone key of a chain of one"
        )
    finally:
        replica.close()


@pytest.mark.asyncio
async def test_the_repair_reset_keeps_the_record_of_counted_learners(tmp_path: Path) -> None:
    """A lone head counting a learner records it in its store (a restart goes on counting it):
    the reset must not drop the record while it still counts the learner."""
    print("seed", SEED)
    topology = _lone_head_topology(learner="l")
    path = tmp_path / "h" / "shards" / "0"
    recorded = followers.record("h", ("l",))
    _cut_store(path, meta={followers.FOLLOWERS_META_KEY: recorded})
    replica = standalone_replica(topology, path)
    try:
        assert replica.counted_followers == ("l",)
        assert await replica.reset_to_repair(_capped_verdict())
        assert replica.counted_followers == ("l",)
        assert replica.store.meta.get(followers.FOLLOWERS_META_KEY) == recorded, (
            "the reset dropped the record of the learner the head still counts"
        )
        assert replica.store.meta.get(durablemark.ALONE_META_KEY) is None
    finally:
        replica.close()
    restarted = standalone_replica(topology, path)
    try:
        assert restarted.counted_followers == ("l",)
    finally:
        restarted.close()


@pytest.mark.asyncio
async def test_a_lone_head_below_its_mark_repairs_from_a_learner_and_leads_alone(
    tmp_path: Path,
) -> None:
    """The campaign's shape: the cut head was left alone in its chain, the nodes that held the
    data only its learners (their tables full of masters it never knew). It resets from a
    learner, leads with every acknowledged entry, and the learner follows it (counted, and
    recorded as counted) afterwards."""
    print("seed", SEED)
    chain3 = one_shard_topology(["a", "b", "c"])
    total, kept = await cut_head_behind_capped_peers(chain3, tmp_path)

    alone = Topology(1, chain3.nodes, {0: ShardChain(0, ("a",), ())}, TEST_IDENTITY)
    nodes = await started(alone, tmp_path)
    try:
        head = nodes["a"].replicas[0]
        assert head.repairing
        assert head.store.last_seq < total
        await learners.start_catch_up(nodes["b"], learners.CatchUpOrder(1, 0, "a"))

        await until(repaired(nodes, total), "the lone head re-copying from a learner and leading")
        head = nodes["a"].replicas[0]
        assert stored_keys(head) == kept
        assert head.marked_committed >= total
        await nodes["a"].produce("q", [b"new"], [b"v"], None, None, acks=-1)
        learner = nodes["b"].learners[0].replica
        assert learner is not None
        await until(
            lambda: stored_keys(learner) == {*kept, b"q\x00new"}, "the learner following it"
        )
        await until(lambda: head.counted_followers == ("b",), "the head counting the learner")
        assert head.store.meta.get(followers.FOLLOWERS_META_KEY) == followers.record("a", ("b",))
        assert durablemark.ALONE_META_KEY not in head.store.meta
        page = await nodes["a"].consume("q", "g", after=None, upto=None, limit=1000, wait_ms=0)
        assert len(page.seqs) == len(kept) + 1
    finally:
        for node in nodes.values():
            await node.stop()
