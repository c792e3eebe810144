"""Carries the collection's persistence operations out against a ``Backend``, one log at a time.

The collection (``kestrel_compat.core.collection``) records what the backend must learn, in order:
appends, group commits, group and log deletions, read-behind refills. ``Persister.kick`` routes
them to one worker per log, which runs them strictly in order, batching consecutive appends into
one ``append`` call (a group commit). A worker starts on the next turn of the event loop, so the
operations of every request served in one turn go out together. With a backend that
``completes_at_once`` (``MemoryBackend``) a worker runs in a plain callback
(``kestrel_compat.eager``), and a ``set`` that waits for its own appends (``wait_stored``) before
answering ``STORED`` runs its log's worker itself, at once: no task at all. Group commits are not
waited for (a removal lost in a crash only brings an item back: at-least-once), but a failed one is
retried with a bounded exponential backoff (``limits.commit_retry_*``), so a removal confirmed
during a backend outage is stored once the backend is back even if the queue never changes again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Protocol

from kayos.errors import KayosError
from kestrel_compat import limits
from kestrel_compat.core.collection import (
    AppendOp,
    CommitOp,
    DeleteGroupOp,
    DeleteLogOp,
    PersistOp,
    QueueCollection,
    RefillOp,
)
from kestrel_compat.core.persistence import Backend, BackendError, decode_removed
from kestrel_compat.core.queue import Item, KestrelQueue, LogEntry
from kestrel_compat.eager import start_eagerly

log = logging.getLogger("kestrel_compat.backends.persister")


class Timer(Protocol):
    def cancel(self) -> None: ...


# Starts a timer: ``loop.call_later`` by default, a fake in tests.
CallLater = Callable[[float, Callable[[], None]], Timer]


def commit_retry_delay_s(retry: int, rng: random.Random) -> float:
    """The wait before retry number ``retry`` (1 for the first) of a failed group commit: the
    ceiling doubles from ``commit_retry_delay_ms_min`` up to ``commit_retry_delay_ms_max``, and
    the wait is the ceiling's upper half, drawn uniformly (never zero, never above the ceiling)."""
    assert retry >= 1, retry
    ceiling_ms = min(
        limits.commit_retry_delay_ms_max, limits.commit_retry_delay_ms_min << min(retry - 1, 30)
    )
    delay_ms = ceiling_ms / 2 + rng.random() * ceiling_ms / 2
    assert 0 < delay_ms <= limits.commit_retry_delay_ms_max
    return delay_ms / 1000


class Persister:
    def __init__(
        self,
        backend: Backend,
        collection: QueueCollection,
        *,
        rng: random.Random | None = None,
        call_later: CallLater | None = None,
    ) -> None:
        self.backend = backend
        self.collection = collection
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - backoff jitter
        self._call_later = call_later
        # A backend whose calls never wait (``completes_at_once``) runs outside any task, in the
        # caller; others may need one (aiohttp's timeouts do), so their workers are tasks.
        self._at_once = bool(getattr(backend, "completes_at_once", False))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ops: dict[str, deque[PersistOp]] = {}
        # A log is here while its worker is scheduled or running; the task, once it waits.
        self._workers: dict[str, asyncio.Task[None] | None] = {}
        self._scheduled: dict[str, asyncio.Handle] = {}
        self._stored: dict[LogEntry, asyncio.Future[None]] = {}
        # Failed group commits: the retries made so far and the timer of the next, per queue.
        self._commit_retries: dict[KestrelQueue, int] = {}
        self._retry_timers: dict[KestrelQueue, Timer] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    # --- routing ---

    def kick(self) -> None:
        """Queue every operation the collection recorded; a log with work and no worker gets one,
        which starts on the next turn of the event loop."""
        if not self.collection.outbox:
            return
        for op in self.collection.take_outbox():
            name = op.entry.log if isinstance(op, AppendOp) else _op_log(op)
            ops = self._ops.get(name)
            if ops is None:
                ops = self._ops[name] = deque()
            ops.append(op)
            if name not in self._workers:
                self._idle.clear()
                loop = self._running_loop()
                if self._at_once:
                    self._workers[name] = None
                    self._scheduled[name] = loop.call_soon(self._start, name)
                else:
                    self._workers[name] = loop.create_task(
                        self._run(name), name=f"kestrel-persist-{name}"
                    )

    def _start(self, name: str) -> None:
        """Run the log's scheduled worker now (a backend that completes at once); should the
        backend wait after all, the rest of the worker runs as a task."""
        handle = self._scheduled.pop(name, None)
        if handle is None:
            return  # Already started.
        handle.cancel()
        started = start_eagerly(
            self._run(name), name=f"kestrel-persist-{name}", loop=self._running_loop()
        )
        if isinstance(started, asyncio.Task):
            self._workers[name] = started

    async def wait_stored(self, entries: list[LogEntry]) -> None:
        """Until every entry is durably appended; ``BackendError`` if one failed."""
        self.kick()
        for entry in entries:
            if entry.seq is None and entry.log in self._scheduled:
                self._start(entry.log)
        futures = []
        for entry in entries:
            if entry.seq is not None:
                if entry.seq < 0:
                    raise BackendError("the append holding this item failed")
                continue
            future = self._stored.get(entry)
            if future is None:
                future = self._running_loop().create_future()
                self._stored[entry] = future
            futures.append(future)
        for future in futures:
            await asyncio.shield(future)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        # Kept: asyncio.get_running_loop() costs a getpid system call, and kick runs per request.
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        assert loop.is_running()
        return loop

    async def drain(self) -> None:
        """Until every recorded operation has been carried out (or failed)."""
        self.kick()
        while self._workers:
            await self._idle.wait()
            self.kick()

    def close(self) -> None:
        """The server stops: no more retries of failed group commits."""
        for timer in self._retry_timers.values():
            timer.cancel()
        self._retry_timers.clear()
        self._commit_retries.clear()

    # --- the per-log worker ---

    async def _run(self, name: str) -> None:
        ops = self._ops[name]
        try:
            while ops:
                op = ops[0]
                if isinstance(op, AppendOp):
                    batch: list[LogEntry] = []
                    while (
                        ops
                        and isinstance(ops[0], AppendOp)
                        and len(batch) < limits.append_batch_entries_max
                    ):
                        head = ops.popleft()
                        assert isinstance(head, AppendOp)
                        batch.append(head.entry)
                    await self._append(name, batch)
                else:
                    ops.popleft()
                    await self._apply(name, op)
                self.kick()
        finally:
            del self._workers[name]
            if not ops:
                self._ops.pop(name, None)
            if not self._workers:
                self._idle.set()

    async def _append(self, name: str, batch: list[LogEntry]) -> None:
        try:
            seqs = await self.backend.append(name, [entry.new_entry() for entry in batch])
            if len(seqs) != len(batch):
                raise BackendError(f"append of {len(batch)} entries returned {len(seqs)} seqs")
        except Exception as error:  # The backend boundary: every failure becomes BackendError.
            failure = error if isinstance(error, KayosError) else BackendError(repr(error))
            log.error("append to %r failed: %s", name, failure)
            for entry in batch:
                self._settle(entry, failure)
            return
        for entry, seq in zip(batch, seqs, strict=True):
            self.collection.assign_seqs(entry, seq)
            self._settle(entry, None)

    def _settle(self, entry: LogEntry, error: KayosError | None) -> None:
        future = self._stored.pop(entry, None)
        if future is None:
            if error is not None:
                entry.seq = -1  # Marks the failure for a waiter that arrives later.
            return
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    async def _apply(self, name: str, op: PersistOp) -> None:
        if isinstance(op, CommitOp):
            await self._commit(name, op.queue)
            return
        if isinstance(op, RefillOp):
            await self._refill(name, op.queue)
            return
        try:
            if isinstance(op, DeleteGroupOp):
                await self.backend.delete_group(op.log, op.group)
            elif isinstance(op, DeleteLogOp) and not any(
                queue.log == name for queue in self.collection.queues.values()
            ):
                await self.backend.delete_log(op.log)
        except Exception as error:  # The backend boundary.
            log.error("persisting %r on %r failed: %r", op, name, error)

    async def _commit(self, name: str, queue: KestrelQueue) -> None:
        if not self._is_live(queue):
            queue.ledger.commit_queued = False
            return
        state = self.collection.group_state(queue)
        if state == queue.ledger.committed:
            return
        try:
            await self.backend.commit_group(name, queue.name, state)
        except Exception as error:  # The backend boundary; retried after a backoff.
            log.error("committing group %r of %r failed: %r", queue.name, name, error)
            self._schedule_commit_retry(queue)
            return
        queue.ledger.committed = state
        if self._commit_retries:
            self._commit_retries.pop(queue, None)

    async def _refill(self, name: str, queue: KestrelQueue) -> None:
        """Read-behind: page the queue's next items in from its log, up to its memory bound.
        This log's worker runs it after every append queued before it, so each behind entry
        queued earlier has its seq (docs/kestrel-compat.md §10)."""
        after = queue.ledger.behind_after
        if after is None or not self._is_live(queue) or queue.closed:
            queue.refill_pending = False
            return
        budget = queue.config.max_memory_size_bytes - queue.bytes
        found: list[Item] = []
        wanted = queue.behind_items
        scanned = after
        log_done = False
        try:
            # At least one item, whatever the bound: the memory part is never left empty.
            while len(found) < wanted and (budget > 0 or not found):
                entries = await self.backend.read(name, scanned, limits.recovery_read_entries)
                if not entries:
                    # Nothing more in the log: with no append of this log still queued, the
                    # counters were off (an append failed) and nothing is behind.
                    log_done = not any(isinstance(op, AppendOp) for op in self._ops.get(name, ()))
                    break
                for entry in entries:
                    if queue.name in entry.groups and not queue.ledger.is_removed(entry.seq):
                        if (budget <= 0 and found) or len(found) >= wanted:
                            break
                        found.append(
                            Item(entry.value, entry.add_ms, entry.expiry_ms, seq=entry.seq)
                        )
                        budget -= len(entry.value)
                    scanned = entry.seq
        except Exception as error:  # The backend boundary: the next fetch asks again.
            log.error("read-behind refill of %r failed: %r", queue.name, error)
            queue.refill_pending = False
            return
        queue.page_in(found, scanned, log_done)
        self.kick()

    def _is_live(self, queue: KestrelQueue) -> bool:
        if self.collection.queues.get(queue.name) is not queue:
            return False  # deleted (or deleted and made anew)
        # A stop closes every queue before the last commits are drained: removals confirmed
        # just before it must still be written, or a restart would serve them again.
        return not queue.closed or self.collection.shutting_down

    # --- retries of failed group commits ---

    def _schedule_commit_retry(self, queue: KestrelQueue) -> None:
        # A removal confirmed while the backend fails is in the ledger only; without a retry it
        # would reach the backend only with the queue's next change, and an idle queue would
        # serve it again after a crash. One timer per queue at a time; the delay is bounded.
        if queue in self._retry_timers:
            return
        retry = self._commit_retries.get(queue, 0) + 1
        self._commit_retries[queue] = retry
        delay_s = commit_retry_delay_s(retry, self._rng)
        call_later = self._call_later or self._running_loop().call_later
        self._retry_timers[queue] = call_later(delay_s, lambda: self._retry_commit(queue))

    def _retry_commit(self, queue: KestrelQueue) -> None:
        self._retry_timers.pop(queue, None)
        if not self._is_live(queue):
            self._commit_retries.pop(queue, None)
            return
        self.collection.mark_dirty(queue)
        self.kick()

    # --- start-up ---

    async def recover(self) -> int:
        """Rebuild every queue the backend knows; returns the number of items restored."""
        restored = 0
        for name in await self.backend.list_logs():
            groups = await self.backend.list_groups(name)
            if not groups:
                await self.backend.delete_log(name)
                continue
            restored += await self._recover_log(name, groups)
        self.kick()
        await self.drain()
        return restored

    async def _recover_log(self, name: str, groups: list[str]) -> int:
        collection = self.collection
        queues: dict[str, KestrelQueue] = {}
        floor: int | None = None
        tail = await self.backend.last_seq(name)
        for group in groups:
            state = await self.backend.load_group(name, group)
            if state is None:
                continue
            removed = decode_removed(state.hwm, state.blob)
            queues[group] = collection.restore_queue(group, state, removed)
            floor = state.hwm if floor is None else min(floor, state.hwm)
            tail = max(tail, state.hwm)
        collection.log_tails[name] = max(collection.log_tails.get(name, 0), tail)
        if floor is None:
            return 0
        restored = 0
        after = floor
        while True:
            entries = await self.backend.read(name, after, limits.recovery_read_entries)
            if not entries:
                return restored
            for entry in entries:
                for group in entry.groups:
                    queue = queues.get(group)
                    if queue is None or queue.ledger.is_removed(entry.seq):
                        continue
                    queue.restore(Item(entry.value, entry.add_ms, entry.expiry_ms, seq=entry.seq))
                    restored += 1
                collection.log_tails[name] = max(collection.log_tails[name], entry.seq)
            after = entries[-1].seq


def _op_log(op: PersistOp) -> str:
    if isinstance(op, CommitOp | RefillOp):
        return op.queue.log
    if isinstance(op, DeleteGroupOp | DeleteLogOp):
        return op.log
    return op.entry.log
