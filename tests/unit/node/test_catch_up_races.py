"""A catch-up order racing another one, or a topology change, never opens a second store on a
shard directory the node already has open (campaign seed 12, docs/campaigns.md "Findings": the
second open's salvage check met the first one's derived index, "already open in this process",
and deleted the directory under it; the next topology change then failed half-way and the node
held no replica at all)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kayos.clock import SystemClock
from kayos.node.replicas import learners
from kayos.node.replicas.learners import CatchUpOrder
from kayos.storage import ShardStore
from kayos.topology import NodeAddr, ShardChain, Topology
from tests.support.links import TEST_IDENTITY

pytestmark = pytest.mark.unit


def _node(tmp_path: Path) -> Any:
    nodes = {n: NodeAddr(n, "127.0.0.1", 1, 1) for n in "abcd"}  # port 1: links fail at once
    topology = Topology(4, nodes, {0: ShardChain(0, ("a", "b", "c"), ())}, TEST_IDENTITY)
    path = tmp_path / "shards" / "0"
    path.mkdir(parents=True)
    store = ShardStore.open(str(path))
    store.commit([], meta={"held": "something"})  # not empty: learnt entry by entry
    store.close()
    return SimpleNamespace(
        node_id="d",
        epoch=4,
        topology=topology,
        replicas={},
        learners={},
        data_dir=str(tmp_path),
        clock=SystemClock(),
        rng=random.Random(1),
        copy_rate_mb_per_s_max=0.0,
        reconfigure=SimpleNamespace(lock=asyncio.Lock(), changing=set()),
    )


def test_two_catch_up_orders_at_once_open_the_store_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = _node(tmp_path)
        order = CatchUpOrder(4, 0, "c")
        answers = await asyncio.gather(
            learners.start_catch_up(node, order), learners.start_catch_up(node, order)
        )
        assert answers == [{"shard": 0, "state": "learning"}] * 2
        assert list(node.learners) == [0]
        derived = tmp_path / "shards" / "0" / "derived"
        assert derived.is_dir(), "the learner's derived index was deleted under it"
        await learners.close_learner(node, 0)  # closes cleanly: its derived state is written

    asyncio.run(scenario())


def test_a_catch_up_order_waits_for_a_topology_change_in_progress(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = _node(tmp_path)
        async with node.reconfigure.lock:  # a topology change closing the shard's replica
            started = asyncio.create_task(learners.start_catch_up(node, CatchUpOrder(4, 0, "c")))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not started.done()
            assert node.learners == {}
        assert await started == {"shard": 0, "state": "learning"}
        await learners.close_learner(node, 0)

    asyncio.run(scenario())
