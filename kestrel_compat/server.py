"""The asyncio server of the Kestrel front: the only socket code in the package.

One process listens for up to three protocols on one ``KestrelService``, so all of them see the
same queues, as in Kestrel: memcache (``server.port``, 22133), text (``server.text_port``, 2222)
and thrift (``server.thrift_port``, 2229); a ``Front`` pairs each port with its sans-IO codec and
its session class. Every connection is served the same way, whatever its protocol.

Each connection is an ``asyncio.BufferedProtocol`` (``_Connection``). What the socket delivers
goes to the front's sans-IO codec (``MemcacheConnection``, ``TextConnection``,
``ThriftConnection``), and the decoded events are served one at a time through the front's
session, in the same callback, as long as none of them waits; the replies to one read go out in
one write. A request that waits (a blocked fetch, an append the backend has not confirmed) goes
on as a task and the events behind it queue, at most ``limits.pending_requests_max`` of them
(then the connection stops reading: back-pressure). Writes wait for the transport to drain past
``limits.write_buffer_bytes_max``. When the client closes its side, events already received are
still served, but a fetch that would wait gives up without taking an item; when the last one is
served, the session settles its open reads (memcache and text abort them; thrift leaves them to
their auto-abort timers) and the socket closes.

``KestrelServer.stop`` is graceful: stop listening, close every queue (blocked fetches answer
``END``), close the connections, then let the backend take the last group commits.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import AddressInUseError
from kayos.ports import address_in_use, check_free
from kestrel_compat import limits
from kestrel_compat.backends.memory import MemoryBackend
from kestrel_compat.core.config import KestrelConfig
from kestrel_compat.core.persistence import Backend
from kestrel_compat.eager import start_eagerly
from kestrel_compat.sessions.memcache_session import Session
from kestrel_compat.sessions.service import KestrelService
from kestrel_compat.sessions.session_base import ClientGone
from kestrel_compat.sessions.text_session import TextSession
from kestrel_compat.sessions.thrift_session import ThriftReads, ThriftSession
from kestrel_compat.wire.memcache_codec import MemcacheConnection
from kestrel_compat.wire.text_codec import TextConnection
from kestrel_compat.wire.thrift_codec import ThriftConnection

log = logging.getLogger("kestrel_compat.server")

EventT = TypeVar("EventT")
EventT_co = TypeVar("EventT_co", covariant=True)
EventT_contra = TypeVar("EventT_contra", contravariant=True)
Send = Callable[[bytes], Awaitable[None]]


class Codec(Protocol[EventT_co]):
    """A sans-IO server codec: bytes in, events out; closed after a closing event."""

    @property
    def closed(self) -> bool: ...

    def receive_data(self, data: bytes) -> Sequence[EventT_co]: ...


class ProtocolSession(Protocol[EventT_contra]):
    """One connection's session: serves events in order, writes replies through ``send``."""

    async def handle(self, event: EventT_contra, send: Send) -> bool: ...

    def client_left(self) -> None: ...

    def finish(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Front(Generic[EventT]):
    """One protocol the server listens for: its port, codec and session per connection."""

    name: str
    port: int
    codec: Callable[[], Codec[EventT]]
    session: Callable[[KestrelService], ProtocolSession[EventT]]


# The flag of ``kayos kestrel`` that moves each front's port, for the error about a taken one.
PORT_FLAGS = {"memcache": "--port", "text": "--text-port", "thrift": "--thrift-port"}


def port_in_use(host: str, front: str, port: int) -> AddressInUseError:
    """The one-line error for a front whose port is taken, naming the flag that moves it."""
    flag = PORT_FLAGS.get(front, "--port")
    return address_in_use(host, port, f"kestrel {front} port", f"pass another {flag}")


def check_ports(config: KestrelConfig) -> None:
    """``AddressInUseError`` if a front's configured port is taken now: checked before the front
    connects to a cluster, so it fails at once and contacts no one (``start`` checks again)."""
    server = config.server
    fronts = (("memcache", server.port), ("text", server.text_port), ("thrift", server.thrift_port))
    for front, port in fronts:
        if port:  # None: not served; 0: any free port
            try:
                check_free(server.host, port, what=f"kestrel {front} port", hint="")
            except AddressInUseError:
                raise port_in_use(server.host, front, port) from None


class KestrelServer:
    def __init__(
        self,
        config: KestrelConfig,
        *,
        backend: Backend | None = None,
        clock: Clock = SYSTEM_CLOCK,
        config_path: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.config = config
        # Every front's port inside TLS when given (``kayos kestrel --tls-cert``); plain otherwise.
        self.tls = tls
        self.service = KestrelService(
            config,
            backend if backend is not None else MemoryBackend(),
            clock,
            config_path=config_path,
            on_shutdown=self.request_stop,
        )
        self.thrift_reads = ThriftReads()
        self.fronts = self._fronts()
        self._servers: dict[str, asyncio.Server] = {}
        self.connections: set[_Connection[Any]] = set()
        self._stop_requested = asyncio.Event()
        self.stopped = False
        self._sweeper: asyncio.Task[None] | None = None

    def _fronts(self) -> list[Front[Any]]:
        server = self.config.server
        fronts: list[Front[Any]] = [Front("memcache", server.port, MemcacheConnection, Session)]
        if server.text_port is not None:
            fronts.append(Front("text", server.text_port, TextConnection, TextSession))
        if server.thrift_port is not None:
            fronts.append(
                Front("thrift", server.thrift_port, ThriftConnection, self._thrift_session)
            )
        return fronts

    def _thrift_session(self, service: KestrelService) -> ThriftSession:
        return ThriftSession(service, self.thrift_reads)

    @property
    def port(self) -> int:
        """The memcache port."""
        return self.port_of("memcache")

    def port_of(self, front: str) -> int:
        """The port a front listens on (the real one when configured as 0)."""
        listener = self._servers.get(front)
        assert listener is not None, f"the {front} front is not started"
        assert listener.sockets, "the server is not listening"
        return int(listener.sockets[0].getsockname()[1])

    async def start(self) -> None:
        await self.service.start()
        server = self.config.server
        for front in self.fronts:
            try:
                self._servers[front.name] = await asyncio.get_running_loop().create_server(
                    self._connection_factory(front),
                    host=server.host,
                    port=front.port,
                    reuse_address=True,
                    ssl=self.tls,
                )
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                for listener in self._servers.values():
                    listener.close()
                raise port_in_use(server.host, front.name, front.port) from None
            log.info(
                "kestrel %s front listening on %s:%d",
                front.name,
                server.host,
                self.port_of(front.name),
            )
        if server.expiration_timer_frequency_ms is not None:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(server.expiration_timer_frequency_ms / 1000), name="kestrel-sweeper"
            )

    def request_stop(self, delay_s: float = limits.shutdown_delay_ms / 1000) -> None:
        """Stop soon (``shutdown`` stops ~100 ms later, spec §2); safe from any callback."""
        asyncio.get_running_loop().call_later(delay_s, self._stop_requested.set)

    async def serve_until_stopped(self) -> None:
        await self._stop_requested.wait()
        await self.stop()

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._stop_requested.set()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for listener in self._servers.values():
            listener.close()
        self.service.collection.shutdown()
        self.thrift_reads.cancel_timers()
        connections = list(self.connections)
        for connection in connections:
            connection.close()
        if connections:
            finished = {connection.finished: connection for connection in connections}
            _, pending = await asyncio.wait(finished, timeout=limits.shutdown_grace_ms / 1000)
            for future in pending:
                finished[future].abort()
            if pending:
                await asyncio.wait(pending, timeout=limits.shutdown_grace_ms / 1000)
        for listener in self._servers.values():
            await listener.wait_closed()
        await self.service.close()

    async def _sweep(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.service.sweep()

    # --- connections ---

    def _connection_factory(self, front: Front[EventT]) -> Callable[[], _Connection[EventT]]:
        def make() -> _Connection[EventT]:
            return _Connection(self, front)

        return make


class _Ended:
    """The client is gone (EOF, idle, a lost connection): serve what came before, then close."""


_ENDED = _Ended()


class _Connection(asyncio.BufferedProtocol, Generic[EventT]):
    """One connection of any front: socket bytes into the codec, its events served in order by
    the session, the replies written back.

    Requests are served in ``data_received`` itself (``buffer_updated``) as long as they finish
    without waiting (``kestrel_compat.eager``), and the replies of everything one read delivered
    go out in one write. A request that waits becomes a task; the requests behind it wait in
    ``_events`` and are served when it ends, so a connection still serves one request at a time.
    While a request waits its replies are written as they come (MONITOR streams items).
    """

    def __init__(self, server: KestrelServer, front: Front[EventT]) -> None:
        self._server = server
        self._front = front
        self._loop = asyncio.get_running_loop()
        self._stats = server.service.collection.stats
        self._codec = front.codec()
        self._session: ProtocolSession[EventT] | None = None
        self._transport: asyncio.Transport | None = None
        self._read_buffer = memoryview(bytearray(limits.read_chunk_bytes))
        self._events: deque[EventT | _Ended] = deque()
        self._request: asyncio.Task[bool] | None = None  # The request that waits, if any.
        self._replies: list[bytes] = []  # Written at the end of the batch being served.
        self._replies_bytes = 0
        self._batching = False
        self._reading = _Reading.ON
        self._left = False
        self._lost = False
        self._done = False
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        timeout_ms = server.config.server.client_timeout_ms
        self._idle_s = None if timeout_ms is None else timeout_ms / 1000
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_read_s = 0.0
        self.finished: asyncio.Future[None] = self._loop.create_future()

    # --- asyncio.BufferedProtocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._server.stopped:
            self._done = True
            self.finished.set_result(None)
            transport.close()
            return
        self._server.connections.add(self)
        transport.set_write_buffer_limits(high=limits.write_buffer_bytes_max)
        self._session = self._front.session(self._server.service)
        if self._idle_s is not None:
            self._last_read_s = self._loop.time()
            self._idle_timer = self._loop.call_later(self._idle_s, self._check_idle)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._done or self._reading is not _Reading.ON:
            return
        self._stats.bytes_read += nbytes
        if self._idle_s is not None:
            self._last_read_s = self._loop.time()
        self._events.extend(self._codec.receive_data(bytes(self._read_buffer[:nbytes])))
        if self._codec.closed:
            self._stop_reading(_Reading.ENDED)
        elif len(self._events) >= limits.pending_requests_max:
            self._stop_reading(_Reading.PAUSED)  # Back-pressure until the session catches up.
        self._serve()

    def eof_received(self) -> bool:
        self._client_left()
        self._serve()
        return True  # Keep the transport open: the replies to what was sent still go out.

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("connection lost: %s", exc)
        self._lost = True
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_exception(ConnectionResetError("Connection lost"))
        self._client_left()
        self._serve()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    # --- reading ---

    def _stop_reading(self, reading: _Reading) -> None:
        if self._reading is _Reading.ON and self._transport is not None and not self._lost:
            self._transport.pause_reading()
        if self._reading is not _Reading.ENDED:
            self._reading = reading

    def _resume_reading(self) -> None:
        if self._reading is _Reading.PAUSED and len(self._events) < limits.pending_requests_max:
            self._reading = _Reading.ON
            self._last_read_s = self._loop.time()
            assert self._transport is not None
            if not self._lost:
                self._transport.resume_reading()

    def _client_left(self) -> None:
        """EOF, an idle timeout or a lost connection: nothing more will be read."""
        if self._left or self._done or self._session is None:
            return
        self._left = True
        codec_closed = self._reading is _Reading.ENDED
        self._stop_reading(_Reading.ENDED)
        if not codec_closed:
            # A closing event already ends the events; otherwise the session learns the client
            # left (a fetch that would wait gives up) and the connection ends after what it sent.
            self._session.client_left()
            self._events.append(_ENDED)

    def _check_idle(self) -> None:
        self._idle_timer = None
        if self._done or self._left or self._idle_s is None:
            return
        now_s = self._loop.time()
        if self._reading is _Reading.PAUSED:
            self._last_read_s = now_s  # Not waiting for the client but for the session.
        due_s = self._last_read_s + self._idle_s
        if now_s < due_s:
            self._idle_timer = self._loop.call_later(due_s - now_s, self._check_idle)
            return
        log.debug("closing an idle connection")
        self._client_left()
        self._serve()

    # --- serving ---

    def _serve(self) -> None:
        """Serve queued events until one waits (it becomes a task) or the connection ends."""
        if self._request is not None or self._done:
            return
        session = self._session
        assert session is not None
        self._batching = True
        try:
            while self._events:
                event = self._events.popleft()
                if isinstance(event, _Ended):
                    self._finish()
                    return
                try:
                    started = start_eagerly(
                        session.handle(event, self._send), name="kestrel-request", loop=self._loop
                    )
                except Exception as error:  # Any failure ends this connection.
                    self._failed(error)
                    return
                if isinstance(started, asyncio.Task):
                    self._request = started
                    started.add_done_callback(self._request_done)
                    return
                if started.value:
                    self._finish()
                    return
        finally:
            self._batching = False
            self._flush()
            if not self._done:
                self._resume_reading()

    def _request_done(self, task: asyncio.Task[bool]) -> None:
        self._request = None
        if task.cancelled():
            self._finish()
            return
        error = task.exception()
        if error is not None:
            self._failed(error)
        elif task.result():
            self._finish()
        else:
            self._serve()

    def _failed(self, error: BaseException) -> None:
        if isinstance(error, ClientGone):
            pass
        elif isinstance(error, OSError):
            log.debug("connection write failed: %s", error)
        else:
            log.error("request failed", exc_info=error)
        self._finish()

    def abort(self) -> None:
        """Stop: the waiting request is cancelled, the connection ends."""
        if self._request is not None:
            self._request.cancel()
        else:
            self._finish()

    def close(self) -> None:
        """Stop: close the socket; the session sees the client leave."""
        if self._transport is not None:
            self._transport.close()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self._stop_reading(_Reading.ENDED)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._flush()
        try:
            assert self._session is not None
            self._session.finish()
        finally:
            self._server.connections.discard(self)
            assert self._transport is not None
            self._transport.close()
            self.finished.set_result(None)

    # --- writing ---

    async def _send(self, data: bytes) -> None:
        if self._lost:
            raise ConnectionResetError("Connection lost")
        self._stats.bytes_written += len(data)
        if self._batching:
            self._replies.append(data)
            self._replies_bytes += len(data)
            if self._replies_bytes < limits.write_buffer_bytes_max:
                return
            self._flush()
        else:
            assert self._transport is not None
            self._transport.write(data)
        if self._writing_paused:
            # Wait for the client to read its replies, as StreamWriter.drain does.
            if self._drained is None or self._drained.done():
                self._drained = self._loop.create_future()
            await self._drained

    def _flush(self) -> None:
        replies = self._replies
        if not replies:
            return
        self._replies = []
        self._replies_bytes = 0
        if self._lost:
            return
        assert self._transport is not None
        self._transport.write(replies[0] if len(replies) == 1 else b"".join(replies))


class _Reading(enum.Enum):
    ON = "on"
    PAUSED = "paused"  # Back-pressure: too many requests queued.
    ENDED = "ended"  # The codec closed or the client left: nothing more is read.


async def run_server(
    config: KestrelConfig,
    *,
    config_path: str | None = None,
    backend: Backend | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Start, serve until ``shutdown`` or ``stop``, and stop gracefully."""
    server = KestrelServer(config, backend=backend, config_path=config_path)
    await server.start()
    if ready is not None:
        ready.set()
    try:
        await server.serve_until_stopped()
    finally:
        await server.stop()
