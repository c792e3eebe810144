"""In-process nodes on loopback (free ports) for the unit tier: chains of ``Node``s over real
stores, a lone ``ShardReplica``, the manager's lease granted by hand, and what a store holds."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kayos.clock import SystemClock
from kayos.node.runtime import Node
from kayos.replication.replica import ShardReplica
from kayos.topology import Topology
from tests.support.links import one_shard_topology

SEED = 20261122  # the nodes' randomness; tests print it
WAIT_S = 30.0
# The randomness of ``standalone_replica``, node h's replica outside any node.
STANDALONE_SEED = 20261124


def chain_node(topology: Topology, node_id: str, base: Path, *, managed: bool = False) -> Node:
    """Node ``node_id`` of ``topology`` with its data under ``base`` (not started)."""
    return Node(topology, node_id, str(base / node_id), rng=random.Random(SEED), managed=managed)


@contextlib.asynccontextmanager
async def node_chain(
    base: Path, ids: str = "abc", *, managed: bool = False
) -> AsyncIterator[tuple[Topology, dict[str, Node]]]:
    """Nodes a -> b -> c of one shard (or ``ids``; ``managed``: their heads need a lease from the
    manager); ``nodes`` may be changed (a node restarted) inside."""
    topology = one_shard_topology(list(ids))
    nodes = {n: chain_node(topology, n, base, managed=managed) for n in ids}
    for node in nodes.values():
        await node.start()
    try:
        yield topology, nodes
    finally:
        for node in nodes.values():
            await node.stop()


def stored_keys(replica: ShardReplica) -> set[bytes]:
    """Every live key the replica's store holds, expired ones included."""
    with replica.store.snapshot() as snap:
        return {
            e.key
            for page in snap.pages(0, snap.boundary, include_expired=True, as_of=snap.boundary)
            for e in page
            if not e.deleted
        }


def standalone_replica(topology: Topology, store_path: Path) -> ShardReplica:
    """Node h's replica of shard 0 over the store at ``store_path``, with no ``Node`` around it."""
    return ShardReplica(
        node_id="h",
        topology=topology,
        shard=topology.shards[0],
        store_path=str(store_path),
        clock=SystemClock(),
        rng=random.Random(STANDALONE_SEED),
    )


QUEUE = "q"  # the queue of ``snapshot``


def managed_chain(base: Path, ids: str) -> Any:
    """``node_chain`` of managed nodes: each head needs the manager's lease (``grant``)."""
    return node_chain(base, ids, managed=True)


def grant(node: Node) -> None:
    """The leader's committed answer to a poll, as ``POST /v1/admin/lease`` applies it."""
    assert node.lease.granted(node.lease.ask(), node.epoch, True)


async def snapshot(node: Node) -> list[int]:
    """The seqs of a new snapshot of ``QUEUE`` for group g at ``node``."""
    page = await node.consume(QUEUE, "g", after=None, upto=None, limit=10, wait_ms=0)
    return [int(seq) for seq in page.seqs]
