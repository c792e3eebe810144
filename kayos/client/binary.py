"""The client side of a node's binary port (docs/node-api.md, "Binary port").

``RequestTable`` is the pure part: request ids and the matching of replies to the requests they
answer (replies may come out of order). ``BinaryConnection`` drives one TCP connection with
asyncio streams: HELLO, then pipelined requests, each a future resolved by the reader task.

A connection that fails (EOF, socket error, bad bytes, a connection-level ERROR) is dead for
good: every request in flight fails with the same error and the client opens a new connection.
Each request in flight remembers what it was sent for (a ``Purpose``), so the router can abandon
those a newer topology moves elsewhere; the connection notes when it last heard its node, so the
router can give up on one that fell silent (docs/node-api.md, "Clients").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

from kayos import limits, tlsconfig
from kayos.client.auth import ClientCredential
from kayos.client.policy import Purpose, error_from_frame
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import (
    KayosError,
    OperationTimeoutError,
    ProtocolError,
    Unauthenticated,
    UnavailableError,
)
from kayos.replication.wire.frames import (
    PROTOCOL_VERSION,
    AuthChallenge,
    CommittedReply,
    ErrorFrame,
    Frame,
    FrameDecoder,
    Hello,
    HelloOk,
    Ping,
    Pong,
    Produced,
    encode,
)

T = TypeVar("T")

# Bytes asked of the socket per read: large enough that a burst of small replies is one read.
_READ_BYTES = 256 * 1024
_REQUEST_ID_MAX = 2**64 - 1


class RequestTable(Generic[T]):
    """Requests awaiting a reply on one connection, by request id.

    Ids count up from 1 and are unique among requests in flight (the protocol's only demand); a
    reply whose id is not in flight (answered already, or abandoned after a local timeout) is
    dropped by the caller."""

    __slots__ = ("_next_id", "_pending")

    def __init__(self) -> None:
        self._next_id = 1
        self._pending: dict[int, T] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, waiter: T) -> int:
        request_id = self._next_id
        while request_id in self._pending:  # only after 2**64 requests wrap around
            request_id = request_id % _REQUEST_ID_MAX + 1
        self._next_id = request_id % _REQUEST_ID_MAX + 1
        self._pending[request_id] = waiter
        return request_id

    def pop(self, request_id: int) -> T | None:
        return self._pending.pop(request_id, None)

    def pop_where(self, predicate: Callable[[T], bool]) -> list[T]:
        """Every waiter ``predicate`` holds for, removed."""
        chosen = [rid for rid, waiter in self._pending.items() if predicate(waiter)]
        return [self._pending.pop(rid) for rid in chosen]

    def drain(self) -> list[T]:
        """Every waiter, removed: the connection died and they all fail."""
        waiters = list(self._pending.values())
        self._pending.clear()
        return waiters


def reply_request_id(frame: Frame) -> int | None:
    """The request a node's frame answers; None for a connection-level ERROR. Any frame a node
    may not send a client after the handshake is a ``ProtocolError``."""
    if isinstance(frame, Produced | CommittedReply):
        return frame.request_id
    if isinstance(frame, ErrorFrame):
        return frame.request_id
    raise ProtocolError(f"a node sent {type(frame).__name__} on a client connection")


class _Waiter(NamedTuple):
    """A request in flight: the future its reply resolves, and what it was sent for."""

    future: asyncio.Future[Frame]
    purpose: Purpose | None


class BinaryConnection:
    """One persistent connection to one node's binary port."""

    def __init__(
        self,
        node: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        decoder: FrameDecoder,
        *,
        in_flight_max: int = limits.client_in_flight_requests_max,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.node = node
        self._reader = reader
        self._writer = writer
        self._decoder = decoder
        self._table: RequestTable[_Waiter] = RequestTable()
        self._slots = asyncio.Semaphore(in_flight_max)
        self._failure: KayosError | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._clock = clock
        self.epoch = 0
        # The version the node's HELLO_OK named: frames go both ways at it (an older node's
        # PRODUCE has no producer fields).
        self.protocol_version = PROTOCOL_VERSION
        # When bytes last came from the node, and when the requests now in flight began waiting
        # (the first of them was sent): a connection silent past both is given up.
        self.last_heard_s = self.busy_since_s = clock.monotonic_s()

    @classmethod
    async def open(
        cls,
        node: str,
        host: str,
        port: int,
        *,
        name: str,
        credential: ClientCredential | None = None,
        timeout_s: float = limits.client_connect_timeout_ms / 1000,
        in_flight_max: int = limits.client_in_flight_requests_max,
        clock: Clock = SYSTEM_CLOCK,
    ) -> BinaryConnection:
        """Connects and handshakes; raises ``UnavailableError`` (``failure="lost"``) if the
        node cannot be reached and the mapped error if it refuses the HELLO."""
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(
                    host, port, **tlsconfig.connect_options(host)
                )
        except (OSError, TimeoutError) as exc:
            raise UnavailableError(
                f"node {node} at {host}:{port}: cannot connect: {exc}", failure="lost"
            ) from exc
        connection = cls(
            node, reader, writer, FrameDecoder(), in_flight_max=in_flight_max, clock=clock
        )
        try:
            async with asyncio.timeout(timeout_s):
                await connection._handshake(name, credential)
        except BaseException as exc:
            connection._abort()
            if isinstance(exc, TimeoutError):
                raise UnavailableError(
                    f"node {node}: no HELLO reply in {timeout_s}s", failure="lost"
                ) from exc
            raise
        connection._reader_task = asyncio.create_task(connection._read_loop())
        return connection

    async def _handshake(self, name: str, credential: ClientCredential | None = None) -> None:
        self._writer.write(encode(Hello(PROTOCOL_VERSION, name, None, 0, "client")))
        frames = await self._next_frames()
        first = frames[0]
        if isinstance(first, AuthChallenge):  # the node holds credentials (docs/security.md)
            if credential is None:
                raise Unauthenticated(
                    f"node {self.node} needs a credential (KAYOS_CREDENTIALS or credentials=)"
                )
            self._writer.write(encode(credential.binary_proof(first.cluster_id, first.nonce)))
            frames = frames[1:] or await self._next_frames()
            first = frames[0]
        if isinstance(first, ErrorFrame):
            raise error_from_frame(first)
        if not isinstance(first, HelloOk):
            raise ProtocolError(f"node {self.node} answered HELLO with {type(first).__name__}")
        self.epoch = first.epoch
        self.protocol_version = min(PROTOCOL_VERSION, first.protocol_version)
        self._decoder.protocol_version = self.protocol_version
        for frame in frames[1:]:  # a node may pipeline after HELLO_OK (a PING, say)
            self._dispatch(frame)

    async def _next_frames(self) -> list[Frame]:
        frames: list[Frame] = []
        while not frames:
            frames = self._decoder.feed(await self._read_some())
        return frames

    async def _read_some(self) -> bytes:
        try:
            data = await self._reader.read(_READ_BYTES)
        except OSError as exc:
            raise UnavailableError(
                f"node {self.node}: connection failed: {exc}", failure="lost"
            ) from exc
        if not data:
            raise UnavailableError(f"node {self.node} closed the connection", failure="lost")
        self.last_heard_s = self._clock.monotonic_s()
        return data

    @property
    def alive(self) -> bool:
        return self._failure is None

    @property
    def in_flight(self) -> int:
        return len(self._table)

    async def request(
        self,
        make_frame: Callable[[int], Frame],
        timeout_s: float,
        purpose: Purpose | None = None,
    ) -> Frame:
        """Sends the frame ``make_frame(request_id)`` and returns the node's reply to it: a
        ``Produced`` or ``CommittedReply``. An ERROR reply is raised as its Kayos error; a dead
        connection as ``UnavailableError``; no reply within ``timeout_s`` as
        ``OperationTimeoutError`` (the request's outcome is unknown). ``purpose``: what it is
        sent for, so that ``abandon`` can give it up."""
        async with self._slots:
            if self._failure is not None:
                raise self._failure
            future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
            if not self._table:
                self.busy_since_s = self._clock.monotonic_s()
            request_id = self._table.add(_Waiter(future, purpose))
            try:
                # encode() refuses an oversized frame with LimitExceeded before anything is sent.
                self._writer.write(encode(make_frame(request_id), self.protocol_version))
                await self._drain()
                async with asyncio.timeout(timeout_s):
                    reply = await future
            except TimeoutError as exc:
                raise OperationTimeoutError(
                    f"node {self.node}: no reply to request {request_id} in {timeout_s}s"
                ) from exc
            finally:
                self._table.pop(request_id)
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()  # retrieved: the caller gets the error raised instead
        if isinstance(reply, ErrorFrame):
            raise error_from_frame(reply)
        return reply

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            self._fail(UnavailableError(f"node {self.node}: send failed: {exc}", failure="lost"))
            assert self._failure is not None
            raise self._failure from exc

    async def _read_loop(self) -> None:
        try:
            while True:
                for frame in self._decoder.feed(await self._read_some()):
                    self._dispatch(frame)
        except KayosError as exc:
            self._fail(exc)
        except asyncio.CancelledError:
            self._fail(UnavailableError(f"connection to node {self.node} closed"))
            raise

    def _dispatch(self, frame: Frame) -> None:
        if isinstance(frame, Ping):
            self._writer.write(encode(Pong(frame.nonce)))
            return
        if isinstance(frame, Pong):
            return
        request_id = reply_request_id(frame)
        if request_id is None:
            assert isinstance(frame, ErrorFrame)
            raise error_from_frame(frame)  # the connection failed: every request fails with it
        waiter = self._table.pop(request_id)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(frame)

    def abandon(
        self, keep: Callable[[Purpose], bool], error_for: Callable[[Purpose], KayosError]
    ) -> int:
        """Fails each request in flight whose purpose ``keep`` refuses with ``error_for`` it (a
        reply that comes for it later is dropped); how many. The connection stays up."""
        waiters = self._table.pop_where(lambda w: w.purpose is not None and not keep(w.purpose))
        for waiter in waiters:
            assert waiter.purpose is not None
            if not waiter.future.done():
                waiter.future.set_exception(error_for(waiter.purpose))
        return len(waiters)

    def _fail(self, error: KayosError) -> None:
        if self._failure is None:
            self._failure = error
        for waiter in self._table.drain():
            if not waiter.future.done():
                waiter.future.set_exception(self._failure)
        self._abort()

    def _abort(self) -> None:
        # At once, unsent bytes dropped: a frozen node reads nothing, and a close that waited
        # for them to leave would wait as long as it stays frozen.
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.transport.abort()

    async def close(self, error: KayosError | None = None) -> None:
        """Closes the connection; its requests in flight fail with ``error`` (by default: the
        client closed it)."""
        self._fail(error or UnavailableError(f"connection to node {self.node} closed"))
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()
