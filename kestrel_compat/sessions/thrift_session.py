"""Kestrel's thrift API over the queue collection: one ``ThriftSession`` per thrift connection.

Kestrel's ThriftHandler (spec §11) on the shared ``KestrelService``. What differs from the other
protocols is where open reads live. A ``get`` with ``auto_abort_msec`` > 0 opens its items and
hands out ids from one server-wide counter starting at 1; ``ThriftReads`` maps each id to its
queue and xid for the whole server, so ``confirm``/``abort`` close any id, whatever connection
opened it and whatever queue name the call gives (Kestrel's ThriftPendingReads). Each id gets an
auto-abort timer, started when the ``get`` returns; a read neither confirmed nor aborted in time
goes back to the head. A disconnect does **not** abort thrift reads: only the timer (or the
queue's openTransactionTimeout) does.

What is per connection is the count of open reads per queue name that maxOpenTransactions is
checked against (a ``get`` stops early, without an error, once the connection holds that many):
it grows when a ``get`` opens a read and shrinks when this connection's ``confirm``/``abort`` or
an auto-abort timer closes an id under that queue name; the connection's end forgets it.

Refusals and failures (server status, an illegal queue name, a status that cannot be set) are
answered with a TApplicationException of type INTERNAL_ERROR carrying Kestrel's message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kayos.errors import KayosError
from kestrel_compat import limits
from kestrel_compat.core.collection import IllegalQueueName
from kestrel_compat.core.now import now_ms
from kestrel_compat.core.queue import Item, KestrelQueue, LogEntry
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.sessions.service import KestrelService
from kestrel_compat.sessions.session_base import SessionBase
from kestrel_compat.wire import thrift_codec as th
from kestrel_compat.wire.commands import Close

log = logging.getLogger("kestrel_compat.sessions.thrift_session")

Send = Callable[[bytes], Awaitable[None]]

_STATUS_TO_THRIFT = {
    ServerStatus.UP: th.ThriftStatus.UP,
    ServerStatus.READONLY: th.ThriftStatus.READ_ONLY,
    ServerStatus.QUIESCENT: th.ThriftStatus.QUIESCENT,
    # Kestrel's enum has no WriteAvoid: it reads as NOT_CONFIGURED (spec §11).
    ServerStatus.WRITEAVOID: th.ThriftStatus.NOT_CONFIGURED,
}
_THRIFT_TO_STATUS = {
    th.ThriftStatus.UP: ServerStatus.UP,
    th.ThriftStatus.READ_ONLY: ServerStatus.READONLY,
    th.ThriftStatus.QUIESCENT: ServerStatus.QUIESCENT,
}


class _Failure(Exception):
    """Answered with a TApplicationException carrying this message."""


def _unavailable(operation: str) -> _Failure:
    return _Failure(f"Server not available for operation {operation}")


@dataclass(eq=False, slots=True)
class ThriftRead:
    queue: KestrelQueue
    xid: int
    timer: asyncio.TimerHandle | None = None


class ThriftReads:
    """Every open thrift read of the server, by id (Kestrel's ThriftPendingReads object)."""

    def __init__(self) -> None:
        self._reads: dict[int, ThriftRead] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._reads)

    def add(self, queue: KestrelQueue, xid: int) -> int:
        read_id = self._next_id
        self._next_id += 1
        self._reads[read_id] = ThriftRead(queue, xid)
        return read_id

    def set_timer(self, read_id: int, timer: asyncio.TimerHandle) -> None:
        read = self._reads.get(read_id)
        if read is None:
            timer.cancel()
        else:
            read.timer = timer

    def close(self, read_id: int, *, confirm: bool) -> bool:
        """Confirm or abort one read; False when the id is not open."""
        read = self._reads.pop(read_id, None)
        if read is None:
            return False
        if read.timer is not None:
            read.timer.cancel()
        if confirm:
            read.queue.confirm(read.xid)
        else:
            read.queue.unremove(read.xid)
        return True

    def cancel_timers(self) -> None:
        """The server stops: no timer may fire into a closed collection."""
        for read in self._reads.values():
            if read.timer is not None:
                read.timer.cancel()
                read.timer = None


class ThriftSession(SessionBase):
    """One thrift connection: its open-read counts per queue name and its pending fetch."""

    def __init__(self, service: KestrelService, reads: ThriftReads) -> None:
        super().__init__(service)
        self.reads = reads
        self.open_counts: dict[str, int] = {}

    # --- open reads (server-wide, counted per connection) ---

    def end_reads(self) -> None:
        self.open_counts.clear()  # The reads stay open until their timers fire.

    def open_read_count(self, name: str) -> int:
        return self.open_counts.get(name, 0)

    def remember_open_read(self, name: str, queue: KestrelQueue, item: Item) -> int:
        self.open_counts[name] = self.open_counts.get(name, 0) + 1
        return self.reads.add(queue, item.xid)

    def close_reads(self, name: str, ids: tuple[int, ...], *, confirm: bool) -> int:
        closed = 0
        for read_id in ids:
            if self.reads.close(read_id, confirm=confirm):
                closed += 1
                if name in self.open_counts:
                    self.open_counts[name] -= 1
        self.service.after_change()
        return closed

    def _auto_abort(self, name: str, read_id: int) -> None:
        self.close_reads(name, (read_id,), confirm=False)

    # --- dispatch ---

    async def handle(self, event: th.ThriftEvent, send: Send) -> bool:
        """Serve one event; return whether the connection closes afterwards."""
        if isinstance(event, Close):
            return True
        if isinstance(event, th.BadCall):
            await send(th.encode_exception(event.method, event.seqid, event.error, event.message))
            return False
        try:
            reply = th.encode_reply(event, await self._serve(event))
        except _Failure as failure:
            log.debug("thrift %s failed: %s", event.method, failure)
            error = th.ApplicationError.INTERNAL_ERROR
            reply = th.encode_exception(event.method, event.seqid, error, str(failure))
        finally:
            self.service.after_change()
        await send(reply)
        return False

    async def _serve(self, call: th.ThriftCall) -> th.ResultValue:
        if isinstance(call, th.Put):
            return await self._put(call)
        if isinstance(call, th.Get):
            return await self._get(call)
        if isinstance(call, th.Confirm | th.Abort):
            return self.close_reads(call.queue_name, call.ids, confirm=isinstance(call, th.Confirm))
        if isinstance(call, th.Peek):
            return self._peek(call)
        if isinstance(call, th.FlushQueue | th.FlushAllQueues | th.DeleteQueue):
            self._write(call)
            return None
        if isinstance(call, th.CurrentStatus):
            status = self.service.status
            return (
                th.ThriftStatus.NOT_CONFIGURED
                if status is None
                else (_STATUS_TO_THRIFT[status.current])
            )
        if isinstance(call, th.SetStatus):
            self._set_status(call.status)
            return None
        assert isinstance(call, th.GetVersion), f"unhandled call {call!r}"
        return self.service.server_config.version

    def _queue(self, name: str) -> KestrelQueue | None:
        try:
            return self.collection.queue(name)
        except IllegalQueueName as error:
            raise _Failure(str(error)) from error

    # --- put ---

    async def _put(self, call: th.Put) -> int:
        collection = self.collection
        expiry_ms = None
        if call.expiration_msec != 0:
            expiry_ms = now_ms(self.service.clock) + call.expiration_msec
        count = 0
        entries: list[LogEntry] = []
        for data in call.items:
            if self.writes_blocked:
                raise _unavailable("setItem")
            collection.stats.cmd_set += 1
            if len(data) > limits.value_bytes_max:
                # Larger than Kayos stores: refused as an item over maxItemSize (the queue is
                # still created, as Kestrel's add would); the put stops here.
                if call.queue_name not in collection.aliases:
                    self._queue(call.queue_name)
                break
            try:
                stored, waits = collection.add(call.queue_name, data, expiry_ms)
            except IllegalQueueName as error:
                raise _Failure(str(error)) from error
            entries += waits
            if not stored:
                break  # The put stops at the first refusal (spec §11).
            count += 1
        try:
            await self.service.persister.wait_stored(entries)
        except KayosError as error:
            raise _Failure(f"put not stored: {error}") from error
        return count

    # --- get ---

    async def _get(self, call: th.Get) -> list[th.Item]:
        if self.reads_blocked:
            raise _unavailable("monitorUntil")
        name = call.queue_name
        opening = call.auto_abort_msec > 0
        loop = asyncio.get_running_loop()
        deadline = None
        if call.timeout_msec != 0:
            deadline = loop.time() + min(call.timeout_msec, limits.wait_ms_max) / 1000
        items_max = limits.thrift_get_items_max
        if call.max_items >= 0:
            items_max = min(call.max_items, items_max)
        items: list[th.Item] = []
        held_bytes = 0

        async def keep(item: Item, read_id: int) -> bool:
            nonlocal held_bytes
            items.append(th.Item(item.data, read_id))
            held_bytes += len(item.data)
            return held_bytes < limits.thrift_get_reply_bytes_max

        try:
            await self.monitor_until(name, deadline, items_max, opening=opening, on_item=keep)
        except IllegalQueueName as error:
            raise _Failure(str(error)) from error
        except BaseException:
            # The client left (or the server stops) before the reply: reads it never saw go back.
            self.close_reads(name, tuple(item.id for item in items if item.id), confirm=False)
            raise
        if opening:
            delay_s = min(call.auto_abort_msec, limits.wait_ms_max) / 1000
            for item in items:
                timer = loop.call_later(delay_s, self._auto_abort, name, item.id)
                self.reads.set_timer(item.id, timer)
        return items

    # --- peek ---

    def _peek(self, call: th.Peek) -> th.QueueInfo:
        name = call.queue_name
        if self.reads_blocked:
            raise _unavailable("getItem")
        self.collection.stats.cmd_peek += 1
        item = None
        if name not in self.collection.aliases:
            queue = self._queue(name)
            if queue is not None:
                item = self.collection.fetch(queue, transactional=False, peek=True)
                self.collection.count_result(item)
        stats = dict(self.collection.queue_stats(name))
        if "items" not in stats:
            raise _Failure("key not found: items")  # Kestrel's stats map of an alias.
        return th.QueueInfo(
            head_item=None if item is None else item.data,
            items=int(stats["items"]),
            bytes=int(stats["bytes"]),
            journal_bytes=int(stats["logsize"]),
            age=int(stats["age"]),
            waiters=int(stats["waiters"]),
            open_transactions=int(stats["open_transactions"]),
        )

    # --- writes and status ---

    def _write(self, call: th.FlushQueue | th.FlushAllQueues | th.DeleteQueue) -> None:
        if isinstance(call, th.FlushAllQueues):
            if self.writes_blocked:
                raise _unavailable("flushAll")
            self.collection.flush_all()
        elif isinstance(call, th.FlushQueue):
            if self.writes_blocked:
                raise _unavailable("flush")
            self.collection.flush(call.queue_name)
        else:
            if self.writes_blocked:
                raise _unavailable("delete")
            self.collection.delete(call.queue_name)

    def _set_status(self, number: int) -> None:
        status = self.service.status
        if status is None:
            raise _Failure("Server status not configured.")
        try:
            target = _THRIFT_TO_STATUS[th.ThriftStatus(number)]
        except (ValueError, KeyError):
            raise _Failure("Unknown status.") from None  # NOT_CONFIGURED cannot be set.
        status.set(target)
