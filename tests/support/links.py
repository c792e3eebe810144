"""Raw-socket replication handshakes for tests: what a genuine member sends (the right identity),
an impostor (no secret, another cluster's, a lie about its node id), and what came back.

Blocking sockets with a bounded timeout, so both async unit tests (in a thread) and the
process-level integration tests use them the same way. Also: a one-shard topology on loopback,
a bounded async wait (``until``), and a link sender's replica and stream faked around a real store.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kayos import limits
from kayos.clock import ManualClock
from kayos.identity import ClusterIdentity
from kayos.local.ports import free_ports
from kayos.replication.link.stream import Pulse
from kayos.replication.logic import chain
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from kayos.topology import NodeAddr, ShardChain, Topology

# A fixed identity for in-process tests (never a real cluster's).
TEST_IDENTITY = ClusterIdentity("00000000-0000-4000-8000-000000000001", bytes(range(1, 33)))
READ_TIMEOUT_S = 30.0


@dataclass
class RawLink:
    """One blocking connection speaking frames; ``frames`` holds everything decoded so far."""

    sock: socket.socket
    decoder: fr.FrameDecoder = field(default_factory=fr.FrameDecoder)
    frames: list[fr.Frame] = field(default_factory=list)
    closed: bool = False

    @classmethod
    def open(cls, host: str, port: int, *, source: str | None = None) -> RawLink:
        sock = socket.create_connection(
            (host, port), timeout=READ_TIMEOUT_S, source_address=(source, 0) if source else None
        )
        return cls(sock)

    def send(self, *frames: fr.Frame) -> None:
        self.sock.sendall(b"".join(fr.encode(frame) for frame in frames))

    def next(self) -> fr.Frame | None:
        """The next frame, or None once the peer closed the connection."""
        while not self.frames:
            if self.closed:
                return None
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return None
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    def wait_closed(self) -> None:
        """Reads (and drops) frames until the peer closes; a timeout fails the caller."""
        while self.next() is not None:
            pass

    def close(self) -> None:
        self.sock.close()


def link_hello(node: str, shard: int, epoch: int, role: str) -> fr.Hello:
    return fr.Hello(fr.PROTOCOL_VERSION, node, shard, epoch, role)


def answer_challenge(
    link: RawLink,
    identity: ClusterIdentity,
    claim: auth.LinkClaim,
    *,
    cluster_uuid: bytes | None = None,
) -> fr.Frame | None:
    """Reads the AUTH_CHALLENGE, answers it as ``identity`` would (claiming ``cluster_uuid``,
    by default the identity's own), and returns the acceptor's next frame."""
    challenge = link.next()
    assert isinstance(challenge, fr.AuthChallenge), challenge
    nonce = secrets.token_bytes(limits.auth_nonce_bytes)
    mac = auth.proof(identity, auth.CONNECTOR_PROVES, claim, challenge.nonce, nonce)
    link.send(fr.AuthProof(cluster_uuid or identity.cluster_uuid, nonce, mac))
    return link.next()


def one_shard_topology(ids: list[str], host: str = "127.0.0.1") -> Topology:
    """Nodes ``ids`` on free ports, one shard whose chain is ``ids`` in order, the test identity:
    an in-process chain for link tests."""
    ports = free_ports(2 * len(ids))
    nodes = {
        node: NodeAddr(node, host, ports[i], ports[len(ids) + i]) for i, node in enumerate(ids)
    }
    return Topology(1, nodes, {0: ShardChain(0, tuple(ids), ())}, TEST_IDENTITY)


async def until(condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Polls ``condition`` on the running loop until it is truthy (returned), failing after
    ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)  # a bounded poll of a condition


async def first_answer(address: NodeAddr, hello: fr.Hello, timeout_s: float = 30.0) -> fr.Frame:
    """The first frame node ``address`` answers a raw ``hello`` with (a refusal, in the version
    tests), read within ``timeout_s``."""
    reader, writer = await asyncio.open_connection(address.host, address.bin_port)
    try:
        writer.write(fr.encode(hello))
        decoder = fr.FrameDecoder()
        frames: list[fr.Frame] = []
        while not frames:
            data = await asyncio.wait_for(reader.read(65536), timeout_s)
            assert data, "closed without an answer"
            frames.extend(decoder.feed(data))
        return frames[0]
    finally:
        writer.close()


class RecordingStream:
    """A link's stream that keeps what is sent (the sender's side only)."""

    def __init__(self) -> None:
        self.sent: list[fr.Batch] = []

    def send(self, frame: fr.Batch) -> int:
        self.sent.append(frame)
        return 100

    async def drain(self) -> None:
        return None


class SenderReplica:
    """What a link sender reads of its replica: a real store, whose last commit is also
    remembered as a ready batch (the memory a live link forwards from)."""

    shard_id = 0

    def __init__(self, store: ShardStore, remembered: fr.Batch) -> None:
        self.store = store
        self.clock = ManualClock()
        self.changed = Pulse()
        self.progress = chain.Progress(
            has_upstream=False, downstreams=(), durable=store.last_seq, accepted=store.last_seq
        )
        self.durable = store.last_seq
        self._remembered = remembered

    def recent_run(self, first_seq: int) -> list[fr.Batch]:
        return [self._remembered] if first_seq == self._remembered.first_seq else []

    def map_unsettled(self) -> bool:
        return False  # its map is its upstream's: read-back pieces carry it
