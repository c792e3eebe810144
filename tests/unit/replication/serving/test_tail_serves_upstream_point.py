"""A tail serves consumer snapshots only once it holds the commit point its upstream sent
(simulator seed 16: a rejoined tail served an older group mark). In-process nodes a -> b -> c on
loopback; every wait is a bounded poll of a condition."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from kayos.errors import UnavailableError
from kayos.node.runtime import HWM_META, Node
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.logic import chain
from tests.support.links import one_shard_topology, until

pytestmark = pytest.mark.unit

SEED = 20261124


@pytest.mark.asyncio
async def test_a_tail_behind_its_upstreams_commit_point_serves_no_snapshot(
    tmp_path: Path,
) -> None:
    """The tail's upstream link drops; the shard commits a new group mark the tail lacks, and
    the tail is told that commit point (as a tail that rejoins, a catch-up lag behind, is told by
    its new upstream). Serving now would show the group its older mark (hwm 1 instead of 3) and
    deliver what it already committed: it answers unavailable until it holds the point."""
    print("seed", SEED)
    topology = one_shard_topology(["a", "b", "c"])
    nodes = {n: Node(topology, n, str(tmp_path / n), rng=random.Random(SEED)) for n in "abc"}
    for node in nodes.values():
        await node.start()
    try:
        tail = nodes["c"].replicas[0]
        queue, key = "q", f"{HWM_META}q/g"
        await nodes["a"].produce(queue, [b"k1"], [b"v1"], None, None, acks=-1)
        await nodes["a"].commit_group(queue, "g", 1, None)
        await until(lambda: tail.store.meta.get(key) == 1, "the first mark on the tail")
        old_link = next(link for link in nodes["c"].links if link.replica is tail)
        old_link.stop()
        assert tail.upstream_stream is not None
        tail.upstream_stream.close()
        await until(lambda: tail.upstream_stream is None, "the tail's link down")
        held = tail.durable
        # What an upstream tells a tail that rejoined behind it: the shard committed past it.
        tail.downstream_event(chain.UpstreamCommitPoint(held + 2))
        with pytest.raises(UnavailableError, match="does not hold the commit point"):
            await nodes["c"].consume(queue, "g", after=None, upto=None, limit=10, wait_ms=0)
        # Linked again, it copies what it lacked (a new mark included) and serves from it.
        await nodes["a"].produce(queue, [b"k2"], [b"v2"], None, None, acks=1)
        mark = asyncio.create_task(nodes["a"].commit_group(queue, "g", held + 1, None))
        await until(lambda: nodes["a"].replicas[0].durable >= held + 2, "the mark on the head")
        link = UpstreamLink(tail)
        nodes["c"].links.append(link)
        nodes["c"].spawn(link.run())
        await asyncio.wait_for(mark, 30)
        await until(lambda: tail.durable >= held + 2, "the tail caught up")
        page = await nodes["c"].consume(queue, "g", after=None, upto=None, limit=10, wait_ms=0)
        assert page.hwm == held + 1
    finally:
        for node in nodes.values():
            await node.stop()
