"""GET /v1/topology?after=E&wait_ms=W (docs/node-api.md, "Topology changes"): the node's waiters
(``TopologyWatch``) on their own, then the route of an in-process node over loopback: it answers
when the node adopts a newer topology, refuses bad parameters with a clear 400, bounds its
waiters, and answers them all when the node stops. Every wait is bounded; the seed is printed."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kayos import limits
from kayos.errors import UnavailableError
from kayos.node.http.app import make_app
from kayos.node.replicas.reconfigure import TopologyWatch
from kayos.node.runtime import Node
from kayos.signing import sign
from kayos.topology import ShardChain, Topology
from tests.support.links import one_shard_topology, until

pytestmark = pytest.mark.unit

SEED = 20240624
# Bound on every wait here: only a failure reaches it.
WAIT_S = 10.0

# --- the waiters ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_waiter_answers_when_a_newer_topology_is_adopted() -> None:
    watch = TopologyWatch()
    epoch = [1]
    waiter = asyncio.create_task(watch.wait_past(lambda: epoch[0], 1, WAIT_S))
    await until(lambda: watch.waiting == 1, "the request waiting")
    watch.adopted()  # an adoption at the same epoch (a start) wakes it, and it waits on
    await asyncio.sleep(0)
    assert not waiter.done()
    epoch[0] = 2
    watch.adopted()
    await asyncio.wait_for(waiter, WAIT_S)
    assert watch.waiting == 0


@pytest.mark.asyncio
async def test_a_waiter_answers_at_once_when_the_node_is_already_past_the_epoch() -> None:
    watch = TopologyWatch()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(watch.wait_past(lambda: 3, 2, WAIT_S), WAIT_S)
    await asyncio.wait_for(watch.wait_past(lambda: 3, 3, 0.0), WAIT_S)  # no wait asked
    assert loop.time() - started < WAIT_S / 2
    assert watch.waiting == 0


@pytest.mark.asyncio
async def test_a_waiter_gives_up_after_its_wait() -> None:
    watch = TopologyWatch()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(watch.wait_past(lambda: 1, 1, 0.05), WAIT_S)
    assert loop.time() - started >= 0.05
    assert watch.waiting == 0


@pytest.mark.asyncio
async def test_waiters_past_the_bound_are_refused_at_once() -> None:
    watch = TopologyWatch(waiters_max=2)
    waiters = [asyncio.create_task(watch.wait_past(lambda: 1, 1, WAIT_S)) for _ in range(2)]
    await until(lambda: watch.waiting == 2, "two requests waiting")
    with pytest.raises(UnavailableError, match="2 topology watchers wait here already"):
        await watch.wait_past(lambda: 1, 1, WAIT_S)
    watch.close()  # the node stops: both answer now
    await asyncio.wait_for(asyncio.gather(*waiters), WAIT_S)
    await asyncio.wait_for(watch.wait_past(lambda: 1, 1, WAIT_S), WAIT_S)  # and no one waits
    assert watch.waiting == 0


# --- the route -----------------------------------------------------------------------------------


def signed(topology: Topology) -> dict[str, Any]:
    assert topology.identity is not None
    body = topology.to_json()
    return {"body": body, "mac": sign(topology.identity, "topology", body)}


@contextlib.asynccontextmanager
async def served_node(base: Path) -> AsyncIterator[tuple[Topology, Node, str, web.AppRunner]]:
    """Node ``a``, the only member of shard 0, with its HTTP face on loopback."""
    print("seed", SEED)
    topology = one_shard_topology(["a"])
    node = Node(topology, "a", str(base / "a"), rng=random.Random(SEED))
    await node.start()
    runner = web.AppRunner(make_app(node), shutdown_timeout=WAIT_S)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield topology, node, url, runner
    finally:
        await runner.cleanup()
        await node.stop()


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=WAIT_S)) as response:
        return response.status, await response.json()


@pytest.mark.asyncio
async def test_the_long_poll_answers_the_topology_the_node_adopts(tmp_path: Path) -> None:
    async with served_node(tmp_path) as (topology, node, url, _), aiohttp.ClientSession() as s:
        status, body = await get(s, f"{url}/v1/topology?after=0&wait_ms=30000")
        assert (status, body["epoch"]) == (200, 1), "newer than 0 already: at once"
        waiting = asyncio.create_task(get(s, f"{url}/v1/topology?after=1&wait_ms=30000"))
        await until(lambda: node.reconfigure.watch.waiting == 1, "the watcher waiting")
        newer = Topology(2, topology.nodes, {0: ShardChain(0, ("a",))}, topology.identity)
        assert await node.reconfigure.offer(signed(newer)) == (2, True)
        status, body = await asyncio.wait_for(waiting, WAIT_S)
        assert (status, body["epoch"]) == (200, 2)
        assert body["mac"] == signed(newer)["mac"]
        status, body = await get(s, f"{url}/v1/topology?after=2&wait_ms=50")
        assert (status, body["epoch"]) == (200, 2), "nothing newer within the wait: the current"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("after=1&wait_ms=30001", "wait_ms must be in [0, 30000], not 30001"),
        ("after=1&wait_ms=-5", "wait_ms must be an integer"),
        ("after=one&wait_ms=10", "after must be an integer"),
        ("after=18446744073709551616", "after must be"),
        ("wait_ms=10", "wait_ms needs after=<epoch>"),
    ],
)
@pytest.mark.asyncio
async def test_bad_watch_parameters_are_refused_clearly(
    tmp_path: Path, query: str, message: str
) -> None:
    assert limits.topology_watch_wait_ms_max == 30_000
    async with served_node(tmp_path) as (_, node, url, _), aiohttp.ClientSession() as s:
        status, body = await get(s, f"{url}/v1/topology?{query}")
        assert status == 400
        assert body["error"]["code"] == "invalid_request"
        assert message in body["error"]["message"], body
        assert node.reconfigure.watch.waiting == 0


@pytest.mark.asyncio
async def test_watchers_past_the_bound_get_503_and_a_stopping_node_answers_the_others(
    tmp_path: Path,
) -> None:
    async with served_node(tmp_path) as (_, node, url, runner), aiohttp.ClientSession() as s:
        node.reconfigure.watch.waiters_max = 2
        watch_url = f"{url}/v1/topology?after=1&wait_ms=30000"
        waiting = [asyncio.create_task(get(s, watch_url)) for _ in range(2)]
        await until(lambda: node.reconfigure.watch.waiting == 2, "two watchers waiting")
        status, body = await get(s, watch_url)
        assert (status, body["error"]["code"]) == (503, "unavailable")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await runner.cleanup()  # the node's HTTP face stops, as on SIGTERM
        answers = await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
        assert [(status, body["epoch"]) for status, body in answers] == [(200, 1), (200, 1)]
        assert loop.time() - started < WAIT_S / 2, "the watchers did not hold the stop up"


@pytest.mark.asyncio
async def test_a_watcher_that_hangs_up_is_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "topology_watch_hangup_check_ms", 20)
    async with served_node(tmp_path) as (_, node, url, _), aiohttp.ClientSession() as s:
        waiting = asyncio.create_task(get(s, f"{url}/v1/topology?after=1&wait_ms=30000"))
        await until(lambda: node.reconfigure.watch.waiting == 1, "the watcher waiting")
        waiting.cancel()  # the client closes its connection
        await until(lambda: node.reconfigure.watch.waiting == 0, "the waiter let go", WAIT_S)
