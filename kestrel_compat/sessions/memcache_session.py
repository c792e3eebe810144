"""Kestrel's memcache protocol over the queue collection: one ``Session`` per memcache connection.

``KestrelService`` (``kestrel_compat.sessions.service``) is the server-wide state, shared with the
text and thrift protocols; ``SessionBase`` (``kestrel_compat.sessions.session_base``) what every
connection does. ``Session.handle`` serves one event of the memcache codec
(``kestrel_compat.wire.memcache_codec``) and writes the exact reply bytes
(``kestrel_compat.wire.memcache_replies``) through ``send``; it returns whether the connection
must close afterwards. Requests of one session are served one at a time, as Kestrel does (spec
§1.1).

The only waiting here is a blocked fetch (GET ``t=``, peek ``t=``, MONITOR), done on the event
loop's clock; cancelling the task that runs ``handle`` (the client left) deregisters the waiter
and, if it had already been woken, passes the wake-up on, so a departed client never takes an
item (spec §3.4-§3.5). ``Session.finish`` then aborts the session's open reads, oldest first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kayos.errors import KayosError
from kestrel_compat import limits
from kestrel_compat.core.collection import IllegalQueueName
from kestrel_compat.core.now import now_ms
from kestrel_compat.core.queue import Item, KestrelQueue
from kestrel_compat.sessions.session_base import PendingReadsSession
from kestrel_compat.wire import commands as c
from kestrel_compat.wire import memcache_codec as p
from kestrel_compat.wire import memcache_replies as r
from kestrel_compat.wire.memcache_commands import (
    COMMANDS_BY_NAME,
    ERROR_CLOSE,
    ERROR_KEEP,
    SERVER_ERROR_CLOSE,
    SILENT_CLOSE,
    ErrorClass,
)

log = logging.getLogger("kestrel_compat.sessions.memcache_session")

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


class _Refused(Exception):
    """Ends a command with an error class of spec §1.3 (internal to this module)."""

    def __init__(self, error_class: ErrorClass, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class


class Session(PendingReadsSession):
    """One memcache connection: its open reads per queue and its pending blocked fetch."""

    # --- status and limits ---

    def _check_reads(self, error_class: ErrorClass) -> None:
        if self.reads_blocked:
            raise _Refused(error_class, "reads refused by the server status")

    def _check_writes(self, command: str) -> None:
        refusal = COMMANDS_BY_NAME[command].status_refusal
        assert refusal is not None
        if self.writes_blocked:
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
        if isinstance(event, c.Delete):
            self._check_writes("delete")
            collection.delete(event.queue)
            return r.DELETED
        if isinstance(event, c.Flush):
            self._check_writes("flush")
            collection.flush(event.queue)
            return r.END
        if isinstance(event, p.FlushAll):
            self._check_writes("flush_all")
            collection.flush_all()
            return r.FLUSHED_ALL
        if isinstance(event, p.FlushExpired):
            self._check_writes("flush_expired")
            return r.encode_count(collection.flush_expired(event.queue))
        if isinstance(event, p.FlushAllExpired):
            self._check_writes("flush_all_expired")
            return r.encode_count(collection.flush_all_expired())
        if isinstance(event, c.Confirm):
            return self._confirm(event)
        if isinstance(event, p.Status):
            return self._status(event)
        return self._serve_admin(event)

    def _serve_admin(self, event: p.Command) -> bytes:
        if isinstance(event, c.Version):
            return r.encode_version(self.service.server_config.version)
        if isinstance(event, p.Stats):
            return r.encode_stats(self.service.stats())
        if isinstance(event, p.DumpStats):
            return self.service.dump_stats(event.queues)
        if isinstance(event, p.Reload):
            try:
                self.service.reload()
            except KayosError as error:
                log.error("reload failed: %s", error)
                raise _Refused(SILENT_CLOSE, "reload failed") from error
            return r.RELOADED
        if isinstance(event, c.Shutdown):
            if self.service.on_shutdown is not None:
                self.service.on_shutdown()
            return b""
        assert isinstance(event, c.Quit), f"unhandled command {event!r}"
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
            return r.NOT_STORED
        expiry_ms = expiry_from_exptime(event.expiry, now_ms(self.service.clock))
        try:
            stored, entries = collection.add(event.queue, event.data, expiry_ms)
        except IllegalQueueName as error:
            raise _Refused(SILENT_CLOSE, str(error)) from error
        try:
            await self.service.persister.wait_stored(entries)
        except KayosError as error:
            raise _Refused(SERVER_ERROR_CLOSE, f"set not stored: {error}") from error
        return r.STORED if stored else r.NOT_STORED

    # --- GET (spec §3) ---

    async def _get(self, event: p.Get) -> bytes:
        name, options = event.queue, event.options
        if options.abort:
            self.open_reads.abort(name)
            return r.END
        if options.close:
            self.open_reads.confirm(name)
        if not options.fetches:
            return r.END
        if self.open_reads.count(name) > 0 and not options.peek and not options.open:
            raise _Refused(ERROR_CLOSE, "plain get with an open read on the queue")
        self._check_reads(SERVER_ERROR_CLOSE)
        if options.open and self.open_reads.count(name) >= self.max_open_reads:
            raise _Refused(ERROR_CLOSE, "too many open reads")
        stats = self.collection.stats
        if options.peek:
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
        if name in self.collection.aliases:
            return r.END  # An alias reads as an empty queue and counts no hit or miss.
        queue = self._queue(name)
        if queue is None:
            return r.END  # Shutting down.
        deadline = self.deadline(options.timeout_ms)
        item = await self.fetch(queue, deadline, transactional=options.open, peek=options.peek)
        self.collection.count_result(item)
        if item is None:
            return r.END
        if options.open:
            self.remember_open_read(name, queue, item)
        return r.encode_value(name, item.data)

    # --- MONITOR / CONFIRM (spec §5) ---

    async def _monitor(self, event: p.Monitor, send: Send) -> None:
        self._check_reads(SILENT_CLOSE)
        name = event.queue
        items_max = event.items_max if event.items_max is not None else self.max_open_reads
        timeout_s = min(event.timeout_s, limits.wait_ms_max // 1000)
        deadline = asyncio.get_running_loop().time() + timeout_s

        async def send_item(item: Item, read_id: int) -> bool:
            await send(r.encode_value(name, item.data))
            return True

        try:
            await self.monitor_until(name, deadline, items_max, opening=True, on_item=send_item)
        except IllegalQueueName as error:
            raise _Refused(SILENT_CLOSE, str(error)) from error
        await send(r.END)

    def _confirm(self, event: c.Confirm) -> bytes:
        if self.open_reads.confirm(event.queue, event.count) == 0:
            return ERROR_KEEP.reply
        return r.END

    # --- STATUS (spec §7) ---

    def _status(self, event: p.Status) -> bytes:
        status = self.service.status
        if status is None:
            raise _Refused(ERROR_CLOSE, "server status not configured")
        if event.target is None:
            return r.encode_status(status.current)
        status.set(event.target)
        return r.END
