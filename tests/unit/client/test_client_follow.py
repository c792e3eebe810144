"""The client follows the cluster (docs/node-api.md, "Clients"), driven through its ``Router``
with fake binary connections and a fake HTTP transport: a newer topology abandons the requests
sent to a node that left their role and the retry sends them at once to the new holder; a lost
connection waits for the manager's new topology; a silent connection is given up; the topology
watch installs what a node answers, backs off from a failing node and stops on close. Backoffs
are set far beyond every wait here, so a test that passes did not back off."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

import kayos
from kayos import limits
from kayos.client import routing
from kayos.client.policy import Purpose, RetryPolicy
from kayos.client.routing import Connection, Router
from kayos.client.watch import Watch
from kayos.clock import ManualClock
from kayos.errors import KayosError, UnavailableError
from kayos.replication.wire.frames import Frame, Produce, Produced, WaitCommitted
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

SEED = 240624
# Bound on every wait here: only a failure reaches it.
WAIT_S = 10.0
# A backoff this long would outlast every wait above: a test that passes did not back off.
NEVER_MS = 600_000
HEAD = Purpose(0, "head")
TAIL = Purpose(0, "tail")
NODES = {n: NodeAddr(n, "127.0.0.1", 7100 + i, 7200 + i) for i, n in enumerate("abc")}


def topology(epoch: int, chain: tuple[str, ...]) -> Topology:
    return Topology(epoch, NODES, {0: ShardChain(0, chain)})


class FakeConnection:
    """A binary connection whose node answers when the test says (``answer``), or never."""

    def __init__(self, node: str, clock: ManualClock) -> None:
        self.node = node
        self.clock = clock
        self.last_heard_s = self.busy_since_s = clock.monotonic_s()
        self.sent: list[tuple[Frame, Purpose | None]] = []
        self.waiting: dict[int, tuple[asyncio.Future[Frame], Purpose | None]] = {}
        self.failure: KayosError | None = None
        self.next_id = 1

    @property
    def alive(self) -> bool:
        return self.failure is None

    @property
    def in_flight(self) -> int:
        return len(self.waiting)

    async def request(
        self, make_frame: Callable[[int], Frame], timeout_s: float, purpose: Purpose | None = None
    ) -> Frame:
        if self.failure is not None:
            raise self.failure
        request_id, self.next_id = self.next_id, self.next_id + 1
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        if not self.waiting:
            self.busy_since_s = self.clock.monotonic_s()
        self.waiting[request_id] = (future, purpose)
        self.sent.append((make_frame(request_id), purpose))
        try:
            return await future
        finally:
            self.waiting.pop(request_id, None)

    def answer(self, reply: Callable[[int], Frame]) -> None:
        """Answers every request waiting here."""
        self.last_heard_s = self.clock.monotonic_s()
        for request_id, (future, _) in list(self.waiting.items()):
            future.set_result(reply(request_id))

    def abandon(
        self, keep: Callable[[Purpose], bool], error_for: Callable[[Purpose], KayosError]
    ) -> int:
        chosen = [
            (rid, purpose)
            for rid, (_, purpose) in self.waiting.items()
            if purpose is not None and not keep(purpose)
        ]
        for rid, purpose in chosen:
            assert purpose is not None
            future, _ = self.waiting.pop(rid)
            future.set_exception(error_for(purpose))
        return len(chosen)

    async def close(self, error: KayosError | None = None) -> None:
        self.failure = error or UnavailableError(f"connection to node {self.node} closed")
        for future, _ in self.waiting.values():
            future.set_exception(self.failure)
        self.waiting.clear()


class FakeHttp:
    """The router's HTTP transport: records each request and answers it with ``reply``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.reply: Callable[[str, str], Awaitable[Any]] | None = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout_s: float,
        params: dict[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        self.requests.append((method, url, body if body is not None else params))
        assert self.reply is not None, f"no answer scripted for {method} {url}"
        return await self.reply(method, url)


class Fixture:
    """A router over fake connections (one per node, made on first use) at topology epoch 1,
    chain a > b > c."""

    def __init__(self) -> None:
        print(f"seed={SEED}")
        self.clock = ManualClock()
        self.settings = kayos.AsyncClient(
            "http://127.0.0.1:7100", rng=random.Random(SEED), clock=self.clock
        )
        self.settings.policy = RetryPolicy(delay_ms_min=NEVER_MS, delay_ms_max=NEVER_MS)
        self.http = FakeHttp()
        self.connections: dict[str, list[FakeConnection]] = {}
        self.connect_gate: dict[str, asyncio.Event] = {}
        self.router = Router(self.settings, cast(Any, self.http), connect=self.connect)
        self.router.current = topology(1, ("a", "b", "c"))

    async def connect(self, node: str, address: NodeAddr, name: str) -> Connection:
        gate = self.connect_gate.get(node)
        if gate is not None:
            await gate.wait()
        connection = FakeConnection(node, self.clock)
        self.connections.setdefault(node, []).append(connection)
        return connection

    def last(self, node: str) -> FakeConnection:
        return self.connections[node][-1]

    def produce(self) -> asyncio.Task[Frame]:
        """A produce to shard 0's head, retried by the router as ``AsyncClient`` does."""

        def frame(request_id: int) -> Produce:
            return Produce(request_id, "q", (b"k",), (b"v",), None, None, -1, False)

        async def attempt(redirect: str | None) -> Frame:
            node = redirect or self.router.topology.shards[0].head
            return await self.router.send(node, HEAD, frame, WAIT_S * 10)

        return asyncio.create_task(self.router.retrying(attempt))

    async def until(self, condition: Callable[[], object], what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not condition():
            assert loop.time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.005)  # a bounded poll of a condition


def produced(request_id: int) -> Frame:
    return Produced(request_id, 7, 7)


@pytest.fixture
def managed(monkeypatch: pytest.MonkeyPatch) -> str:
    """Topologies name one manager member: a lost request waits for its new topology."""
    url = "http://127.0.0.1:7300"
    monkeypatch.setattr(routing, "manager_urls", lambda topology: [url])
    return url


# --- abandoning ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_newer_topology_resends_the_produce_on_the_old_head_to_the_new_one_at_once() -> (
    None
):
    f = Fixture()
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    await f.router.install(topology(2, ("b", "c")))  # a spliced out: b heads the shard
    await f.until(lambda: "b" in f.connections and f.last("b").in_flight == 1, "resent to b")
    f.last("b").answer(produced)
    reply = await asyncio.wait_for(produce, WAIT_S)
    assert reply == Produced(1, 7, 7)
    (first, purpose), (again, _) = f.last("a").sent[0], f.last("b").sent[0]
    assert purpose == HEAD
    assert isinstance(first, Produce)
    assert isinstance(again, Produce)
    assert again.keys == first.keys
    assert again.values == first.values, "the same frame contents, built again"
    assert f.last("a").alive, "the connection to a stays: only the request was given up"


@pytest.mark.asyncio
async def test_a_request_to_a_node_that_keeps_its_role_is_not_abandoned() -> None:
    f = Fixture()

    async def attempt(redirect: str | None) -> Frame:
        return await f.router.send(
            "c", TAIL, lambda rid: WaitCommitted(rid, 0, 5, 100), WAIT_S * 10
        )

    wait = asyncio.create_task(f.router.retrying(attempt))
    await f.until(lambda: "c" in f.connections and f.last("c").in_flight == 1, "sent to c")
    await f.router.install(topology(2, ("b", "c")))  # the head changed, the tail did not
    assert f.last("c").in_flight == 1
    assert not wait.done()
    f.last("c").answer(lambda rid: Produced(rid, 5, 5))
    await asyncio.wait_for(wait, WAIT_S)
    assert len(f.last("c").sent) == 1


@pytest.mark.asyncio
async def test_a_request_waiting_for_its_connection_to_the_old_head_is_abandoned() -> None:
    f = Fixture()
    f.connect_gate["a"] = asyncio.Event()  # a's connection never opens (a is frozen)
    produce = f.produce()
    await f.until(lambda: f.router.pending, "waiting for the connection to a")
    await f.router.install(topology(2, ("b", "c")))
    await f.until(lambda: "b" in f.connections and f.last("b").in_flight == 1, "resent to b")
    f.last("b").answer(produced)
    await asyncio.wait_for(produce, WAIT_S)
    assert "a" not in f.connections


@pytest.mark.asyncio
async def test_an_http_request_to_the_old_tail_is_abandoned_and_cancelled() -> None:
    f = Fixture()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def page() -> str:
        started.set()
        try:
            await asyncio.Event().wait()  # the frozen tail never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "page"

    call = asyncio.create_task(f.router.call("c", TAIL, page()))
    await asyncio.wait_for(started.wait(), WAIT_S)
    await f.router.install(topology(2, ("a", "b")))  # c spliced out: b is the tail
    with pytest.raises(UnavailableError, match="not the tail of shard 0") as caught:
        await asyncio.wait_for(call, WAIT_S)
    assert caught.value.failure == "abandoned"
    await asyncio.wait_for(cancelled.wait(), WAIT_S)
    assert not f.router.pending


# --- lost connections and silence ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_lost_connection_waits_for_the_managers_topology_and_reports_the_node(
    managed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "client_silence_ms", NEVER_MS)  # only a new topology ends the wait

    async def accepted(method: str, url: str) -> Any:
        return {}

    f = Fixture()
    f.http.reply = accepted
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    await f.last("a").close(UnavailableError("a reset the connection", failure="lost"))
    await f.until(lambda: f.http.requests, "the report to the manager")
    assert f.http.requests == [("POST", managed + "/v1/manager/suspect", {"node": "a"})]
    await asyncio.sleep(0.05)
    assert not produce.done()
    assert len(f.connections["a"]) == 1, "not sent again to a before the topology changes"
    await f.router.install(topology(2, ("b", "c")))
    await f.until(lambda: "b" in f.connections and f.last("b").in_flight == 1, "resent to b")
    f.last("b").answer(produced)
    await asyncio.wait_for(produce, WAIT_S)


@pytest.mark.asyncio
async def test_without_managers_a_lost_connection_is_retried_at_the_same_node_after_backoff() -> (
    None
):
    f = Fixture()
    f.settings.policy = RetryPolicy(delay_ms_min=1, delay_ms_max=2)
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    await f.last("a").close(UnavailableError("a reset the connection", failure="lost"))
    await f.until(lambda: len(f.connections["a"]) == 2 and f.last("a").in_flight, "a again")
    f.last("a").answer(produced)
    await asyncio.wait_for(produce, WAIT_S)
    assert f.http.requests == [], "no manager to report to"


@pytest.mark.asyncio
async def test_a_silent_connection_is_given_up_and_its_request_follows_the_new_topology(
    managed: str,
) -> None:
    async def accepted(method: str, url: str) -> Any:
        return {}

    f = Fixture()
    f.http.reply = accepted
    silence_s = limits.client_silence_ms / 1000
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    idle = await f.router.connection("c")  # no request outstanding: never silent
    assert isinstance(idle, FakeConnection)
    f.clock.advance(silence_s / 2)
    f.last("a").last_heard_s = f.clock.monotonic_s()  # a PING
    f.clock.advance(silence_s * 0.9)
    assert await f.router.close_silent(f.clock.monotonic_s()) == [], "heard within the bound"
    f.clock.advance(silence_s * 0.2)
    assert await f.router.close_silent(f.clock.monotonic_s()) == ["a"]
    assert not f.last("a").alive
    assert idle.alive
    await f.until(lambda: f.http.requests, "the report to the manager")
    await f.router.install(topology(2, ("b", "c")))
    await f.until(lambda: "b" in f.connections and f.last("b").in_flight == 1, "resent to b")
    f.last("b").answer(produced)
    await asyncio.wait_for(produce, WAIT_S)


# --- the watch -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_watch_installs_a_newer_topology_and_backs_off_from_a_failing_node() -> None:
    f = Fixture()
    f.settings.seeds = ["http://127.0.0.1:7100"]
    f.settings.policy = RetryPolicy(delay_ms_min=20, delay_ms_max=40)
    newer = topology(2, ("b", "c"))
    released = asyncio.Event()
    asked: dict[str, list[dict[str, str]]] = {}

    class Transport:
        async def request(
            self, method: str, url: str, *, timeout_s: float, params: dict[str, str] | None = None
        ) -> object:
            assert params is not None
            assert timeout_s >= int(params["wait_ms"]) / 1000
            asked.setdefault(url.removesuffix("/v1/topology"), []).append(params)
            if url.startswith(NODES["a"].http_url):  # a is frozen: the poll waits
                await asyncio.Event().wait()
            if url.startswith(NODES["c"].http_url):  # c refuses
                raise UnavailableError("refused", failure="lost")
            await released.wait()  # b waits until it adopts epoch 2
            return newer.to_json()

    f.router.watch = watch = Watch(f.router, f.settings, transport=Transport())
    await watch.start()
    assert sorted(watch.urls) == sorted(n.http_url for n in NODES.values())
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    await f.until(lambda: len(asked.get(NODES["c"].http_url, [])) >= 3, "c asked again")
    released.set()
    await f.until(lambda: f.router.topology.epoch == 2, "epoch 2 installed from b")
    await f.until(lambda: "b" in f.connections and f.last("b").in_flight == 1, "resent to b")
    f.last("b").answer(produced)
    await asyncio.wait_for(produce, WAIT_S)
    b_polls = asked[NODES["b"].http_url]
    assert b_polls[0] == {"after": "1", "wait_ms": str(limits.topology_watch_wait_ms_max)}
    await f.until(lambda: len(b_polls) >= 2, "b asked again at once")
    assert b_polls[1]["after"] == "2"
    await watch.close()
    assert watch.urls == []
    assert not watch.running


@pytest.mark.asyncio
async def test_the_watch_follows_the_node_list_of_each_new_topology() -> None:
    f = Fixture()
    f.settings.seeds = ["http://seed:1"]

    class Quiet:
        async def request(
            self, method: str, url: str, *, timeout_s: float, params: dict[str, str] | None = None
        ) -> object:
            await asyncio.Event().wait()
            return None

    f.router.watch = watch = Watch(f.router, f.settings, transport=Quiet())
    await watch.start()
    assert len(watch.urls) == 4
    smaller = Topology(2, {"b": NODES["b"]}, {0: ShardChain(0, ("b",))})
    await f.router.install(smaller)
    assert sorted(watch.urls) == sorted(["http://seed:1", NODES["b"].http_url])
    await watch.close()


@pytest.mark.asyncio
async def test_the_router_starts_its_watch_and_silence_checks_and_close_stops_them() -> None:
    f = Fixture()
    await f.router.start()
    assert f.router.watch.running
    assert len(f.router.watch.urls) == 3
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    await f.router.close()
    assert not f.router.watch.running
    assert f.router.watch.urls == []
    with pytest.raises(UnavailableError):
        await asyncio.wait_for(produce, WAIT_S)


@pytest.mark.asyncio
async def test_a_client_that_does_not_follow_starts_no_watch() -> None:
    f = Fixture()
    f.settings.follow = False
    await f.router.start()
    assert not f.router.watch.running
    assert f.router.watch.urls == []
    assert f.http.requests == []  # no long poll went out
    produce = f.produce()
    await f.until(lambda: "a" in f.connections and f.last("a").in_flight == 1, "sent to a")
    f.last("a").answer(produced)
    await asyncio.wait_for(produce, WAIT_S)
    assert f.http.requests == []  # still no long poll: the produce needed none
    await f.router.close()
