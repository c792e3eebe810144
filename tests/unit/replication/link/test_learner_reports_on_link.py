"""A learner reports what it holds as soon as it links, so its tail counts it in its commit even
when there is nothing to copy (docs/replication-protocol.md, "Counting a catch-up follower"). A
learner of an empty shard copied nothing, so it sent no ACK, and with nothing committed it sent
no COMMITTED either: the tail never counted it, the manager never took it for caught up, and
``kayos ctl move-shard`` on an idle cluster waited for ever (tests/integration/manager/test_grow.py,
``test_move_shard_and_drain_through_the_cli``). In-process nodes on loopback; every wait is a
bounded poll of a condition."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kayos.local.ports import free_ports
from kayos.node.replicas import learners
from kayos.node.replicas.learners import CatchUpOrder
from kayos.node.runtime import Node
from kayos.topology import NodeAddr, ShardChain, Topology
from tests.support.links import TEST_IDENTITY, until

pytestmark = pytest.mark.unit

SEED = 20261124


def _topology() -> Topology:
    """Shard 0's chain is a -> b; d is in the topology and holds no replica of it."""
    ids = ["a", "b", "d"]
    ports = free_ports(2 * len(ids))
    nodes = {n: NodeAddr(n, "127.0.0.1", ports[i], ports[len(ids) + i]) for i, n in enumerate(ids)}
    return Topology(1, nodes, {0: ShardChain(0, ("a", "b"), ())}, TEST_IDENTITY)


def _learned(node: Node) -> int | None:
    """The learner's durable seq, once its store is open."""
    learner = node.learners.get(0)
    return None if learner is None or learner.replica is None else learner.replica.durable


@pytest.mark.asyncio
@pytest.mark.parametrize("entries", [0, 3])
async def test_the_tail_counts_a_learner_that_copies_nothing(tmp_path: Path, entries: int) -> None:
    print("seed", SEED)
    topology = _topology()
    nodes = {n: Node(topology, n, str(tmp_path / n), rng=random.Random(SEED)) for n in "abd"}
    for node in nodes.values():
        await node.start()
    try:
        tail = nodes["b"].replicas[0]
        for i in range(entries):
            await nodes["a"].produce("q", [b"k%d" % i], [b"v"], None, None, acks=-1)
        await until(lambda: tail.commit_point == entries, "the tail's commit point")
        answer = await learners.start_catch_up(nodes["d"], CatchUpOrder(1, 0, "b"))
        assert answer == {"shard": 0, "state": "learning"}
        await until(lambda: _learned(nodes["d"]) == entries, "d holds the shard")
        await until(
            lambda: tail.counted_followers == ("d",), "b counts d in its commit", timeout_s=10
        )
        # Counted, d holds the commit back: a write commits once d holds it too.
        await nodes["a"].produce("q", [b"k"], [b"v"], None, None, acks=-1)
        assert _learned(nodes["d"]) == entries + 1
    finally:
        for node in nodes.values():
            await node.stop()
