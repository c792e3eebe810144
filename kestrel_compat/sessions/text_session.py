"""Kestrel's text protocol over the queue collection: one ``TextSession`` per text connection.

Kestrel's TextHandler (spec §10) on the shared ``KestrelService``: the queues, server status and
connection counts are those the memcache and thrift protocols see. Open reads are per connection
and per queue as for memcache (``PendingReads``); every fetch is one, and ``get``, ``peek`` and
``monitor`` first confirm all of this connection's open reads on their queue. A disconnect aborts
the rest (spec §3.4). ``TextSession.handle`` writes the exact reply through ``send`` and returns
whether the connection closes afterwards; requests are served one at a time.

Refusals by the server status answer ``-Server not available for operation <op>`` and keep the
connection, as Kestrel's AvailabilityException does. Failures Kestrel does not catch (an illegal
queue name on a creating command, a put the backend would not store) close it without a word.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kayos.errors import KayosError
from kestrel_compat.core.collection import IllegalQueueName
from kestrel_compat.core.now import now_ms
from kestrel_compat.core.queue import Item, KestrelQueue, LogEntry
from kestrel_compat.sessions.session_base import PendingReadsSession
from kestrel_compat.wire import commands as c
from kestrel_compat.wire import text_codec as t

log = logging.getLogger("kestrel_compat.sessions.text_session")

Send = Callable[[bytes], Awaitable[None]]


class _Unavailable(Exception):
    """The server status (or a connection limit) refused the operation; the reply says which."""

    def __init__(self, operation: str) -> None:
        super().__init__(operation)
        self.operation = operation


class _CloseSilently(Exception):
    """Kestrel would fail the request with an uncaught exception: close, nothing sent."""


def _operation(command: str) -> str:
    operation = t.TEXT_COMMANDS_BY_NAME[command].status_operation
    assert operation is not None, f"{command} is never refused by the server status"
    return operation


class TextSession(PendingReadsSession):
    """One text connection: its open reads per queue and its pending blocked fetch."""

    # --- checks ---

    def _check_reads(self, command: str) -> None:
        if self.reads_blocked:
            raise _Unavailable(_operation(command))

    def _check_writes(self, command: str) -> None:
        if self.writes_blocked:
            raise _Unavailable(_operation(command))

    def _queue(self, name: str) -> KestrelQueue | None:
        try:
            return self.collection.queue(name)
        except IllegalQueueName as error:
            raise _CloseSilently(str(error)) from error

    # --- dispatch ---

    async def handle(self, event: t.TextEvent, send: Send) -> bool:
        """Serve one event; return whether the connection closes afterwards."""
        if isinstance(event, t.ErrorReply):
            await send(t.encode_error(event.message))
            return False
        if isinstance(event, c.Close | c.Quit):
            return True
        try:
            reply = await self._serve(event, send)
        except _Unavailable as refusal:
            reply = t.encode_error(t.unavailable_message(refusal.operation))
        except _CloseSilently as failure:
            log.debug("closing a text connection: %s", failure)
            return True
        finally:
            self.service.after_change()
        if reply:
            await send(reply)
        return False

    async def _serve(self, event: t.TextCommand, send: Send) -> bytes:
        if isinstance(event, t.Put):
            return await self._put(event)
        if isinstance(event, t.Get | t.Peek):
            return await self._get(event)
        if isinstance(event, t.Monitor):
            await self._monitor(event, send)
            return b""
        if isinstance(event, c.Confirm):
            if self.open_reads.confirm(event.queue, event.count) == 0:
                return t.encode_error("Not that many transactions open.")
            return t.encode_count(event.count)
        if isinstance(event, c.Flush):
            self._check_writes("flush")
            self.collection.flush(event.queue)
            return t.ZERO
        if isinstance(event, c.Delete):
            self._check_writes("delete")
            self.collection.delete(event.queue)
            return t.ZERO
        if isinstance(event, t.StatusQuery | t.StatusChange):
            return self._status(event)
        if isinstance(event, c.Version):
            return t.encode_string(self.service.server_config.version)
        assert isinstance(event, c.Shutdown), f"unhandled command {event!r}"
        if self.service.on_shutdown is not None:
            self.service.on_shutdown()
        return t.ZERO

    # --- put ---

    async def _put(self, event: t.Put) -> bytes:
        collection = self.collection
        expiry_ms = None
        if event.expiry_ms is not None:
            expiry_ms = now_ms(self.service.clock) + event.expiry_ms
        stored_count = 0
        entries: list[LogEntry] = []
        for data in event.items:
            # Kestrel's setItem, once per item: the status is checked before each one.
            self._check_writes("put")
            collection.stats.cmd_set += 1
            if data is None:
                # Larger than Kayos stores: refused like an item over maxItemSize, after
                # creating the queue as Kestrel's add would have.
                if event.queue not in collection.aliases:
                    self._queue(event.queue)
                continue
            try:
                stored, waits = collection.add(event.queue, data, expiry_ms)
            except IllegalQueueName as error:
                raise _CloseSilently(str(error)) from error
            entries += waits
            stored_count += stored
        try:
            await self.service.persister.wait_stored(entries)
        except KayosError as error:
            raise _CloseSilently(f"put not stored: {error}") from error
        return t.encode_count(stored_count)

    # --- get, peek, monitor ---

    async def _get(self, event: t.Get | t.Peek) -> bytes:
        name = event.queue
        peek = isinstance(event, t.Peek)
        self.open_reads.confirm_all(name)
        self._check_reads(event.command)
        stats = self.collection.stats
        if peek:
            stats.cmd_peek += 1
        else:
            stats.cmd_get += 1
        if name in self.collection.aliases:
            return t.NO_ITEM  # An alias reads as an empty queue and counts no hit or miss.
        queue = self._queue(name)
        if queue is None:
            return t.NO_ITEM  # Shutting down.
        deadline = self.deadline(event.timeout_ms)
        item = await self.fetch(queue, deadline, transactional=not peek, peek=peek)
        self.collection.count_result(item)
        if item is None:
            return t.NO_ITEM
        if not peek:
            self.remember_open_read(name, queue, item)
        return t.encode_item(item.data)

    async def _monitor(self, event: t.Monitor, send: Send) -> None:
        name = event.queue
        self.open_reads.confirm_all(name)
        self._check_reads("monitor")
        deadline = asyncio.get_running_loop().time() + max(event.timeout_ms, 0) / 1000

        async def send_item(item: Item, read_id: int) -> bool:
            await send(t.encode_item(item.data))
            return True

        try:
            await self.monitor_until(
                name, deadline, self.max_open_reads, opening=True, on_item=send_item
            )
        except IllegalQueueName as error:
            raise _CloseSilently(str(error)) from error
        await send(t.NO_ITEM)

    # --- status (spec §7) ---

    def _status(self, event: t.StatusQuery | t.StatusChange) -> bytes:
        status = self.service.status
        if status is None:
            return t.encode_error("Server status not configured.")
        if isinstance(event, t.StatusQuery):
            return t.encode_string(status.current.value)
        if event.forbidden:
            return t.encode_error("Status forbidden.")
        if event.target is None:
            return t.encode_error("Unknown status.")
        status.set(event.target)
        return t.ZERO
