"""A node's binary port (docs/node-api.md, "Binary port"; docs/replication-protocol.md): the
face clients' PRODUCE and WAIT_COMMITTED and the replication links come in through.

``BinaryPort`` accepts a connection, bounds and times its handshake (HELLO, and the cluster
secret's proof for a replication link), then serves a client's requests by calling ``Node``'s
operations, or hands a link to ``serve_downstream``. It holds no logic of its own beyond the
framing; ``kayos.node.runtime.Node`` starts and closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
from collections.abc import Sequence
from typing import Protocol

from kayos import limits
from kayos.auth.keys import CLUSTER_PRINCIPAL
from kayos.auth.rules import Verdict, binary_rule
from kayos.clock import Clock
from kayos.errors import KayosError, ProtocolError, UnavailableError, WrongRoleError
from kayos.node.access import Access, certificate_subject, refusal_error
from kayos.node.replicas.learners import Learner
from kayos.node.reports import SuspectReports
from kayos.replication.link.downstream import serve_downstream
from kayos.replication.link.handshake import HostAddresses, accept_peer, shown
from kayos.replication.link.liveness import keep_alive
from kayos.replication.link.stream import FrameStream, error_frame
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import frames as fr
from kayos.replication.wire.frames import PROTOCOL_VERSION
from kayos.tlsconfig import HandshakeLog, MemberTls
from kayos.topology import NodeAddr, Topology

log = logging.getLogger("kayos.node")


class Node(Protocol):
    """What the port uses of ``kayos.node.runtime.Node`` (which imports this module)."""

    node_id: str
    address: NodeAddr
    clock: Clock
    topology: Topology
    hosts: HostAddresses
    replicas: dict[int, ShardReplica]
    learners: dict[int, Learner]
    reports: SuspectReports
    access: Access
    tls: MemberTls | None

    @property
    def epoch(self) -> int: ...

    async def produce(
        self,
        queue: str,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        expiries_ms: Sequence[int] | None,
        headers: Sequence[dict[str, bytes] | None] | None,
        *,
        acks: int,
        producer_id: bytes | None = None,
        producer_seq: int = 0,
    ) -> tuple[int, int]: ...

    async def wait_committed(self, shard: int, seq: int, timeout_ms: int) -> int: ...


class BinaryPort:
    """The node's binary port: its listening server and the connections it serves."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.server: asyncio.Server | None = None
        # Connections not yet past their handshake (limits.handshake_connections_max), and how
        # many were closed at the bound since the count was last zero.
        self.handshaking = 0
        self.handshakes_refused = 0
        # The credential each client connection proved (None: the cluster ran open then).
        self.credential: dict[FrameStream, str | None] = {}
        self.tls_refusals = HandshakeLog()

    async def start(self, bin_listener: socket.socket | None) -> None:
        """Serves on ``bin_listener`` if given (bound, not yet listening), else on a socket bound
        here at the node's topology address."""
        if bin_listener is not None:
            self.server = await asyncio.start_server(
                self._on_connection, sock=bin_listener, limit=2**20
            )
        else:
            address = self.node.address
            self.server = await asyncio.start_server(
                self._on_connection, address.host, address.bin_port, limit=2**20
            )

    async def _start_tls(self, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> bool:
        """The TLS handshake of a new connection, done here rather than by the server so that a
        refused one (plain TCP, a foreign or expired certificate, no client certificate under
        mutual TLS) is logged with its reason; False when refused (the connection is closed)."""
        peer = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(limits.tls_handshake_ms_max / 1000):
                await writer.start_tls(context)
        except (OSError, ssl.SSLError, TimeoutError, EOFError, ConnectionError) as exc:
            self.tls_refusals.refused_from(str(peer[0] if peer else "?"), exc)
            writer.transport.abort()
            return False
        return True

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        tls = self.node.tls
        if tls is None or await self._start_tls(writer, tls.server):
            await self._serve_connection(reader, writer)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        stream = FrameStream(
            reader, writer, self.node.clock, frame_bytes_max=limits.handshake_frame_bytes_max
        )
        pinger: asyncio.Task[None] | None = None
        hello: fr.Hello | None = None
        if self.handshaking >= limits.handshake_connections_max:
            # Closed at once, logged once per burst: the bound exists for floods.
            if not self.handshakes_refused:
                log.warning(
                    "%d connections in their handshake (handshake_connections_max): closing "
                    "new ones at once",
                    self.handshaking,
                )
            self.handshakes_refused += 1
            stream.close()
            return
        try:
            self.handshaking += 1
            try:
                async with asyncio.timeout(limits.handshake_ms_max / 1000):
                    hello = await self._handshake(stream, writer)
            except TimeoutError:
                log.info(
                    "closed the connection from %s: no complete handshake within %d ms",
                    writer.get_extra_info("peername"),
                    limits.handshake_ms_max,
                )
                return
            finally:
                self.handshaking -= 1
                if not self.handshaking:
                    self.handshakes_refused = 0
            if hello is None:
                return
            stream.lift_frame_bound()
            pinger = asyncio.create_task(
                keep_alive(
                    stream, self.node.clock, f"{hello.role} connection from {shown(hello.node_id)}"
                )
            )
            if hello.role == "client":
                # The lower of both versions: the client's frames are decoded, and ours encoded,
                # at it (a version 6 client's PRODUCE has no producer fields).
                version = min(PROTOCOL_VERSION, hello.protocol_version)
                stream.use_protocol_version(version)
                stream.send(fr.HelloOk(version, self.node.node_id, self.node.epoch))
                await self._serve_client(stream)
                return
            replica = self.node.replicas.get(hello.shard) if hello.shard is not None else None
            if replica is None and hello.role == "repair" and hello.shard in self.node.learners:
                # A head with no downstream repairs from a learner (docs/replication-protocol.md,
                # "A damaged head repairs first").
                replica = self.node.learners[hello.shard].replica
            if replica is None:
                raise WrongRoleError(
                    f"{self.node.node_id} holds no replica of shard {hello.shard}",
                    redirect=None,
                    epoch=self.node.epoch,
                )
            await serve_downstream(replica, stream, hello)
        except KayosError as exc:
            with contextlib.suppress(Exception):
                stream.send(error_frame(exc, None, self.node.epoch))
                await stream.drain()
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            if hello is not None and hello.role in ("middle", "tail"):
                # A chain neighbour's link below this node was reset or ended: the manager hears.
                self.node.reports.peer_lost(hello.node_id, exc)
        except asyncio.CancelledError:
            # Shutdown cancels connection handlers; asyncio's stream callback would log it as an
            # error, so a handler ends quietly instead of re-raising.
            pass
        finally:
            self.credential.pop(stream, None)
            if pinger is not None:
                pinger.cancel()
            stream.close()

    async def _handshake(
        self, stream: FrameStream, writer: asyncio.StreamWriter
    ) -> fr.Hello | None:
        """Reads HELLO and checks it; a replication link must also prove the cluster secret
        (docs/replication-protocol.md, "Handshake"). Raises the refusal."""
        hello = await stream.recv()
        if hello is None:
            return None
        if not isinstance(hello, fr.Hello):
            raise ProtocolError(f"expected HELLO, got {type(hello).__name__}")
        if hello.epoch and hello.epoch < self.node.epoch:
            raise WrongRoleError(
                f"epoch {hello.epoch} is older than {self.node.epoch}",
                redirect=None,
                epoch=self.node.epoch,
            )
        if hello.epoch > self.node.epoch:
            raise UnavailableError(f"epoch {hello.epoch} is newer than {self.node.epoch}")
        if hello.role == "client":
            await self._client_credential(stream, hello, writer)
            return hello
        if hello.shard is None:
            raise ProtocolError(f"a {hello.role} HELLO names no shard")
        if hello.protocol_version < fr.LINK_PROTOCOL_VERSION_MIN:
            raise ProtocolError(
                f"replication links need protocol version {fr.LINK_PROTOCOL_VERSION_MIN}; "
                f"{hello.node_id} speaks {hello.protocol_version}"
            )
        peer = writer.get_extra_info("peername")
        peer_ip = str(peer[0]) if peer else ""
        await accept_peer(
            stream,
            hello,
            topology=self.node.topology,
            node_id=self.node.node_id,
            peer_ip=peer_ip,
            hosts=self.node.hosts,
        )
        return hello

    async def _client_credential(
        self, stream: FrameStream, hello: fr.Hello, writer: asyncio.StreamWriter
    ) -> None:
        """A node holding client credentials has the client prove one (AUTH_CHALLENGE, then
        CLIENT_PROOF: docs/replication-protocol.md, "Handshake"); the name it proved is kept for
        the connection's requests. Raises ``Unauthenticated`` (counted and logged)."""
        access = self.node.access
        self.credential[stream] = None
        if access.table.is_open:
            return
        peer = writer.get_extra_info("peername")
        by_certificate = access.table.by_certificate(
            certificate_subject(writer.get_extra_info("peercert")) or ""
        )
        if by_certificate is not None:  # a TLS client certificate stands in for a proof
            self.credential[stream] = by_certificate.name
            return
        identity = self.node.topology.identity
        if hello.protocol_version < fr.CLIENT_PROOF_PROTOCOL_VERSION_MIN or identity is None:
            verdict = Verdict(401, "missing")
            access.refused(verdict, "binary HELLO", peer)
            raise refusal_error(verdict)
        server_nonce = secrets.token_bytes(limits.auth_nonce_bytes)
        stream.send(fr.AuthChallenge(identity.cluster_uuid, server_nonce))
        answer = await stream.recv()
        if not isinstance(answer, fr.ClientProof):
            raise ProtocolError("a challenged client answers CLIENT_PROOF")
        who, reason = access.check_binary_proof(
            server_nonce, answer.nonce, answer.name, answer.proof, identity.cluster_uuid
        )
        if who is None:
            verdict = Verdict(401, reason)
            access.refused(verdict, "binary CLIENT_PROOF", peer)
            raise refusal_error(verdict)
        self.credential[stream] = answer.name

    def _refusal(
        self, stream: FrameStream, frame: fr.Produce | fr.WaitCommitted
    ) -> fr.Frame | None:
        """The ERROR a request gets when its connection's credential may not make it, or None."""
        access = self.node.access
        if access.table.is_open:
            return None
        name = self.credential.get(stream)
        who = (
            None
            if name is None
            else name
            if name == CLUSTER_PRINCIPAL
            else access.table.credentials.get(name)
        )
        if isinstance(frame, fr.Produce):
            rule, queue, what = binary_rule("PRODUCE"), frame.queue, f"PRODUCE {frame.queue}"
        else:
            rule, queue, what = binary_rule("WAIT_COMMITTED"), None, "WAIT_COMMITTED"
        verdict = access.check_binary(who, rule, queue, what, name)
        if verdict.allowed:
            return None
        return error_frame(refusal_error(verdict), frame.request_id, self.node.epoch)

    async def _serve_client(self, stream: FrameStream) -> None:
        slots = asyncio.Semaphore(limits.connection_in_flight_requests_max)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                frame = await stream.recv()
                if frame is None:
                    return
                if isinstance(frame, fr.Produce | fr.WaitCommitted):
                    refusal = self._refusal(stream, frame)
                    if refusal is not None:  # refused before anything is read or written
                        stream.send(refusal)
                        continue
                    await slots.acquire()
                    task = asyncio.create_task(self._client_request(stream, frame))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    task.add_done_callback(lambda _: slots.release())
                elif isinstance(frame, fr.Ping):
                    stream.send(fr.Pong(frame.nonce))
                elif isinstance(frame, fr.Pong):
                    pass  # the answer to this node's own PING; recv() noted that the peer lives
                else:
                    raise ProtocolError(f"{type(frame).__name__} is not a client request")
        finally:
            for task in tasks:
                task.cancel()

    async def _client_request(
        self, stream: FrameStream, frame: fr.Produce | fr.WaitCommitted
    ) -> None:
        try:
            reply: fr.Frame
            if isinstance(frame, fr.Produce):
                first, last = await self.node.produce(
                    frame.queue,
                    frame.keys,
                    frame.values,
                    frame.expiries_ms,
                    frame.headers,
                    acks=frame.acks,
                    producer_id=frame.producer_id,
                    producer_seq=frame.producer_seq,
                )
                reply = fr.Produced(frame.request_id, first, last)
            else:
                committed = await self.node.wait_committed(frame.shard, frame.seq, frame.timeout_ms)
                reply = fr.CommittedReply(frame.request_id, frame.shard, committed)
        except KayosError as exc:
            reply = error_frame(exc, frame.request_id, self.node.epoch)
        except Exception as exc:  # the node stays up; the client learns the request failed
            log.exception("request %s failed", frame.request_id)
            reply = fr.ErrorFrame(
                frame.request_id, "kayos_error", repr(exc)[:500], None, self.node.epoch
            )
        with contextlib.suppress(Exception):
            stream.send(reply)
            await stream.drain()
