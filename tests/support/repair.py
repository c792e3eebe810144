"""A head cut short below its durable mark whose peers' takeover tables, full, name none of its
masters (campaign seed 11112411, docs/campaigns.md): the scenario the repair reset starts from."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

from kayos import limits
from kayos.node.runtime import Node
from kayos.replication import durablemark
from kayos.replication.links import pack_takeover
from kayos.replication.replica import TAKEOVER_META_KEY
from kayos.storage import ShardStore
from kayos.storage.maintenance.check import data_file_of
from kayos.topology import ShardChain, Topology
from tests.support.links import until
from tests.support.nodes import stored_keys

SEED = 20261125
BEFORE = 10  # committed entries the cut head keeps
CUT_AWAY = limits.takeover_table_entries_max + 16  # committed entries cut from the head's file


def repair_node(topology: Topology, node_id: str, base: Path) -> Node:
    """Node ``node_id`` of ``topology`` with its data under ``base`` (not started)."""
    return Node(topology, node_id, str(base / node_id), rng=random.Random(SEED))


def full_table_of_other_masters(first_seq: int) -> list[tuple[bytes, int]]:
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
    nodes = {n: repair_node(chain3, n, base) for n in "abc"}
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
        kept = stored_keys(tail)
        peer_paths = {n: nodes[n].replicas[0].store_path for n in "bc"}
    finally:
        for node in nodes.values():
            await node.stop()

    os.truncate(data_file_of(head_path), size_before)
    durablemark.write(head_path, total)
    for path in peer_paths.values():
        _set_table(path, full_table_of_other_masters(BEFORE + 1))
    return total, kept


async def started(topology: Topology, base: Path) -> dict[str, Node]:
    """Nodes a, b and c at ``topology``, started."""
    nodes = {n: repair_node(topology, n, base) for n in "abc"}
    for node in nodes.values():
        await node.start()
    return nodes


def repaired(nodes: dict[str, Node], total: int) -> Callable[[], bool]:
    """Whether a's replica leads again, holding ``total``."""

    def check() -> bool:
        replica = nodes["a"].replicas.get(0)
        return replica is not None and not replica.repairing and replica.durable >= total

    return check
