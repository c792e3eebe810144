"""The link handshake and client connections against misbehaving peers
(docs/replication-protocol.md, "Handshake" and "Liveness"): silent upstreams, oversized or forged
frames before the handshake, too many connections, odd node ids, host lookups, clients past the
in-flight bound. In-process nodes on loopback (free ports) and raw sockets
(tests/support/links.py). Every wait is a bounded poll of a condition."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.errors import InvalidRequest, WrongPeerError
from kayos.node.runtime import Node
from kayos.replication.link import handshake
from kayos.replication.link.handshake import HostAddresses, accept_peer
from kayos.replication.link.stream import FrameStream
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from kayos.topology import NodeAddr, ShardChain, Topology
from tests.support.links import TEST_IDENTITY, RawLink, link_hello, one_shard_topology, until

pytestmark = pytest.mark.unit

SEED = 20261124
WAIT_S = 30.0
SILENCE_S = limits.peer_silence_ms_max / 1000
# How late a bound may be seen on 2 shared cores: the ping interval (the silence is checked once
# per ping) plus a second and a half of scheduling and polling.
SLACK_S = limits.ping_interval_ms / 1000 + 1.5
# A connection closed "at once" is closed well inside the handshake bound it used to wait out.
AT_ONCE_S = limits.handshake_ms_max / 1000 / 2


def _node(topology: Topology, node_id: str, base: Path) -> Node:
    return Node(topology, node_id, str(base / node_id), rng=random.Random(SEED))


# --- 1: a downstream does not wait without limit for SUBSCRIBED ---------------------------------


@pytest.mark.asyncio
async def test_an_upstream_silent_after_hello_ok_is_dropped_within_the_silence_bound(
    tmp_path: Path,
) -> None:
    """A fake upstream proves the secret, sends HELLO_OK and then never answers (a wedged node):
    the downstream closes the link within the silence bound and connects again."""
    print("seed", SEED)
    topology = one_shard_topology(["a", "b"])
    loop = asyncio.get_running_loop()
    connections: list[dict[str, float | None]] = []

    async def silent_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: dict[str, float | None] = {"hello_ok": None, "closed": None}
        connections.append(seen)
        stream = FrameStream(reader, writer)
        try:
            hello = await stream.recv()
            assert isinstance(hello, fr.Hello)
            nonce = secrets.token_bytes(limits.auth_nonce_bytes)
            stream.send(fr.AuthChallenge(TEST_IDENTITY.cluster_uuid, nonce))
            proof = await stream.recv()
            assert isinstance(proof, fr.AuthProof)
            claim = auth.LinkClaim.of_hello(hello, "a")
            mac = auth.proof(TEST_IDENTITY, auth.ACCEPTOR_PROVES, claim, nonce, proof.nonce)
            stream.send(fr.AuthOk(mac))
            stream.send(fr.HelloOk(fr.PROTOCOL_VERSION, "a", topology.epoch))
            seen["hello_ok"] = loop.time()
            while await stream.recv() is not None:
                pass  # SUBSCRIBE and PINGs are read, nothing is ever answered
        except (OSError, fr.ProtocolError):
            pass
        finally:
            seen["closed"] = loop.time()
            stream.close()

    address = topology.nodes["a"]
    server = await asyncio.start_server(silent_upstream, address.host, address.bin_port)
    node = _node(topology, "b", tmp_path)
    try:
        await node.start()
        await until(lambda: len(connections) >= 2, "the downstream to connect again")
        first = connections[0]
        assert first["hello_ok"] is not None
        assert first["closed"] is not None
        waited = first["closed"] - first["hello_ok"]
        print(f"the downstream dropped the silent upstream {waited:.2f} s after HELLO_OK")
        assert waited <= SILENCE_S + SLACK_S, f"the link waited {waited:.1f} s for SUBSCRIBED"
    finally:
        await node.stop()
        server.close()


# --- 2: HELLO is bounded before authentication --------------------------------------------------


@pytest.mark.asyncio
async def test_a_large_frame_before_the_handshake_is_refused_at_its_length(
    tmp_path: Path,
) -> None:
    """A peer that proved nothing announces a 1 MB HELLO and sends only its start: the node
    refuses the length at once instead of buffering the frame until the handshake bound."""
    topology = one_shard_topology(["a"])
    node = _node(topology, "a", tmp_path)
    await node.start()
    address = topology.nodes["a"]
    frame = fr.encode(link_hello("x" * 1_000_000, 0, topology.epoch, "tail"))

    def send_the_start() -> float:
        link = RawLink.open(address.host, address.bin_port)
        try:
            link.sock.sendall(frame[:100])
            started = time.monotonic()
            link.wait_closed()
            return time.monotonic() - started
        finally:
            link.close()

    try:
        elapsed = await asyncio.to_thread(send_the_start)
        assert elapsed < AT_ONCE_S, f"closed after {elapsed:.1f} s"
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_refused_hello_cannot_forge_log_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topology = one_shard_topology(["a"])
    node = _node(topology, "a", tmp_path)
    await node.start()
    address = topology.nodes["a"]
    forged = "b\n2026-11-24 CRITICAL kayos.node forged record " + "y" * 2000

    def hello_as(node_id: str) -> fr.Frame | None:
        link = RawLink.open(address.host, address.bin_port)
        try:
            link.send(link_hello(node_id, 0, topology.epoch, "tail"))
            return link.next()
        finally:
            link.close()

    try:
        with caplog.at_level(logging.WARNING, logger="kayos.replication"):
            reply = await asyncio.to_thread(hello_as, forged)
        assert isinstance(reply, fr.ErrorFrame)
        assert reply.code == InvalidRequest.code
        refusals = [r.getMessage() for r in caplog.records if "refused link" in r.getMessage()]
        assert len(refusals) == 1
        assert "\n" not in refusals[0]
        assert len(refusals[0]) < 1000
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_connections_past_the_handshake_bound_are_closed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound = 8
    monkeypatch.setattr(limits, "handshake_connections_max", bound)
    topology = one_shard_topology(["a"])
    node = _node(topology, "a", tmp_path)
    await node.start()
    address = topology.nodes["a"]
    silent = [
        socket.create_connection((address.host, address.bin_port), timeout=WAIT_S)
        for _ in range(bound)
    ]

    def one_more() -> tuple[float, bool]:
        link = RawLink.open(address.host, address.bin_port)
        try:
            started = time.monotonic()
            link.wait_closed()
            return time.monotonic() - started, link.frames == []
        finally:
            link.close()

    def a_client_hello() -> fr.Frame | None:
        link = RawLink.open(address.host, address.bin_port)
        try:
            link.send(fr.Hello(fr.PROTOCOL_VERSION, "client-1", None, 0, "client"))
            return link.next()
        finally:
            link.close()

    try:
        await until(
            lambda: node.binary_port.handshaking == bound, "the silent connections accepted"
        )
        elapsed, nothing_sent = await asyncio.to_thread(one_more)
        assert elapsed < AT_ONCE_S, f"closed after {elapsed:.1f} s"
        assert nothing_sent
        assert node.binary_port.handshaking == bound, "the others still wait for their handshake"
        for sock in silent:
            sock.close()
        await until(lambda: node.binary_port.handshaking == 0, "the silent connections gone")
        assert isinstance(await asyncio.to_thread(a_client_hello), fr.HelloOk)
    finally:
        for sock in silent:
            sock.close()
        await node.stop()


def test_node_ids_are_short_and_printable() -> None:
    good = NodeAddr("a", "127.0.0.1", 1, 2)
    for bad in ("x" * (limits.node_id_bytes_max + 1), "a\nb", ""):
        with pytest.raises(InvalidRequest, match="bad node id"):
            Topology(
                1,
                {"a": good, bad: NodeAddr(bad, "127.0.0.1", 3, 4)},
                {0: ShardChain(0, ("a", bad))},
            )
    longest = "n" * limits.node_id_bytes_max
    Topology(1, {longest: NodeAddr(longest, "127.0.0.1", 1, 2)}, {0: ShardChain(0, (longest,))})


# --- 3: topology hosts are resolved off the commit pool, once -----------------------------------


class RecordingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1, "recording")
        self.calls: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(getattr(fn, "__name__", repr(fn)))
        return super().submit(fn, *args, **kwargs)


@pytest.mark.asyncio
async def test_hellos_resolve_topology_hosts_once_and_never_in_the_default_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HELLOs claiming a node whose host is a name: the name is looked up once (later HELLOs use
    what was kept), and never in the default executor, whose threads run the node's commits."""
    topology = Topology(
        1,
        {"a": NodeAddr("a", "127.0.0.1", 1, 2), "b": NodeAddr("b", "localhost", 3, 4)},
        {0: ShardChain(0, ("a", "b"))},
        TEST_IDENTITY,
    )
    lookups: list[str] = []
    real_resolve = handshake.resolve_host

    def counted(host: str) -> frozenset[str]:
        lookups.append(host)
        return real_resolve(host)

    monkeypatch.setattr(handshake, "resolve_host", counted)
    default = RecordingExecutor()
    asyncio.get_running_loop().set_default_executor(default)
    hosts = HostAddresses()
    stream: Any = None  # never reached: the address check refuses first
    try:
        for _ in range(5):
            with pytest.raises(WrongPeerError):
                await accept_peer(
                    stream,
                    link_hello("b", 0, 1, "tail"),
                    topology=topology,
                    node_id="a",
                    peer_ip="192.0.2.7",
                    hosts=hosts,
                )
        assert default.calls == []
        assert lookups == ["localhost"]
        assert "127.0.0.1" in await hosts.addresses("localhost")
    finally:
        hosts.close()


# --- 5: a client at the in-flight bound is not taken for silent ---------------------------------


@pytest.mark.asyncio
async def test_a_client_past_the_in_flight_bound_is_not_closed_as_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client sends more requests than the connection's in-flight bound; the node stops reading
    until parked WAIT_COMMITTEDs answer (after longer than the silence bound). The client answers
    every PING it gets, but the node is not reading them: that is the node's own back-pressure,
    not the client's silence, so the connection stays and every request is answered."""
    in_flight = 8
    monkeypatch.setattr(limits, "connection_in_flight_requests_max", in_flight)
    wait_ms = int((SILENCE_S + SLACK_S) * 1000)
    topology = one_shard_topology(["a"])
    node = _node(topology, "a", tmp_path)
    await node.start()
    address = topology.nodes["a"]
    far = 10**9  # a seq the shard will not commit: each wait parks for its timeout

    def client() -> tuple[dict[int, fr.Frame], bool]:
        link = RawLink.open(address.host, address.bin_port)
        try:
            link.send(fr.Hello(fr.PROTOCOL_VERSION, "client-1", None, 0, "client"))
            assert isinstance(link.next(), fr.HelloOk)
            waits = [fr.WaitCommitted(i, 0, far, wait_ms) for i in range(in_flight)]
            produce = fr.Produce(in_flight, "q", (b"k",), (b"v",), None, None, 1, False)
            link.send(*waits, produce)
            replies: dict[int, fr.Frame] = {}
            while len(replies) < in_flight + 1:
                frame = link.next()
                if frame is None:
                    break
                if isinstance(frame, fr.Ping):
                    link.send(fr.Pong(frame.nonce))
                elif not isinstance(frame, fr.Pong):
                    replies[frame.request_id] = frame  # type: ignore[attr-defined]
            return replies, link.closed
        finally:
            link.close()

    try:
        replies, closed = await asyncio.to_thread(client)
        assert not closed, "the node closed a live client"
        assert sorted(replies) == list(range(in_flight + 1))
        assert all(isinstance(replies[i], fr.CommittedReply) for i in range(in_flight))
        assert isinstance(replies[in_flight], fr.Produced)
    finally:
        await node.stop()
