"""The asyncio memcache server of the Kestrel front: the only socket code in the package.

Each connection runs two tasks. The reader feeds socket bytes to the sans-IO codec
(``MemcacheConnection``) and queues the decoded events, at most ``limits.pending_requests_max``
of them (then it stops reading: back-pressure). The processor serves the events one at a time
through a ``Session`` and writes each reply, waiting for the transport to drain past
``limits.write_buffer_bytes_max``. When the client closes its side, events already received are
still served, but a fetch that would wait gives up without taking an item; when the processor
ends, the session's open reads are aborted and the socket closes.

``KestrelServer.stop`` is graceful: stop listening, close every queue (blocked fetches answer
``END``), close the connections, then let the backend take the last group commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kayos.clock import SYSTEM_CLOCK, Clock
from kestrel_compat import limits
from kestrel_compat.backend import Backend, MemoryBackend
from kestrel_compat.config import KestrelConfig
from kestrel_compat.handler import ClientGone, KestrelService, Session
from kestrel_compat.protocol import Event, MemcacheConnection

log = logging.getLogger("kestrel_compat.server")


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
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stop_requested = asyncio.Event()
        self._stopped = False
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "the server is not started"
        assert self._server.sockets, "the server is not listening"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        await self.service.start()
        server = self.config.server
        self._server = await asyncio.start_server(
            self._on_connection, host=server.host, port=server.port, reuse_address=True
        )
        if server.expiration_timer_frequency_ms is not None:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(server.expiration_timer_frequency_ms / 1000), name="kestrel-sweeper"
            )
        log.info("kestrel memcache front listening on %s:%d", server.host, self.port)

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
        if self._server is not None:
            self._server.close()
        self.service.collection.shutdown()
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
        if self._server is not None:
            await self._server.wait_closed()
        await self.service.close()

    async def _sweep(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.service.sweep()

    # --- one connection ---

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._stopped:
            writer.close()
            return
        self._connections.add(task)
        self._writers.add(writer)
        writer.transport.set_write_buffer_limits(high=limits.write_buffer_bytes_max)
        session = Session(self.service)
        try:
            await self._serve_connection(session, reader, writer)
        finally:
            session.finish()
            self._connections.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), limits.shutdown_grace_ms / 1000)

    async def _serve_connection(
        self, session: Session, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        events: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=limits.pending_requests_max)
        loop = asyncio.get_running_loop()
        reader_task = loop.create_task(self._read(session, reader, events))
        try:
            await self._process(session, writer, events)
        finally:
            reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader_task

    async def _read(
        self,
        session: Session,
        reader: asyncio.StreamReader,
        events: asyncio.Queue[Event | None],
    ) -> None:
        codec = MemcacheConnection()
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
        session: Session,
        writer: asyncio.StreamWriter,
        events: asyncio.Queue[Event | None],
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
