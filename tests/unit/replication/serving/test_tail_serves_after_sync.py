"""A member below the head serves consumers only once its first link to its upstream is
subscribed (kayos/replication/shard/replica.py ``upstream_synced``). Before that it cannot know how
far behind it is: a node that just joined a chain as tail (the manager rejoins it within
``manager_catchup_done_lag_seqs`` of the old tail) served a snapshot that started below a mark
the group had had acknowledged (the real-process campaign, seed 2364273308: `hwm`, `order`;
docs/campaigns.md "Findings"). In-process nodes over real stores, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.errors import UnavailableError
from tests.support.links import until
from tests.support.replicas import SEED, chain_node, node_chain

pytestmark = pytest.mark.unit


@pytest.mark.asyncio
async def test_a_restarted_tail_serves_nothing_before_its_upstream_link_is_subscribed(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (topology, nodes):
        queue = "q"
        await nodes["a"].produce(queue, [b"k0"], [b"v"], None, None, acks=-1)
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.durable >= 1 and not tail.catching_up, "the tail level")
        page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=10, wait_ms=0)
        assert page is not None  # a linked tail serves
        await nodes["c"].stop()
        await nodes["b"].stop()
        nodes["c"] = chain_node(topology, "c", tmp_path)
        await nodes["c"].start()
        restarted = nodes["c"].replicas[0]
        assert not restarted.catching_up  # its store says nothing of being behind
        assert not restarted.upstream_synced
        with pytest.raises(UnavailableError):
            await nodes["c"].consume(queue, "g", after=0, upto=None, limit=10, wait_ms=0)
        nodes["b"] = chain_node(topology, "b", tmp_path)
        await nodes["b"].start()
        await until(lambda: restarted.upstream_synced, "the tail linked to b again")
        await until(lambda: not restarted.catching_up, "the tail level again")
        await nodes["c"].consume(queue, "g", after=0, upto=None, limit=10, wait_ms=0)
