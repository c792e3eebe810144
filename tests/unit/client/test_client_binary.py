"""The client's drivers against scripted fake nodes on loopback (port 0): request-id matching
of pipelined replies (docs/node-api.md, "Binary port"), error mapping, wrong_role redirects,
backoff on unavailable and on dropped connections, consume paging over HTTP, the blocking
Client. The fake nodes speak the real frames (kayos/replication/wire/frames.py) and HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
from aiohttp import web

import kayos
from kayos.client.binary import RequestTable, reply_request_id
from kayos.client.http import HttpTransport
from kayos.client.policy import RetryPolicy
from kayos.client.routing import Router
from kayos.client.types import Message
from kayos.errors import InvalidRequest, ProtocolError, UnavailableError, WrongRoleError
from kayos.replication.wire.frames import (
    PROTOCOL_VERSION,
    CommittedReply,
    ErrorFrame,
    Frame,
    FrameDecoder,
    Hello,
    HelloOk,
    Ping,
    Produce,
    Produced,
    WaitCommitted,
    encode,
)
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

SEED = 4242
QUEUE = "jobs"
# Bound on every wait in these tests: only a failure reaches it.
WAIT_S = 10.0

# --- pure parts ----------------------------------------------------------------------------------


def test_request_ids_are_unique_among_requests_in_flight() -> None:
    table: RequestTable[str] = RequestTable()
    ids = [table.add(f"r{i}") for i in range(100)]
    assert len(set(ids)) == 100
    assert table.pop(ids[5]) == "r5"
    assert table.pop(ids[5]) is None, "a reply answered twice is dropped"
    assert table.pop(10_000) is None, "a reply to an unknown request is dropped"
    assert len(table) == 99
    assert sorted(table.drain()) == sorted(f"r{i}" for i in range(100) if i != 5)
    assert len(table) == 0


def test_request_ids_wrap_around_skipping_ids_in_flight() -> None:
    table: RequestTable[str] = RequestTable()
    table._next_id = 2**64 - 2
    first = table.add("a")
    second = table.add("b")
    third = table.add("c")
    assert (first, second, third) == (2**64 - 2, 2**64 - 1, 1)
    table._next_id = 2**64 - 2  # all three are still in flight
    assert table.add("d") == 2


@pytest.mark.parametrize(
    ("frame", "request_id"),
    [
        (Produced(7, 1, 2), 7),
        (CommittedReply(8, 0, 5), 8),
        (ErrorFrame(9, "unavailable", "", None, 1), 9),
        (ErrorFrame(None, "protocol_error", "", None, 1), None),
    ],
)
def test_reply_request_id(frame: Frame, request_id: int | None) -> None:
    assert reply_request_id(frame) == request_id


def test_a_frame_a_node_may_not_send_a_client_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        reply_request_id(Hello(PROTOCOL_VERSION, "x", None, 0, "client"))


# --- fake nodes ----------------------------------------------------------------------------------

# A script answers one client request frame: a reply frame, None to say nothing (yet), or the
# string "drop" to close the connection.
Script = Callable[["FakeNode", Frame], Any]


class FakeNode:
    """One node's faces for the client: ``/v1/topology`` and ``consume`` over HTTP, and a binary
    port whose replies a test scripts."""

    def __init__(self, node_id: str, script: Script | None = None) -> None:
        self.id = node_id
        self.script: Script = script or produced_in_order
        self.requests: list[Frame] = []
        self.http_requests: list[dict[str, str]] = []
        self.held: list[Frame] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.topology: Topology | None = None
        # Answers a consume's query parameters with (status, body), or a coroutine of them.
        self.consume_reply: Callable[[dict[str, str]], Any] | None = None
        self.next_seq = 1

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.bin_port = self._server.sockets[0].getsockname()[1]
        app = web.Application()
        app.router.add_get("/v1/topology", self._topology)
        app.router.add_get("/v1/queues/{queue}/consume", self._consume)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.http_port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for writer in self.writers:
            writer.close()
        self._server.close()
        await self._runner.cleanup()

    @property
    def addr(self) -> NodeAddr:
        return NodeAddr(self.id, "127.0.0.1", self.http_port, self.bin_port)

    async def _topology(self, request: web.Request) -> web.Response:
        assert self.topology is not None
        return web.json_response(self.topology.to_json())

    async def _consume(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        self.http_requests.append(params)
        assert self.consume_reply is not None
        assert request.headers["Accept"] == "application/msgpack"
        reply = self.consume_reply(params)
        status, body = await reply if inspect.isawaitable(reply) else reply
        return web.Response(
            status=status,
            body=msgpack.packb(body, use_bin_type=True),
            content_type="application/msgpack",
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        decoder = FrameDecoder()
        hello_seen = False
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    if not hello_seen:
                        assert isinstance(frame, Hello)
                        assert (frame.role, frame.shard, frame.epoch) == ("client", None, 0)
                        hello_seen = True
                        writer.write(encode(HelloOk(PROTOCOL_VERSION, self.id, 1)))
                        writer.write(encode(Ping(1)))  # a client answers PINGs at any time
                        continue
                    if not isinstance(frame, Produce | WaitCommitted):
                        continue  # the PONG to our PING
                    self.requests.append(frame)
                    answer = self.script(self, frame)
                    if answer == "drop":
                        writer.close()
                        return
                    for reply in answer if isinstance(answer, list) else [answer]:
                        if reply is not None:
                            writer.write(encode(reply))
                await writer.drain()
        writer.close()


def produced_in_order(node: FakeNode, frame: Frame) -> Frame | None:
    if isinstance(frame, Produce):
        first = node.next_seq
        node.next_seq += len(frame.keys)
        return Produced(frame.request_id, first, node.next_seq - 1)
    if isinstance(frame, WaitCommitted):
        return CommittedReply(frame.request_id, frame.shard, node.next_seq - 1)
    return None


@contextlib.asynccontextmanager
async def fake_cluster(
    scripts: dict[str, Script | None],
) -> AsyncIterator[dict[str, FakeNode]]:
    """Fake nodes ``a`` (head) and ``b`` (tail) of one shard, already started."""
    nodes = {node_id: FakeNode(node_id, script) for node_id, script in scripts.items()}
    for node in nodes.values():
        await node.start()
    ids = tuple(nodes)
    topology = Topology(1, {n.id: n.addr for n in nodes.values()}, {0: ShardChain(0, ids)})
    for node in nodes.values():
        node.topology = topology
    try:
        yield nodes
    finally:
        for node in nodes.values():
            await node.stop()


def client_of(nodes: dict[str, FakeNode]) -> kayos.AsyncClient:
    print(f"seed={SEED}")
    seeds = [f"http://127.0.0.1:{node.http_port}" for node in nodes.values()]
    client = kayos.AsyncClient(seeds, rng=random.Random(SEED), timeout_s=WAIT_S)
    client.policy = RetryPolicy(attempts_max=4, delay_ms_min=1, delay_ms_max=10)
    return client


# --- binary port ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_pipelined_replies_out_of_order_reach_their_requests() -> None:
    in_flight = 20

    def reverse(node: FakeNode, frame: Frame) -> list[Frame] | None:
        assert isinstance(frame, Produce)
        node.held.append(frame)
        if len(node.held) < in_flight:
            return None  # every request is on the wire before the first reply
        replies: list[Frame] = []
        for held in reversed(node.held):
            assert isinstance(held, Produce)
            seq = int(held.keys[0].decode().removeprefix("k")) + 100
            replies.append(Produced(held.request_id, seq, seq))
        return replies

    async with fake_cluster({"a": reverse, "b": None}) as nodes, client_of(nodes) as client:
        seqs = await asyncio.wait_for(
            asyncio.gather(
                *(client.produce(QUEUE, f"k{i}", "v", acks=1) for i in range(in_flight))
            ),
            WAIT_S,
        )
        assert seqs == [i + 100 for i in range(in_flight)]
        assert len({frame.request_id for frame in nodes["a"].requests}) == in_flight
        assert nodes["b"].requests == []


@pytest.mark.asyncio
async def test_produce_frame_carries_the_batch() -> None:
    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        result = await client.produce_batch(
            QUEUE, [("k1", "v1"), kayos.Item("k2", None), ("k3", b"v3", 99)], acks="all", txn=True
        )
        assert result == (1, 3)
        (frame,) = nodes["a"].requests
        assert isinstance(frame, Produce)
        assert (frame.queue, frame.keys, frame.values) == (
            QUEUE,
            (b"k1", b"k2", b"k3"),
            (b"v1", None, b"v3"),
        )
        assert (frame.expiries_ms, frame.headers, frame.acks, frame.txn) == (
            (0, 0, 99),
            None,
            -1,
            True,
        )


def answer_error(code: str, message: str) -> Script:
    """A script that fails every request with ``code``."""

    def script(node: FakeNode, frame: Frame) -> Frame:
        assert isinstance(frame, Produce | WaitCommitted)
        return ErrorFrame(frame.request_id, code, message, None, 1)

    return script


@pytest.mark.asyncio
async def test_an_error_reply_is_raised_as_its_class_and_not_retried() -> None:
    refuse = answer_error("invalid_request", "bad queue")
    async with fake_cluster({"a": refuse, "b": None}) as nodes, client_of(nodes) as client:
        with pytest.raises(InvalidRequest, match="bad queue"):
            await client.produce(QUEUE, "k", "v")
        assert len(nodes["a"].requests) == 1


@pytest.mark.asyncio
async def test_wrong_role_redirects_to_the_named_node() -> None:
    def not_head(node: FakeNode, frame: Frame) -> Frame:
        assert isinstance(frame, Produce)
        return ErrorFrame(frame.request_id, "wrong_role", "not the head", "b", 1)

    async with fake_cluster({"a": not_head, "b": None}) as nodes, client_of(nodes) as client:
        assert await client.produce(QUEUE, "k", "v") == 1
        assert (len(nodes["a"].requests), len(nodes["b"].requests)) == (1, 1)


@pytest.mark.asyncio
async def test_endless_redirects_are_reported() -> None:
    def ping_pong(node: FakeNode, frame: Frame) -> Frame:
        assert isinstance(frame, Produce)
        other = "b" if node.id == "a" else "a"
        return ErrorFrame(frame.request_id, "wrong_role", "not me", other, 1)

    async with fake_cluster({"a": ping_pong, "b": ping_pong}) as nodes, client_of(nodes) as client:
        with pytest.raises(WrongRoleError):
            await client.produce(QUEUE, "k", "v")
        sent = len(nodes["a"].requests) + len(nodes["b"].requests)
        assert sent == client.policy.redirects_max + 1


@pytest.mark.asyncio
async def test_unavailable_is_retried_with_backoff() -> None:
    def busy_twice(node: FakeNode, frame: Frame) -> Frame | None:
        assert isinstance(frame, Produce)
        if len(node.requests) <= 2:
            return ErrorFrame(frame.request_id, "unavailable", "catching up", None, 1)
        return produced_in_order(node, frame)

    async with fake_cluster({"a": busy_twice, "b": None}) as nodes, client_of(nodes) as client:
        assert await client.produce(QUEUE, "k", "v") == 1
        assert len(nodes["a"].requests) == 3


@pytest.mark.asyncio
async def test_unavailable_past_the_attempt_bound_is_raised() -> None:
    always_busy = answer_error("unavailable", "broken chain")
    async with fake_cluster({"a": always_busy, "b": None}) as nodes, client_of(nodes) as client:
        with pytest.raises(UnavailableError, match="broken chain"):
            await client.produce(QUEUE, "k", "v")
        assert len(nodes["a"].requests) == client.policy.attempts_max


@pytest.mark.asyncio
async def test_a_dropped_connection_is_reopened_and_the_produce_retried() -> None:
    def drop_first(node: FakeNode, frame: Frame) -> Any:
        if len(node.requests) == 1:
            return "drop"
        return produced_in_order(node, frame)

    async with fake_cluster({"a": drop_first, "b": None}) as nodes, client_of(nodes) as client:
        assert await client.produce(QUEUE, "k", "v") == 1
        assert len(nodes["a"].requests) == 2
        assert len(nodes["a"].writers) == 2, "a second connection"


@pytest.mark.asyncio
async def test_a_connection_level_error_fails_every_request_in_flight() -> None:
    def fail_all(node: FakeNode, frame: Frame) -> Frame | None:
        node.held.append(frame)
        if len(node.held) < 3:
            return None
        return ErrorFrame(None, "protocol_error", "garbled", None, 1)

    async with fake_cluster({"a": fail_all, "b": None}) as nodes, client_of(nodes) as client:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(client.produce(QUEUE, f"k{i}", "v") for i in range(3)), return_exceptions=True
            ),
            WAIT_S,
        )
        assert all(isinstance(result, ProtocolError) for result in results), results


@pytest.mark.asyncio
async def test_wait_committed_asks_a_tail() -> None:
    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["b"].next_seq = 6  # b says it is committed through 5
        assert await client.wait_committed(QUEUE, 5, timeout_s=1.0)
        assert not await client.wait_committed(0, 6, timeout_s=0.0)
        frames = nodes["b"].requests
        assert [(f.shard, f.seq) for f in frames if isinstance(f, WaitCommitted)] == [
            (0, 5),
            (0, 6),
        ]
        assert nodes["a"].requests == []


# --- consume over HTTP ---------------------------------------------------------------------------


def paged_reply(params: dict[str, str]) -> tuple[int, Any]:
    """A tail's snapshot (0, 6] with messages at 2, 4, 6, two a page; in columns if asked."""
    after = int(params.get("after", "0"))
    seqs = [s for s in (2, 4, 6) if s > after][: int(params["limit"])]
    last = seqs[-1] if seqs else 6
    body: dict[str, Any] = {"shard": 0, "group": params["group"], "hwm": 0, "boundary": 6}
    if params.get("columns") == "1":
        body["seqs"] = seqs
        body["keys"] = [f"k{s}".encode() for s in seqs]
        body["values"] = [b"v" for _ in seqs]
        body["expiries_ms"] = body["headers"] = body["deleted"] = None
    else:
        body["messages"] = [
            {"seq": s, "key": f"k{s}".encode(), "value": b"v", "deleted": False} for s in seqs
        ]
    body["next"] = last
    body["end"] = last >= 6
    return 200, body


def rows_reply(params: dict[str, str]) -> tuple[int, Any]:
    """A node that knows no ``columns`` flag: list-of-objects pages only."""
    return paged_reply({name: value for name, value in params.items() if name != "columns"})


@pytest.mark.asyncio
async def test_consume_pages_one_snapshot_from_the_tail() -> None:
    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["b"].consume_reply = paged_reply
        pages = [page async for page in client.consume(QUEUE, "g", page_size=2)]
        assert [[m.seq for m in page.messages] for page in pages] == [[2, 4], [6]]
        assert [page.messages[0] for page in pages] == [
            Message(2, b"k2", b"v"),
            Message(6, b"k6", b"v"),
        ]
        assert [page.end for page in pages] == [False, True]
        assert nodes["b"].http_requests == [
            {"group": "g", "limit": "2", "columns": "1", "shard": "0"},
            {"group": "g", "limit": "2", "columns": "1", "after": "4", "upto": "6", "shard": "0"},
        ]
        assert nodes["a"].http_requests == []


@pytest.mark.asyncio
async def test_consume_reads_list_of_objects_pages_too() -> None:
    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["b"].consume_reply = rows_reply
        pages = [page async for page in client.consume(QUEUE, "g", page_size=2)]
        assert [[m.seq for m in page.messages] for page in pages] == [[2, 4], [6]]
        assert [list(page.columns.keys) for page in pages] == [[b"k2", b"k4"], [b"k6"]]


@pytest.mark.asyncio
async def test_consume_asks_for_the_next_page_while_the_caller_holds_this_one() -> None:
    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["b"].consume_reply = paged_reply
        pages = client.consume(QUEUE, "g", page_size=2)
        first = await anext(pages)
        assert not first.end
        for _ in range(200):  # the request for page 2 goes out without another anext
            if len(nodes["b"].http_requests) == 2:
                break
            await asyncio.sleep(0.01)
        assert nodes["b"].http_requests[1]["after"] == "4"
        second = await anext(pages)
        assert ([m.seq for m in second.messages], second.end) == ([6], True)
        with pytest.raises(StopAsyncIteration):
            await anext(pages)
        assert len(nodes["b"].http_requests) == 2, "nothing asked for past the end page"


@pytest.mark.asyncio
async def test_a_consumer_that_stops_early_drops_the_page_asked_for_ahead() -> None:
    release = asyncio.Event()

    async def slow(params: dict[str, str]) -> tuple[int, Any]:
        if "after" in params:
            await release.wait()
        return paged_reply(params)

    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["b"].consume_reply = slow
        pages = client.consume(QUEUE, "g", page_size=2)
        first = await anext(pages)
        assert [m.seq for m in first.messages] == [2, 4]
        ahead = [t for t in asyncio.all_tasks() if "AsyncClient._page" in repr(t.get_coro())]
        assert len(ahead) == 1
        assert not ahead[0].done()
        await asyncio.wait_for(pages.aclose(), WAIT_S / 2)
        for _ in range(100):
            if ahead[0].done():
                break
            await asyncio.sleep(0.01)
        assert ahead[0].cancelled()
        release.set()


@pytest.mark.asyncio
async def test_consume_follows_a_421_to_the_tail() -> None:
    def not_a_tail(params: dict[str, str]) -> tuple[int, Any]:
        error = {"code": "wrong_role", "message": "head", "redirect": None, "node": "b", "epoch": 1}
        return 421, {"error": error}

    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["a"].consume_reply = not_a_tail
        nodes["b"].consume_reply = paged_reply
        client.topology.shards[0] = ShardChain(0, ("b", "a"))  # a stale view: a is the tail
        pages = [page async for page in client.consume(QUEUE, "g", page_size=10)]
        assert [m.seq for m in pages[0].messages] == [2, 4, 6]
        assert len(nodes["a"].http_requests) == 1


@pytest.mark.asyncio
async def test_a_page_that_breaks_the_snapshot_is_a_protocol_error() -> None:
    def moving(params: dict[str, str]) -> tuple[int, Any]:
        status, body = paged_reply(params)
        if "after" in params:
            body["boundary"] = 9
        return status, body

    async with fake_cluster({"a": None, "b": None}) as nodes, client_of(nodes) as client:
        nodes["b"].consume_reply = moving
        with pytest.raises(ProtocolError, match="broke the snapshot"):
            async for _page in client.consume(QUEUE, "g", page_size=2):
                pass


# --- the blocking client -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_blocking_client_runs_its_own_loop() -> None:
    async with fake_cluster({"a": None, "b": None}) as nodes:
        nodes["b"].consume_reply = paged_reply
        seed = f"http://127.0.0.1:{nodes['a'].http_port}"

        def use() -> tuple[int, tuple[int, int] | None, list[int]]:
            with kayos.Client(seed, rng=random.Random(SEED)) as client:
                seq = client.produce(QUEUE, "k", "v")
                with client.transaction(QUEUE) as txn:
                    txn.put("a", "1")
                    txn.delete("b")
                seqs = [m.seq for page in client.consume(QUEUE, "g") for m in page.messages]
                return seq, txn.result, seqs

        seq, result, seqs = await asyncio.wait_for(asyncio.to_thread(use), WAIT_S)
        assert (seq, result, seqs) == (1, (2, 3), [2, 4, 6])
        produce = nodes["a"].requests[1]
        assert isinstance(produce, Produce)
        assert produce.txn


def test_blocking_client_reports_an_unreachable_cluster() -> None:
    client_kwargs: dict[str, Any] = {"retries": 2, "rng": random.Random(SEED)}
    with pytest.raises(UnavailableError):
        kayos.Client("http://127.0.0.1:9", **client_kwargs)


def test_consumers_take_fanout_tails_in_turn() -> None:
    router = Router(kayos.AsyncClient("http://127.0.0.1:1"), HttpTransport())
    nodes = {n: NodeAddr(n, "127.0.0.1", 1, 2) for n in "abcd"}
    router.current = Topology(1, nodes, {0: ShardChain(0, ("a", "b"), ("c", "d"))})
    assert [router.tail(0) for _ in range(4)] == ["c", "d", "c", "d"]
    assert router.node_named("http://127.0.0.1:1/") == "a", "a URL names the first match"
    assert router.node_named("b") == "b"
    assert router.node_named("zz") is None
