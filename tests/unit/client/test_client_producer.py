"""The client as an idempotent producer (docs/node-api.md, "Idempotent producers"): one random
producer id per client, one producer_seq per call counted per shard, the same in every resend of
that call (a dropped connection, ``unavailable``, a ``wrong_role`` redirect), calls kept within a
window of the oldest one in flight, and no producer fields to a node whose HELLO_OK names
protocol version 6. Scripted fake nodes on loopback (port 0) that speak the real frames
(kayos/replication/wire/frames.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

import kayos
from kayos.client.policy import RetryPolicy
from kayos.client.producer import ProducerSeqs
from kayos.errors import InvalidRequest
from kayos.replication.wire.frames import (
    PROTOCOL_VERSION,
    ErrorFrame,
    Frame,
    FrameDecoder,
    Hello,
    HelloOk,
    Produce,
    Produced,
    encode,
)
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

SEED = 4243
QUEUE = "jobs"
WAIT_S = 10.0  # bound on every wait: only a failure reaches it
P = bytes(range(16))

# Answers the n-th PRODUCE a node got (from 0): a frame, or "drop" to close the connection.
Script = Callable[[int, Produce], Any]


def produced(_n: int, frame: Produce) -> Frame:
    return Produced(frame.request_id, 1, len(frame.keys))


class FakeNode:
    """A node's topology over HTTP and a binary port at ``version`` whose answers are scripted;
    it keeps every PRODUCE it decoded."""

    def __init__(self, node_id: str, script: Script = produced, version: int = PROTOCOL_VERSION):
        self.id = node_id
        self.script = script
        self.version = version
        self.requests: list[Produce] = []
        self.topology: Topology | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.bin_port = self._server.sockets[0].getsockname()[1]
        app = web.Application()
        app.router.add_get("/v1/topology", self._topology)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.http_port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self._server.close()
        await self._runner.cleanup()

    async def _topology(self, _request: web.Request) -> web.Response:
        assert self.topology is not None
        return web.json_response(self.topology.to_json())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    if isinstance(frame, Hello):
                        writer.write(encode(HelloOk(self.version, self.id, 1), self.version))
                        decoder.protocol_version = self.version
                        continue
                    assert isinstance(frame, Produce)
                    self.requests.append(frame)
                    answer = self.script(len(self.requests) - 1, frame)
                    if answer == "drop":
                        writer.close()
                        return
                    writer.write(encode(answer, self.version))
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def fake_cluster(*nodes: FakeNode) -> AsyncIterator[list[str]]:
    """The nodes started, the first the head of shard 0; yields the seed URLs."""
    for node in nodes:
        await node.start()
    topology = Topology(
        1,
        {n.id: NodeAddr(n.id, "127.0.0.1", n.http_port, n.bin_port) for n in nodes},
        {0: ShardChain(0, tuple(n.id for n in nodes))},
    )
    for node in nodes:
        node.topology = topology
    try:
        yield [f"http://127.0.0.1:{node.http_port}" for node in nodes]
    finally:
        for node in nodes:
            await node.stop()


def client_of(seeds: list[str], **options: Any) -> kayos.AsyncClient:
    print(f"seed={SEED}")
    client = kayos.AsyncClient(seeds, rng=random.Random(SEED), timeout_s=WAIT_S, **options)
    client.policy = RetryPolicy(attempts_max=4, delay_ms_min=1, delay_ms_max=10)
    return client


def producers(node: FakeNode) -> list[tuple[bytes | None, int]]:
    return [(frame.producer_id, frame.producer_seq) for frame in node.requests]


@pytest.mark.asyncio
async def test_every_resend_of_a_call_names_the_same_producer_seq() -> None:
    def drop_then_busy(n: int, frame: Produce) -> Any:
        if n == 0:
            return "drop"  # a lost connection: outcome unknown to the client
        if n == 1:
            return ErrorFrame(frame.request_id, "unavailable", "catching up", None, 1)
        return produced(n, frame)

    head = FakeNode("a", drop_then_busy)
    async with fake_cluster(head, FakeNode("b")) as seeds, client_of(seeds, producer_id=P) as c:
        await asyncio.wait_for(c.produce(QUEUE, "k", "v"), WAIT_S)
        await asyncio.wait_for(c.produce_batch(QUEUE, [("k1", "v"), ("k2", "v")]), WAIT_S)
    assert producers(head) == [(P, 1), (P, 1), (P, 1), (P, 2)]


@pytest.mark.asyncio
async def test_a_redirected_call_keeps_its_producer_seq() -> None:
    def not_head(_n: int, frame: Produce) -> Frame:
        return ErrorFrame(frame.request_id, "wrong_role", "not the head", "b", 1)

    old_head, new_head = FakeNode("a", not_head), FakeNode("b")
    async with fake_cluster(old_head, new_head) as seeds, client_of(seeds, producer_id=P) as c:
        await asyncio.wait_for(c.produce(QUEUE, "k", "v"), WAIT_S)
    assert producers(old_head) == producers(new_head) == [(P, 1)]


@pytest.mark.asyncio
async def test_each_client_draws_its_own_producer_id_whatever_its_rng() -> None:
    head = FakeNode("a")
    async with fake_cluster(head) as seeds, client_of(seeds) as one, client_of(seeds) as two:
        await one.produce(QUEUE, "k", "v")
        await two.produce(QUEUE, "k", "v")
        await one.produce(QUEUE, "k", "v")
    ids = [producer_id for producer_id, _seq in producers(head)]
    assert ids[0] == ids[2] != ids[1]  # the same seed for both rngs, not the same id
    assert all(producer_id is not None and len(producer_id) == 16 for producer_id in ids)
    assert [seq for _id, seq in producers(head)] == [1, 1, 2]


@pytest.mark.parametrize("producer_id", [b"", bytes(15), bytes(17), "0" * 16])
def test_a_producer_id_that_is_not_16_bytes_is_refused(producer_id: Any) -> None:
    with pytest.raises(InvalidRequest, match="producer_id must be 16 bytes"):
        kayos.AsyncClient("http://127.0.0.1:1", producer_id=producer_id)


@pytest.mark.asyncio
async def test_a_version_6_node_gets_a_produce_without_producer_fields() -> None:
    # Its decoder expects 8 fields: a version 7 PRODUCE would be a protocol error there.
    head = FakeNode("a", version=6)
    async with fake_cluster(head) as seeds, client_of(seeds, producer_id=P) as client:
        assert await asyncio.wait_for(client.produce(QUEUE, "k", "v"), WAIT_S) == 1
    assert producers(head) == [(None, 0)]


def test_threads_sharing_a_client_each_call_take_their_own_producer_seq() -> None:
    head = FakeNode("a")
    loop = asyncio.new_event_loop()
    cluster = fake_cluster(head)
    seeds = loop.run_until_complete(cluster.__aenter__())
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        with kayos.Client(seeds, producer_id=P, timeout_s=WAIT_S) as client:

            def produce_some(thread: int) -> None:
                for i in range(10):
                    client.produce(QUEUE, f"t{thread}-{i}", "v")

            threads = [threading.Thread(target=produce_some, args=(t,)) for t in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT_S)
        assert sorted(seq for _id, seq in producers(head)) == list(range(1, 41))
        assert {producer_id for producer_id, _seq in producers(head)} == {P}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(WAIT_S)
        loop.run_until_complete(cluster.__aexit__(None, None, None))
        loop.close()


@pytest.mark.asyncio
async def test_a_call_starts_only_within_a_window_of_the_oldest_call_in_flight() -> None:
    seqs = ProducerSeqs(window=3)
    assert [await seqs.take(0) for _ in range(3)] == [1, 2, 3]
    assert await seqs.take(1) == 1  # each shard counts its own calls
    held = asyncio.create_task(seqs.take(0))  # 4 is a window ahead of call 1, still in flight
    await asyncio.sleep(0)  # a turn of the loop: the task parks (not a wait for time)
    seqs.done(0, 3)
    await asyncio.sleep(0)
    assert not held.done()
    assert seqs.in_flight(0) == [1, 2]
    seqs.done(0, 1)  # the oldest ended: 4 is within a window of 2
    assert await asyncio.wait_for(held, WAIT_S) == 4
    assert seqs.in_flight(0) == [2, 4]
