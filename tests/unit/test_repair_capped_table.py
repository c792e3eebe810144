"""A head repairing below its durable mark whose peers' takeover tables, full, no longer name any
master its store knows (campaign seed 11112411, docs/campaigns.md): the peers answered its repair
with the divergence verdict 0, which the repair link read as "holds no more than this replica", so
the head asked for ever while the peers held every acknowledged entry (shard 1 unavailable 130 s
and never converged). A verdict the table cap explains is a reset: the head drops its store,
keeps its mark, re-copies everything from the peer and leads. And while it repairs, nothing is
read from it: a head alone is its shard's tail too, and it served a snapshot from its older
marks (the group's mark moved back by 31,000 seqs).

In-process nodes on loopback (``Node``), driven as tests/unit/test_replica_review.py does; every
wait is a bounded poll of a condition."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from kayos import limits
from kayos.errors import UnavailableError
from kayos.node.runtime import Node
from kayos.replication.logic import durablemark
from kayos.replication.shard.local_meta import TAKEOVER_META_KEY, pack_takeover
from kayos.storage import ShardStore
from kayos.storage.maintenance.check import data_file_of
from kayos.topology import ShardChain, Topology
from tests.linkauth import one_shard_topology, until
from tests.unit.test_replica_review import _stored_keys

SEED = 20261125
BEFORE = 10  # committed entries the cut head keeps
CUT_AWAY = limits.takeover_table_entries_max + 16  # committed entries cut from the head's file


def _node(topology: Topology, node_id: str, base: Path) -> Node:
    return Node(topology, node_id, str(base / node_id), rng=random.Random(SEED))


def _full_table_of_other_masters(first_seq: int) -> list[tuple[bytes, int]]:
    """A full table whose masters all began after ``first_seq - 1``: what a peer holds after
    more changes of head than the table keeps, since the cut head's last master."""
    cap = limits.takeover_table_entries_max
    return [(bytes([7, i]) + bytes(14), first_seq + i) for i in range(cap)]


def _size(path: str) -> int:
    return os.path.getsize(path)


def _set_table(path: str, table: list[tuple[bytes, int]]) -> None:
    store = ShardStore.open(path)
    try:
        store.commit([], meta={TAKEOVER_META_KEY: pack_takeover(table)})
    finally:
        store.close()


async def cut_head_behind_capped_peers(topology: Topology, base: Path) -> tuple[int, set[bytes]]:
    """Nodes a -> b -> c (``topology``'s nodes) take ``BEFORE`` entries, then ``CUT_AWAY`` more,
    and stop; a's file is cut back to the first part, its mark still naming all of it, and b's
    and c's tables go through more changes of head than a table keeps since. Returns the last
    seq and the keys the tail held."""
    chain3 = Topology(
        topology.epoch, topology.nodes, {0: ShardChain(0, ("a", "b", "c"), ())}, topology.identity
    )
    nodes = {n: _node(chain3, n, base) for n in "abc"}
    for node in nodes.values():
        await node.start()
    try:
        queue = "q"
        for i in range(BEFORE):
            await nodes["a"].produce(queue, [f"k{i}".encode()], [b"v"], None, None, acks=-1)
        head = nodes["a"].replicas[0]
        head_path = head.store_path
        size_before = _size(data_file_of(head_path))
        for i in range(BEFORE, BEFORE + CUT_AWAY):
            await nodes["a"].produce(queue, [f"k{i}".encode()], [b"v"], None, None, acks=-1)
        total = head.store.last_seq
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.commit_point >= total, "the tail knowing every seq committed")
        kept = _stored_keys(tail)
        peer_paths = {n: nodes[n].replicas[0].store_path for n in "bc"}
    finally:
        for node in nodes.values():
            await node.stop()

    os.truncate(data_file_of(head_path), size_before)
    durablemark.write(head_path, total)
    for path in peer_paths.values():
        _set_table(path, _full_table_of_other_masters(BEFORE + 1))
    return total, kept


async def started(topology: Topology, base: Path) -> dict[str, Node]:
    """Nodes a, b and c at ``topology``, started."""
    nodes = {n: _node(topology, n, base) for n in "abc"}
    for node in nodes.values():
        await node.start()
    return nodes


def repaired(nodes: dict[str, Node], total: int) -> Callable[[], bool]:
    """Whether a's replica leads again, holding ``total``."""

    def check() -> bool:
        replica = nodes["a"].replicas.get(0)
        return replica is not None and not replica.repairing and replica.durable >= total

    return check


@pytest.mark.asyncio
async def test_a_head_below_its_mark_resets_from_a_peer_whose_full_table_names_none_of_its_masters(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    topology = one_shard_topology(["a", "b", "c"])
    queue = "q"
    total, kept = await cut_head_behind_capped_peers(topology, tmp_path)

    nodes = await started(topology, tmp_path)
    try:
        head = nodes["a"].replicas[0]
        assert head.repairing
        assert head.store.last_seq < total
        await until(
            repaired(nodes, total), "the head re-copying what it lost from a peer and leading"
        )
        head = nodes["a"].replicas[0]
        assert _stored_keys(head) == kept
        assert head.marked_committed >= total, "the reset lowered the head's durable mark"
        await nodes["a"].produce(queue, [b"new"], [b"v"], None, None, acks=-1)
        tail = nodes["c"].replicas[0]
        await until(
            lambda: _stored_keys(tail) == {*kept, b"q\x00new"}, "the tail holding every entry"
        )
    finally:
        for node in nodes.values():
            await node.stop()


@pytest.mark.asyncio
async def test_a_head_alone_serves_no_read_while_it_repairs(tmp_path: Path) -> None:
    """A head alone is its shard's tail: while its store repairs, a snapshot, a group's lag and
    a retention policy read from it are refused (``unavailable``), not served from older marks."""
    print("seed", SEED)
    topology = one_shard_topology(["a"])
    node = _node(topology, "a", tmp_path)
    await node.start()
    try:
        await node.produce("q", [b"k"], [b"v"], None, None, acks=-1)
        await node.commit_group("q", "g", 1, None)
        page = await node.consume("q", "g", after=None, upto=None, limit=10, wait_ms=0)
        assert page.hwm == 1
        node.replicas[0].repairing = True
        with pytest.raises(UnavailableError, match="repairing"):
            await node.consume("q", "g", after=None, upto=None, limit=10, wait_ms=0)
        with pytest.raises(UnavailableError, match="repairing"):
            await node.group_info("q", "g")
        with pytest.raises(UnavailableError, match="repairing"):
            node.retention.get_policy("q")
        node.replicas[0].repairing = False
        assert (await node.group_info("q", "g"))["hwm"] == 1
    finally:
        await node.stop()
