"""The asyncio server of the Kestrel front: the only socket code in the package.

One process listens for up to three protocols on one ``KestrelService``, so all of them see the
same queues, as in Kestrel: memcache (``server.port``, 22133), text (``server.text_port``, 2222)
and thrift (``server.thrift_port``, 2229); a ``Front`` pairs each port with its sans-IO codec and
its session class. Every connection is served the same way, whatever its protocol.

Each connection runs two tasks. The reader feeds socket bytes to the front's sans-IO codec
(``MemcacheConnection``, ``TextConnection``, ``ThriftConnection``) and queues the decoded events,
at most ``limits.pending_requests_max`` of them (then it stops reading: back-pressure). The
processor serves the events one at a time through the front's session and writes each reply,
waiting for the transport to drain past ``limits.write_buffer_bytes_max``. When the client closes
its side, events already received are still served, but a fetch that would wait gives up without
taking an item; when the processor ends, the session settles its open reads (memcache and text
abort them; thrift leaves them to their auto-abort timers) and the socket closes.

``KestrelServer.stop`` is graceful: stop listening, close every queue (blocked fetches answer
``END``), close the connections, then let the backend take the last group commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kayos.clock import SYSTEM_CLOCK, Clock
from kestrel_compat import limits
from kestrel_compat.backend import Backend, MemoryBackend
from kestrel_compat.config import KestrelConfig
from kestrel_compat.handler import ClientGone, KestrelService, Session
from kestrel_compat.protocol import MemcacheConnection
from kestrel_compat.text_handler import TextSession
from kestrel_compat.text_protocol import TextConnection
from kestrel_compat.thrift_handler import ThriftReads, ThriftSession
from kestrel_compat.thrift_protocol import ThriftConnection

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


class KestrelServer:
    def __init__(
        self,
        config: KestrelConfig,
        *,
        backend: Backend | None = None,
        clock: Clock = SYSTEM_CLOCK,
        config_path: str | None = None,
    ) -> None:
        self.config = config
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
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stop_requested = asyncio.Event()
        self._stopped = False
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
            self._servers[front.name] = await asyncio.start_server(
                self._connection_handler(front),
                host=server.host,
                port=front.port,
                reuse_address=True,
            )
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
        if self._stopped:
            return
        self._stopped = True
        self._stop_requested.set()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for listener in self._servers.values():
            listener.close()
        self.service.collection.shutdown()
        self.thrift_reads.cancel_timers()
        for writer in list(self._writers):
            writer.close()
        if self._connections:
            _, pending = await asyncio.wait(
                self._connections, timeout=limits.shutdown_grace_ms / 1000
            )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=limits.shutdown_grace_ms / 1000)
        for listener in self._servers.values():
            await listener.wait_closed()
        await self.service.close()

    async def _sweep(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.service.sweep()

    # --- one connection ---

    def _connection_handler(
        self, front: Front[EventT]
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._on_connection(front, reader, writer)

        return on_connection

    async def _on_connection(
        self, front: Front[EventT], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._stopped:
            writer.close()
            return
        self._connections.add(task)
        self._writers.add(writer)
        writer.transport.set_write_buffer_limits(high=limits.write_buffer_bytes_max)
        session = front.session(self.service)
        try:
            await self._serve_connection(front, session, reader, writer)
        finally:
            session.finish()
            self._connections.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), limits.shutdown_grace_ms / 1000)

    async def _serve_connection(
        self,
        front: Front[EventT],
        session: ProtocolSession[EventT],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        events: asyncio.Queue[EventT | None] = asyncio.Queue(maxsize=limits.pending_requests_max)
        loop = asyncio.get_running_loop()
        reader_task = loop.create_task(self._read(front.codec(), session, reader, events))
        try:
            await self._process(session, writer, events)
        finally:
            reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader_task

    async def _read(
        self,
        codec: Codec[EventT],
        session: ProtocolSession[EventT],
        reader: asyncio.StreamReader,
        events: asyncio.Queue[EventT | None],
    ) -> None:
        stats = self.service.collection.stats
        timeout_ms = self.config.server.client_timeout_ms
        timeout_s = None if timeout_ms is None else timeout_ms / 1000
        try:
            while not codec.closed:
                try:
                    data = await asyncio.wait_for(reader.read(limits.read_chunk_bytes), timeout_s)
                except TimeoutError:
                    log.debug("closing an idle connection")
                    break
                if not data:
                    break
                stats.bytes_read += len(data)
                for event in codec.receive_data(data):
                    await events.put(event)
        except OSError as error:
            log.debug("connection read failed: %s", error)
        if not codec.closed:
            session.client_left()
            await events.put(None)

    async def _process(
        self,
        session: ProtocolSession[EventT],
        writer: asyncio.StreamWriter,
        events: asyncio.Queue[EventT | None],
    ) -> None:
        stats = self.service.collection.stats

        async def send(data: bytes) -> None:
            stats.bytes_written += len(data)
            writer.write(data)
            await writer.drain()

        while True:
            event = await events.get()
            if event is None:
                return
            try:
                if await session.handle(event, send):
                    return
            except ClientGone:
                return
            except (OSError, ConnectionError) as error:
                log.debug("connection write failed: %s", error)
                return


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
