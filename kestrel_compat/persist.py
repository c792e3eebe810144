"""Carries the collection's persistence operations out against a ``Backend``, one log at a time.

The collection (``kestrel_compat.engine``) records what the backend must learn, in order: appends,
group commits, group and log deletions. ``Persister.kick`` routes them to one worker task per log,
which runs them strictly in order, batching consecutive appends into one ``append`` call (a group
commit). A ``set`` waits for its own appends (``wait_stored``) before answering ``STORED``; group
commits are not waited for (a removal lost in a crash only brings an item back: at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from kayos.errors import KayosError
from kestrel_compat import limits
from kestrel_compat.backend import Backend, BackendError, decode_removed
from kestrel_compat.engine import (
    AppendOp,
    CommitOp,
    DeleteGroupOp,
    DeleteLogOp,
    Item,
    KestrelQueue,
    LogEntry,
    PersistOp,
    QueueCollection,
)

log = logging.getLogger("kestrel_compat.persist")


class Persister:
    def __init__(self, backend: Backend, collection: QueueCollection) -> None:
        self.backend = backend
        self.collection = collection
        self._ops: dict[str, deque[PersistOp]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._stored: dict[LogEntry, asyncio.Future[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    # --- routing ---

    def kick(self) -> None:
        """Queue every operation the collection recorded and make sure a worker runs for each
        log that has work."""
        for op in self.collection.take_outbox():
            name = op.entry.log if isinstance(op, AppendOp) else _op_log(op)
            self._ops.setdefault(name, deque()).append(op)
            if name not in self._workers:
                self._idle.clear()
                self._workers[name] = asyncio.get_running_loop().create_task(
                    self._run(name), name=f"kestrel-persist-{name}"
                )

    async def wait_stored(self, entries: list[LogEntry]) -> None:
        """Until every entry is durably appended; ``BackendError`` if one failed."""
        self.kick()
        loop = asyncio.get_running_loop()
        futures = []
        for entry in entries:
            if entry.seq is not None:
                if entry.seq < 0:
                    raise BackendError("the append holding this item failed")
                continue
            future = self._stored.get(entry)
            if future is None:
                future = loop.create_future()
                self._stored[entry] = future
            futures.append(future)
        for future in futures:
            await asyncio.shield(future)

    async def drain(self) -> None:
        """Until every recorded operation has been carried out (or failed)."""
        self.kick()
        while self._workers:
            await self._idle.wait()
            self.kick()

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
        try:
            if isinstance(op, CommitOp):
                if op.queue.closed or self.collection.queues.get(op.queue.name) is not op.queue:
                    op.queue.ledger.commit_queued = False
                    return
                state = self.collection.group_state(op.queue)
                await self.backend.commit_group(name, op.queue.name, state)
            elif isinstance(op, DeleteGroupOp):
                await self.backend.delete_group(op.log, op.group)
            elif isinstance(op, DeleteLogOp) and not any(
                queue.log == name for queue in self.collection.queues.values()
            ):
                await self.backend.delete_log(op.log)
        except Exception as error:  # The backend boundary; the next change retries the commit.
            log.error("persisting %r on %r failed: %r", op, name, error)

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
    if isinstance(op, CommitOp):
        return op.queue.log
    if isinstance(op, DeleteGroupOp | DeleteLogOp):
        return op.log
    return op.entry.log
