"""Kestrel's command handling over the queue collection: one ``Session`` per memcache connection.

``KestrelService`` is the server-wide state (collection, persistence, server status, config);
``Session.handle`` serves one decoded command (``kestrel_compat.protocol`` events) and writes the
exact reply bytes through ``send``; it returns whether the connection must close afterwards.
Requests of one session are served one at a time, as Kestrel does (spec §1.1).

The only waiting here is a blocked fetch (GET ``t=``, peek ``t=``, MONITOR), done on the event
loop's clock; cancelling the task that runs ``handle`` (the client left) deregisters the waiter
and, if it had already been woken, passes the wake-up on, so a departed client never takes an
item (spec §3.4-§3.5). ``Session.finish`` then aborts the session's open reads, oldest first.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

from kayos.clock import Clock
from kayos.errors import KayosError
from kestrel_compat import limits
from kestrel_compat import protocol as p
from kestrel_compat.backend import Backend
from kestrel_compat.commands import (
    COMMANDS_BY_NAME,
    ERROR_CLOSE,
    ERROR_KEEP,
    SERVER_ERROR_CLOSE,
    SILENT_CLOSE,
    ErrorClass,
)
from kestrel_compat.config import KestrelConfig, load_queue_settings
from kestrel_compat.engine import (
    IllegalQueueName,
    Item,
    KestrelQueue,
    QueueCollection,
    StatusKeeper,
    Waiter,
    now_ms,
)
from kestrel_compat.persist import Persister

log = logging.getLogger("kestrel_compat.handler")

Send = Callable[[bytes], Awaitable[None]]

# SET exptimes at or above this are absolute Unix seconds; below it, relative seconds (spec §4).
ABSOLUTE_EXPIRY_MIN_S = 1_000_000


def expiry_from_exptime(exptime: int, now_ms_value: int) -> int | None:
    """A SET exptime as an absolute expiry in ms; None: never (spec §4)."""
    if exptime == 0:
        return None
    if exptime < ABSOLUTE_EXPIRY_MIN_S:
        return now_ms_value + exptime * 1000
    return exptime * 1000


def _resolver(future: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        if not future.done():
            future.set_result(None)

    return wake


class ClientGone(Exception):
    """The client left while its request waited; nothing more is written to it."""


class _Refused(Exception):
    """Ends a command with an error class of spec §1.3 (internal to this module)."""

    def __init__(self, error_class: ErrorClass, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class


def _read_status_file(path: str | None) -> p.ServerStatus | None:
    if path is None:
        return None
    try:
        word = Path(path).read_text(encoding="ascii").strip().upper()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return p.ServerStatus[word]
    except KeyError:
        log.error("status file %s holds %r; keeping the default status", path, word)
        return None


class KestrelService:
    """Everything the sessions of one server share."""

    def __init__(
        self,
        config: KestrelConfig,
        backend: Backend,
        clock: Clock,
        *,
        config_path: str | None = None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.server_config = config.server
        self.clock = clock
        self.config_path = config_path
        self.collection = QueueCollection(config.queues, clock)
        self.persister = Persister(backend, self.collection)
        self.backend = backend
        self.on_shutdown = on_shutdown
        self.sessions = 0
        self.status: StatusKeeper | None = None
        server = config.server
        if server.status_enabled:
            stored = _read_status_file(server.status_file)
            self.status = StatusKeeper(
                clock,
                initial=stored if stored is not None else server.default_status,
                grace_period_ms=server.status_change_grace_period_ms,
                store=self._store_status if server.status_file is not None else None,
            )

    def _store_status(self, status: p.ServerStatus) -> None:
        path = self.server_config.status_file
        assert path is not None
        try:
            Path(path).write_text(status.name.lower(), encoding="ascii")
        except OSError as error:
            log.error("cannot store the server status in %s: %s", path, error)

    async def start(self) -> None:
        await self.persister.recover()

    def after_change(self) -> None:
        self.persister.kick()

    def sweep(self) -> None:
        self.collection.sweep()
        self.after_change()

    def reload(self) -> None:
        self.collection.reload(load_queue_settings(self.config_path))
        self.after_change()

    def stats(self) -> list[tuple[str, p.StatValue]]:
        collection = self.collection
        counters = collection.stats
        now_s = self.clock.now_s()
        budget = self.server_config.memory_budget_bytes
        report: list[tuple[str, p.StatValue]] = [
            ("uptime", int(now_s - collection.started_s)),
            ("time", int(now_s)),
            ("version", self.server_config.version),
            ("curr_items", collection.current_items()),
            ("total_items", counters.total_items),
            ("bytes", collection.current_bytes()),
            ("reserved_memory_ratio", f"{collection.reserved_memory_bytes() / budget:.3f}"),
            ("curr_connections", counters.curr_connections),
            ("total_connections", counters.total_connections),
            ("cmd_get", counters.cmd_get),
            ("cmd_set", counters.cmd_set),
            ("cmd_peek", counters.cmd_peek),
            ("get_hits", counters.get_hits),
            ("get_misses", counters.get_misses),
            ("bytes_read", counters.bytes_read),
            ("bytes_written", counters.bytes_written),
            ("queue_creates", counters.queue_creates),
            ("queue_deletes", counters.queue_deletes),
            ("queue_expires", counters.queue_expires),
        ]
        for name in collection.queue_names():
            for key, value in collection.queue_stats(name):
                report.append((f"queue_{name}_{key}", value))
        return report

    def dump_stats(self, names: tuple[str, ...]) -> bytes:
        chosen = list(names) if names else self.collection.queue_names()
        return p.encode_dump_stats((name, self.collection.queue_stats(name)) for name in chosen)

    async def close(self) -> None:
        """Stop: every queue closes (waiters answer END), then the last commits are written."""
        self.collection.shutdown()
        await self.persister.drain()
        await self.backend.close()


class Session:
    """One memcache connection: its open reads per queue and its pending blocked fetch."""

    def __init__(self, service: KestrelService) -> None:
        self.service = service
        self.collection = service.collection
        self.max_open_reads = service.server_config.max_open_transactions
        self.open_reads: dict[str, deque[tuple[KestrelQueue, int]]] = {}
        self.finished = False
        self._gone: asyncio.Future[None] | None = None
        service.sessions += 1
        stats = self.collection.stats
        stats.curr_connections += 1
        stats.total_connections += 1
        server = service.server_config
        write_limit = server.connection_limit_refuse_writes
        read_limit = server.connection_limit_refuse_reads
        self.refuse_writes = write_limit is not None and service.sessions > write_limit
        self.refuse_reads = read_limit is not None and service.sessions > read_limit

    # --- lifecycle ---

    def client_left(self) -> None:
        """The peer closed its side: a blocked fetch gives up without taking an item."""
        gone = self._gone_future()
        if not gone.done():
            gone.set_result(None)

    def _gone_future(self) -> asyncio.Future[None]:
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
        return self._gone

    def finish(self) -> None:
        """The connection ended (any reason): abort every open read, oldest first (spec §3.4)."""
        if self.finished:
            return
        self.finished = True
        self._abort_all()
        self.service.sessions -= 1
        self.collection.stats.curr_connections -= 1
        self.service.after_change()

    def _abort_all(self) -> None:
        reads, self.open_reads = self.open_reads, {}
        for pending in reads.values():
            for queue, xid in pending:
                queue.unremove(xid)

    # --- open reads ---

    def pending(self, name: str) -> int:
        return len(self.open_reads.get(name, ()))

    def _add_pending(self, name: str, queue: KestrelQueue, xid: int) -> None:
        self.open_reads.setdefault(name, deque()).append((queue, xid))
        if self.finished:
            self._abort_all()

    def _pop_pending(self, name: str, count: int = 1) -> list[tuple[KestrelQueue, int]]:
        pending = self.open_reads.get(name)
        if not pending or count > len(pending) or count <= 0:
            return []
        return [pending.popleft() for _ in range(count)]

    def close_read(self, name: str) -> None:
        for queue, xid in self._pop_pending(name):
            queue.confirm(xid)

    def abort_read(self, name: str) -> None:
        for queue, xid in self._pop_pending(name):
            queue.unremove(xid)

    # --- status and limits ---

    def _check_reads(self, error_class: ErrorClass) -> None:
        status = self.service.status
        if self.refuse_reads or (status is not None and status.blocks_reads):
            raise _Refused(error_class, "reads refused by the server status")

    def _check_writes(self, command: str) -> None:
        refusal = COMMANDS_BY_NAME[command].status_refusal
        assert refusal is not None
        status = self.service.status
        if self.refuse_writes or (status is not None and status.blocks_writes):
            raise _Refused(refusal, f"{command} refused by the server status")

    def _queue(self, name: str) -> KestrelQueue | None:
        try:
            return self.collection.queue(name)
        except IllegalQueueName as error:
            raise _Refused(SILENT_CLOSE, str(error)) from error

    # --- dispatch ---

    async def handle(self, event: p.Event, send: Send) -> bool:
        """Serve one event; return whether the connection closes afterwards."""
        if isinstance(event, p.ErrorReply):
            if event.reply:
                await send(event.reply)
            return event.close_after
        try:
            reply = await self._serve(event, send)
        except _Refused as refusal:
            log.debug("refused %s: %s", event.command, refusal)
            if refusal.error_class.reply:
                await send(refusal.error_class.reply)
            return refusal.error_class.close_after
        finally:
            self.service.after_change()
        if reply:
            await send(reply)
        return p.closes_connection(event)

    async def _serve(self, event: p.Command, send: Send) -> bytes:
        if isinstance(event, p.Get):
            return await self._get(event)
        if isinstance(event, p.Set | p.SetTooLarge):
            return await self._set(event)
        if isinstance(event, p.Monitor):
            await self._monitor(event, send)
            return b""
        return self._serve_now(event)

    def _serve_now(self, event: p.Command) -> bytes:
        collection = self.collection
        if isinstance(event, p.Delete):
            self._check_writes("delete")
            collection.delete(event.queue)
            return p.DELETED
        if isinstance(event, p.Flush):
            self._check_writes("flush")
            collection.flush(event.queue)
            return p.END
        if isinstance(event, p.FlushAll):
            self._check_writes("flush_all")
            collection.flush_all()
            return p.FLUSHED_ALL
        if isinstance(event, p.FlushExpired):
            self._check_writes("flush_expired")
            return p.encode_count(collection.flush_expired(event.queue))
        if isinstance(event, p.FlushAllExpired):
            self._check_writes("flush_all_expired")
            return p.encode_count(collection.flush_all_expired())
        if isinstance(event, p.Confirm):
            return self._confirm(event)
        if isinstance(event, p.Status):
            return self._status(event)
        return self._serve_admin(event)

    def _serve_admin(self, event: p.Command) -> bytes:
        if isinstance(event, p.Version):
            return p.encode_version(self.service.server_config.version)
        if isinstance(event, p.Stats):
            return p.encode_stats(self.service.stats())
        if isinstance(event, p.DumpStats):
            return self.service.dump_stats(event.queues)
        if isinstance(event, p.Reload):
            try:
                self.service.reload()
            except KayosError as error:
                log.error("reload failed: %s", error)
                raise _Refused(SILENT_CLOSE, "reload failed") from error
            return p.RELOADED
        if isinstance(event, p.Shutdown):
            if self.service.on_shutdown is not None:
                self.service.on_shutdown()
            return b""
        assert isinstance(event, p.Quit), f"unhandled command {event!r}"
        return b""

    # --- SET (spec §2, §4) ---

    async def _set(self, event: p.Set | p.SetTooLarge) -> bytes:
        self._check_writes("set")
        collection = self.collection
        collection.stats.cmd_set += 1
        if isinstance(event, p.SetTooLarge):
            # Larger than Kayos stores: refused like an item over maxItemSize, after creating the
            # queue as Kestrel's add would have.
            if event.queue not in collection.aliases:
                self._queue(event.queue)
            return p.NOT_STORED
        expiry_ms = expiry_from_exptime(event.expiry, now_ms(self.service.clock))
        try:
            stored, entries = collection.add(event.queue, event.data, expiry_ms)
        except IllegalQueueName as error:
            raise _Refused(SILENT_CLOSE, str(error)) from error
        try:
            await self.service.persister.wait_stored(entries)
        except KayosError as error:
            raise _Refused(SERVER_ERROR_CLOSE, f"set not stored: {error}") from error
        return p.STORED if stored else p.NOT_STORED

    # --- GET (spec §3) ---

    async def _get(self, event: p.Get) -> bytes:
        name, options = event.queue, event.options
        if options.abort:
            self.abort_read(name)
            return p.END
        if options.close:
            self.close_read(name)
        if not options.fetches:
            return p.END
        if self.pending(name) > 0 and not options.peek and not options.open:
            raise _Refused(ERROR_CLOSE, "plain get with an open read on the queue")
        self._check_reads(SERVER_ERROR_CLOSE)
        if options.open and self.pending(name) >= self.max_open_reads:
            raise _Refused(ERROR_CLOSE, "too many open reads")
        stats = self.collection.stats
        if options.peek:
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
        if name in self.collection.aliases:
            return p.END  # An alias reads as an empty queue and counts no hit or miss.
        queue = self._queue(name)
        if queue is None:
            return p.END  # Shutting down.
        deadline = self._deadline(options.timeout_ms)
        item = await self._fetch(queue, deadline, transactional=options.open, peek=options.peek)
        self.collection.count_result(item)
        if item is None:
            return p.END
        if options.open:
            self._add_pending(name, queue, item.xid)
        return p.encode_value(name, item.data)

    @staticmethod
    def _deadline(timeout_ms: int | None) -> float | None:
        if timeout_ms is None or timeout_ms <= 0:
            return None
        return asyncio.get_running_loop().time() + min(timeout_ms, limits.wait_ms_max) / 1000

    async def _fetch(
        self, queue: KestrelQueue, deadline: float | None, *, transactional: bool, peek: bool
    ) -> Item | None:
        """Fetch now, or wait until ``deadline`` (loop time) for an add or abort to wake us."""
        loop = asyncio.get_running_loop()
        while True:
            item = self.collection.fetch(queue, transactional=transactional, peek=peek)
            if item is not None or deadline is None or queue.closed or queue.paused:
                return item
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return None
            gone = self._gone_future()
            if gone.done():
                raise ClientGone("the client left before its fetch could wait")
            woken: asyncio.Future[None] = loop.create_future()
            waiter = Waiter(_resolver(woken))
            queue.add_waiter(waiter)
            try:
                await asyncio.wait(
                    [woken, gone], timeout=remaining_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                registered = queue.remove_waiter(waiter)
                if not registered and woken.done() and (gone.done() or self._cancelled()):
                    # Woken but never ran the fetch (our client left): pass the wake-up on.
                    queue.trigger()
            if gone.done():
                raise ClientGone("the client left while its fetch waited")
            if not woken.done():
                return None  # Timed out.
            if loop.time() >= deadline:
                return self.collection.fetch(queue, transactional=transactional, peek=peek)

    @staticmethod
    def _cancelled() -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    # --- MONITOR / CONFIRM (spec §5) ---

    async def _monitor(self, event: p.Monitor, send: Send) -> None:
        self._check_reads(SILENT_CLOSE)
        name = event.queue
        items_left = event.items_max if event.items_max is not None else self.max_open_reads
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(event.timeout_s, limits.wait_ms_max // 1000)
        status = self.service.status
        while True:
            if status is not None and status.blocks_reads:
                break
            if items_left == 0 or deadline <= loop.time():
                break
            if self.pending(name) >= self.max_open_reads:
                break
            if name in self.collection.aliases:
                break
            queue = self._queue(name)
            if queue is None:
                break
            item = await self._fetch(queue, deadline, transactional=True, peek=False)
            self.collection.count_result(item)
            if item is None:
                break
            self._add_pending(name, queue, item.xid)
            await send(p.encode_value(name, item.data))
            items_left -= 1
        await send(p.END)

    def _confirm(self, event: p.Confirm) -> bytes:
        pending = self._pop_pending(event.queue, event.count)
        if not pending:
            return ERROR_KEEP.reply
        for queue, xid in pending:
            queue.confirm(xid)
        return p.END

    # --- STATUS (spec §7) ---

    def _status(self, event: p.Status) -> bytes:
        status = self.service.status
        if status is None:
            raise _Refused(ERROR_CLOSE, "server status not configured")
        if event.target is None:
            return p.encode_status(status.current)
        status.set(event.target)
        return p.END
