"""Topology changes on in-process nodes over loopback (kayos/node/replicas/reconfigure.py driven
through ``Node.reconfigure``): the pieces the real-process tests cannot pin down in time, namely two
topologies racing and producers waiting at a replica that is re-made. Every wait is a bounded
poll; the seed is printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kayos.errors import UnavailableError
from kayos.node.replicas.reconfigure import TOPOLOGY_FILE
from kayos.node.runtime import Node
from kayos.replication.shard import replica as replica_module
from kayos.signing import sign
from kayos.storage.maintenance.salvage import SalvageReport, salvage
from kayos.topology import ShardChain, Topology
from tests.support.links import one_shard_topology, until

pytestmark = pytest.mark.unit

SEED = 20261124


def signed(topology: Topology) -> dict[str, Any]:
    assert topology.identity is not None
    body = topology.to_json()
    return {"body": body, "mac": sign(topology.identity, "topology", body)}


def chained(topology: Topology, epoch: int, chain: tuple[str, ...]) -> Topology:
    return Topology(epoch, topology.nodes, {0: ShardChain(0, chain)}, topology.identity)


@contextlib.asynccontextmanager
async def _chain(base: Path) -> AsyncIterator[tuple[Topology, dict[str, Node]]]:
    topology = one_shard_topology(["a", "b", "c"])
    nodes = {n: Node(topology, n, str(base / n), rng=random.Random(SEED)) for n in ("a", "b", "c")}
    for node in nodes.values():
        await node.start()
    try:
        yield topology, nodes
    finally:
        for node in nodes.values():
            await node.stop()


@pytest.mark.asyncio
async def test_racing_topologies_are_applied_in_turn_and_never_backwards(tmp_path: Path) -> None:
    print("seed", SEED)
    async with _chain(tmp_path) as (topology, nodes):
        a = nodes["a"]
        two = signed(chained(topology, 2, ("a", "c", "b")))
        three = signed(chained(topology, 3, ("a", "b", "c")))
        # Epoch 3 is offered first: epoch 2, arriving at the same time, finds it applied.
        results = await asyncio.gather(a.reconfigure.offer(three), a.reconfigure.offer(two))
        assert results == [(3, True), (3, False)]
        assert a.epoch == 3
        saved = json.loads((tmp_path / "a" / TOPOLOGY_FILE).read_text())
        assert saved == three
        # In the other order both are applied, one after the other.
        four = signed(chained(topology, 4, ("a", "c")))
        five = signed(chained(topology, 5, ("a", "b", "c")))
        results = await asyncio.gather(a.reconfigure.offer(four), a.reconfigure.offer(five))
        assert results == [(4, True), (5, True)]
        assert a.epoch == 5
        assert a.replicas[0].downstreams == ("b",)


@pytest.mark.asyncio
async def test_producers_waiting_at_a_remade_head_get_unavailable(tmp_path: Path) -> None:
    print("seed", SEED)
    async with _chain(tmp_path) as (topology, nodes):
        queue = "q"
        await nodes["a"].produce(queue, [b"k0"], [b"v"], None, None, acks=-1)
        await nodes["b"].stop()  # the middle is gone: acks=all waits at the head
        waiting = asyncio.create_task(
            nodes["a"].produce(queue, [b"k1"], [b"v"], None, None, acks=-1)
        )
        head = nodes["a"].replicas[0]
        await until(lambda: head.durable >= 2, "the batch durable at the head")
        assert not waiting.done()
        spliced = signed(chained(topology, 2, ("a", "c")))
        for name in ("a", "c"):
            assert await nodes[name].reconfigure.offer(spliced) == (2, True)
        with pytest.raises(UnavailableError, match="retry at the shard's head"):
            await asyncio.wait_for(waiting, 30)
        # The retry at the re-made head commits through the spliced chain.
        _, last = await nodes["a"].produce(queue, [b"k1"], [b"v"], None, None, acks=-1)
        assert nodes["a"].replicas[0] is not head
        assert nodes["a"].replicas[0].downstreams == ("c",)
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.commit_point >= last, "the tail at the retried batch")
        assert nodes["c"].status()["shards"]["0"]["upstream"] == "a"


@pytest.mark.asyncio
async def test_a_remade_replica_is_walked_again_only_if_it_saw_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A splice remakes the survivors' replicas while the chain waits: one this process had open
    undamaged reopens without the salvage walk; one that saw damage is walked again."""
    print("seed", SEED)
    walked: list[str] = []

    def counting_salvage(path: str) -> SalvageReport | None:
        walked.append(Path(path).parent.parent.name)  # <data dir>/shards/<id>: the node
        return salvage(path)

    monkeypatch.setattr(replica_module, "salvage", counting_salvage)
    async with _chain(tmp_path) as (topology, nodes):
        assert sorted(walked) == ["a", "b", "c"]  # a start walks every store
        await nodes["a"].produce("q", [b"k0"], [b"v"], None, None, acks=-1)
        nodes["c"].replicas[0].damage_seen = "a read failed its check (set by the test)"
        await nodes["b"].stop()
        walked.clear()
        spliced = signed(chained(topology, 2, ("a", "c")))
        for name in ("a", "c"):
            assert await nodes[name].reconfigure.offer(spliced) == (2, True)
        assert walked == ["c"]
        _, last = await nodes["a"].produce("q", [b"k1"], [b"v"], None, None, acks=-1)
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.commit_point >= last, "the tail at the new batch")
