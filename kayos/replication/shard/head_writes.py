"""The head's write pipeline of a shard replica: checks, seqs, group commits, a new history.

``HeadWrites`` holds what only a head does with a write: the checks before a batch takes seqs
(role, repair, write hold, a failed commit, disk space), the seqs it takes, the group commit of
the batches that queue while the store is busy (``_write_loop``), and the new history a head
starts after a commit failed; with them the timed store commits every member uses
(``timed_commit``, ``settle``), and the producer windows that make a resend of an idempotent
producer's call find the first one (``kayos.replication.logic.producers``). Apart from
``kayos.replication.shard.replica`` because it is one seam of the replica, a queue of writes and
its worker, that the rest of the replica only feeds through ``accept`` and ``local_commit_done``.
``kayos.replication.shard.replica.ShardReplica`` inherits it and sets every attribute declared
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from kayos import limits
from kayos.clock import Clock
from kayos.errors import (
    DiskFullError,
    InvalidRequest,
    StorageError,
    UnavailableError,
    WrongRoleError,
)
from kayos.replication.logic import chain, pacing, timeindex
from kayos.replication.logic.producers import ProducerTable
from kayos.replication.shard.local_meta import ROLLED_BACK_META_KEY
from kayos.replication.wire import frames as fr
from kayos.storage import CommitResult, ShardStore
from kayos.storage.engine import prepare_columns
from kayos.topology import ShardChain, Topology

log = logging.getLogger("kayos.replication")

Columns: TypeAlias = tuple[
    tuple[bytes, ...],
    tuple[bytes | None, ...],
    tuple[int, ...] | None,
    tuple[dict[str, bytes] | None, ...] | None,
]


def concat_columns(parts: list[Columns]) -> Columns:
    """One set of columns for several batches, in order (a group commit, a merged forward)."""
    if len(parts) == 1:
        return parts[0]
    keys = tuple(itertools.chain.from_iterable(p[0] for p in parts))
    values = tuple(itertools.chain.from_iterable(p[1] for p in parts))
    expiries: tuple[int, ...] | None = None
    if any(p[2] is not None for p in parts):
        expiries = tuple(
            itertools.chain.from_iterable(
                p[2] if p[2] is not None else (0,) * len(p[0]) for p in parts
            )
        )
    headers: tuple[dict[str, bytes] | None, ...] | None = None
    if any(p[3] is not None for p in parts):
        headers = tuple(
            itertools.chain.from_iterable(
                p[3] if p[3] is not None else (None,) * len(p[0]) for p in parts
            )
        )
    return keys, values, expiries, headers


def commit_args(
    batches: list[fr.Batch], *, validated: bool, extra_meta: dict[str, Any] | None = None
) -> tuple[Columns, dict[str, Any]]:
    """The one store commit of consecutive accepted batches: their columns, their explicit seqs,
    the log range they cover and their metadata changes in order (``extra_meta`` last)."""
    columns = concat_columns([(b.keys, b.values, b.expiries_ms, b.headers) for b in batches])
    seqs = (
        batches[0].seqs
        if len(batches) == 1
        else tuple(itertools.chain.from_iterable(b.seqs for b in batches))
    )
    meta: dict[str, Any] = {}
    for batch in batches:
        if batch.meta:
            meta.update(batch.meta)
    if extra_meta:
        meta.update(extra_meta)
    options = {
        "seqs": seqs,
        "last_seq": batches[-1].last_seq,
        "meta": meta or None,
        "validated": validated,
    }
    return columns, options


@dataclass(slots=True)
class _Write:
    batch: fr.Batch
    payload: int
    future: asyncio.Future[CommitResult]


class HeadWrites:
    """The head's writes and the store commits of one replica (see the module's docstring)."""

    # The replica's state this uses (``ShardReplica.__init__`` sets it).
    node_id: str
    topology: Topology
    shard: ShardChain
    clock: Clock
    store: ShardStore
    role: str | None
    repairing: bool
    # The write hold's end (``writes_held_until_s``) and the writes waiting for it.
    _held_until_s: float
    _hold_waiters: list[asyncio.Future[None]]
    disk_full: bool
    last_entry_seq: int
    time_index: timeindex.TimeIndex
    commit_observer: Callable[[float], None] | None
    live_rate: pacing.LiveRate
    _writes: deque[_Write]
    _writer: asyncio.Task[None] | None
    _next_seq: int
    _write_failure: BaseException | None
    _commit_in_flight: asyncio.Future[CommitResult] | None
    # The group ``_write_loop`` is committing (the writes it took off ``_writes``).
    _committing: list[_Write]
    progress: chain.Progress
    # The producer windows while this replica leads; None: built from the store at the next
    # write that names a producer (``forget_producers``).
    producer_table: ProducerTable | None

    if TYPE_CHECKING:
        # The replica's methods this uses (``ShardReplica`` defines them).
        @property
        def shard_id(self) -> int: ...

        @property
        def epoch(self) -> int: ...

        async def become_head(self) -> None: ...

        def _apply_events(self, *events: chain.Event) -> None: ...

        def local_commit_done(self) -> None: ...

        def accept(self, batch: fr.Batch, size_bytes: int, *, live: bool = True) -> None: ...

        def forget_recent(self) -> None: ...

        def run_in_background(self, work: Coroutine[Any, Any, None]) -> None: ...

        def close_downstream_links(self) -> None: ...

    # --- writes at the head --------------------------------------------------------------------

    @property
    def writes_held_until_s(self) -> float:
        """The end of the head's write hold on the shard (monotonic s; -inf: none)."""
        return self._held_until_s

    @writes_held_until_s.setter
    def writes_held_until_s(self, until_s: float) -> None:
        self._held_until_s = until_s
        waiters, self._hold_waiters = self._hold_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def writes_waiting_for_hold(self) -> int:
        """Writes waiting for the write hold to end (``wait_out_hold``)."""
        return sum(1 for waiter in self._hold_waiters if not waiter.done())

    async def wait_out_hold(self) -> None:
        """A write that finds the hold in force waits here for its end (docs/node-api.md,
        "Writes after a head change"): as long as the hold had left when it came, or until the
        hold changes (the leader's word shortens it), and again after a change that leaves some.
        ``check_head`` then judges the write as it stands."""
        while self.role == "head":
            held_s = self._held_until_s - self.clock.monotonic_s()
            if held_s <= 0:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._hold_waiters.append(waiter)
            try:
                # A hold until the lease (a restart) has no end of its own: a write waits a
                # lease's length for it, then is answered ``unavailable`` to retry.
                await asyncio.wait_for(waiter, min(held_s, limits.head_lease_ms / 1000))
            except TimeoutError:
                return

    def check_head(self) -> None:
        if self.role != "head":
            head = self.topology.nodes[self.shard.head]
            raise WrongRoleError(
                f"node {self.node_id} is not the head of shard {self.shard_id}",
                redirect=head.id,
                epoch=self.epoch,
            )
        if self.repairing:
            raise UnavailableError(
                f"{self.node_id} is repairing its store of shard {self.shard_id}; retry later"
            )
        held_s = self.writes_held_until_s - self.clock.monotonic_s()
        if math.isinf(held_s) and held_s > 0:
            raise UnavailableError(
                f"{self.node_id} holds writes to shard {self.shard_id} until it holds its lease"
                " from the manager: it started again, and its chains may have changed meanwhile"
            )
        if held_s > 0:
            raise UnavailableError(
                f"{self.node_id} holds writes to shard {self.shard_id} for {held_s * 1000:.0f} ms"
                " more: it took over from another head, whose lease from the manager ends first"
            )

    @property
    def starting_new_history(self) -> bool:
        """A head commit failed and the takeover entry that starts the new history is not down
        yet: no seq is given out, and no downstream may subscribe (it would record the old
        takeover table)."""
        return self._write_failure is not None

    def _check_writable(self) -> None:
        if isinstance(self._write_failure, DiskFullError):
            raise DiskFullError(
                f"shard {self.shard_id}: the disk of head {self.node_id} is full; writes resume "
                "by themselves once space is freed"
            )
        if self._write_failure is not None:
            raise StorageError(
                f"shard {self.shard_id}: a commit failed on head {self.node_id} "
                f"({self._write_failure}); writes resume once it starts a new history"
            )

    def _check_space(self, payload: int) -> None:
        """Refuses a head write (``DiskFullError``) before it takes a seq when the disk is too
        full for it with ``limits.disk_head_margin_bytes`` to spare (docs/retention.md)."""
        try:
            self.store.check_space(
                2 * payload + limits.disk_head_margin_bytes, self.store.options.disk_reserve_bytes
            )
        except DiskFullError:
            self.disk_full = True
            raise

    def _take_seqs(self, count: int) -> tuple[int, int]:
        first = self._next_seq
        self._next_seq = first + count
        return first, first + count - 1

    async def commit_ops(
        self, columns: Columns, producer: tuple[bytes, int] | None = None
    ) -> CommitResult:
        """Commits one all-or-nothing batch at the head and returns its seq range once it is
        durable here.

        The batch gets its seqs and goes down the chain at once; its store commit runs at the
        same time. Batches that arrive while the store is busy are committed together in one
        store commit (the node's group commit: one worker thread, one fsync); each keeps its own
        consecutive seq range. ``columns`` (stored keys, values, expiries, headers) go to the
        store and down the chain as they are, without a read-back.

        ``producer`` (id, seq) names an idempotent producer's call (docs/node-api.md,
        "Idempotent producers"): one this head holds is not written again and answers the seqs
        it got, once durable here; a new one is recorded in the batch's metadata. The look-up
        and the record run in this one step of the event loop, with the seqs given out."""
        if self._held_until_s > self.clock.monotonic_s():  # no await on the write path otherwise
            await self.wait_out_hold()
        self.check_head()
        self._check_writable()
        # A bad batch fails alone, before it takes seqs; the store need not check it again.
        payload = prepare_columns(*columns).payload_bytes
        if not columns[0]:
            raise InvalidRequest("a batch needs at least one entry")
        table = None
        if producer is not None:
            table = self.producer_table
            if table is None:
                table = self._load_producers()
            written = table.lookup(*producer)
            if written is not None:
                return await self.written_before(*written)
        self._check_space(payload)
        first, last = self._take_seqs(len(columns[0]))
        meta = None
        if table is not None and producer is not None:
            meta = table.record(producer[0], producer[1], first, last)
        # Unchecked: prepare_columns checked the columns, and the seqs are made right here.
        batch = fr.Batch.unchecked(
            self.shard_id, first, last, True, tuple(range(first, last + 1)), *columns, meta
        )
        return await self._head_write(batch, payload)

    def _load_producers(self) -> ProducerTable:
        """The producer windows the store holds (no write of this head is in flight when the
        table is missing: it is dropped only when none can be). Entries past a rollback that kept
        a newer map name dropped seqs and are left out."""
        meta = self.store.meta
        rolled_back = meta.get(ROLLED_BACK_META_KEY)
        seq_max = rolled_back if isinstance(rolled_back, int) else self.store.last_seq
        self.producer_table = ProducerTable.from_meta(meta, seq_max=seq_max)
        return self.producer_table

    def forget_producers(self) -> None:
        """The store changed under the head's table (a new history, a rollback, a reset, a
        repair): it is built again from the store at the next write that names a producer."""
        self.producer_table = None

    async def written_before(self, first: int, last: int) -> CommitResult:
        """A resend of a call this head wrote at ``first..last``: that range once durable here.
        The first copy's store commit may still be under way (queued, or in the group being
        committed): the resend waits for it and fails as it does."""
        if self.progress.durable >= last:
            return CommitResult(first, last, 0)
        for write in itertools.chain(self._committing, self._writes):
            if write.batch.first_seq == first:
                result = await asyncio.shield(write.future)
                return CommitResult(first, last, result.commit_no)
        # Not reachable while the table tracks the store (a write is durable, queued or being
        # committed); a retry finds the call durable or the table rebuilt.
        raise UnavailableError(
            f"shard {self.shard_id}: the first copy of this call (seqs {first}..{last}) is "
            "neither durable nor being committed here; retry"
        )

    async def commit_meta(self, meta: dict[str, Any]) -> CommitResult:
        """A metadata-only write (a consumer high-water mark) with a seq of its own, so it rides
        the replication stream like any other commit."""
        if self._held_until_s > self.clock.monotonic_s():  # no await on the write path otherwise
            await self.wait_out_hold()
        self.check_head()
        self._check_writable()
        self._check_space(64 * len(meta))
        seq, _ = self._take_seqs(1)
        batch = fr.Batch(self.shard_id, seq, seq, True, (), (), (), None, None, meta)
        return await self._head_write(batch, 64 * len(meta))

    async def _head_write(self, batch: fr.Batch, payload: int) -> CommitResult:
        self.accept(batch, payload)
        idle = (self._writer is None or self._writer.done()) and not self._writes
        if idle and len(batch.seqs) <= limits.inline_commit_entries_max:
            # Nothing to group with: commit right here (the batch is on its way down already).
            columns, options = commit_args([batch], validated=True)
            try:
                result = self._commit_now(columns, **options)
            except Exception as exc:
                self._head_commit_failed(exc)
                raise
            self.last_entry_seq = max(self.last_entry_seq, batch.last_seq)
            self.local_commit_done()
            return CommitResult(batch.first_seq, batch.last_seq, result.commit_no)
        future: asyncio.Future[CommitResult] = asyncio.get_running_loop().create_future()
        self._writes.append(_Write(batch, payload, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_loop())
        return await future

    async def _write_loop(self) -> None:
        writes = self._writes
        while writes:
            group = [writes.popleft()]
            entries = len(group[0].batch.seqs)
            payload = group[0].payload
            # Within the store's batch bounds, so the merged batch needs no second check.
            while writes and (
                entries + len(writes[0].batch.seqs) <= limits.batch_entries_max
                and payload + writes[0].payload <= limits.batch_bytes_max
            ):
                write = writes.popleft()
                group.append(write)
                entries += len(write.batch.seqs)
                payload += write.payload
            columns, options = commit_args([w.batch for w in group], validated=True)
            self._committing = group
            try:
                result = await self.timed_commit(columns, inline=not writes, **options)
            except Exception as exc:  # every batch of the group failed with it
                self._head_commit_failed(exc)
                for write in group:
                    if not write.future.done():
                        write.future.set_exception(exc)
                continue
            finally:
                self._committing = []
            self.last_entry_seq = max(self.last_entry_seq, group[-1].batch.last_seq)
            self.local_commit_done()
            for write in group:
                if not write.future.done():
                    write.future.set_result(
                        CommitResult(write.batch.first_seq, write.batch.last_seq, result.commit_no)
                    )

    def _head_commit_failed(self, exc: BaseException) -> None:
        """A head commit failed after its batch went down the chain: the seqs given out since the
        last durable one are lost here but may be held below. No seq is given out again until a
        new takeover entry marks where the new history starts, so the divergence rule rolls the
        downstreams back; every write queued behind fails with this one."""
        if self._write_failure is not None:
            return
        log.error("shard %s: head commit failed: %s", self.shard_id, exc)
        self._write_failure = exc
        self.fail_queued_writes(exc)
        # The windows record calls whose seqs are lost: the next table is the store's.
        self.forget_producers()
        self.time_index.truncate_after(self.store.last_seq)
        self._apply_events(chain.Discarded())
        self.forget_recent()
        self.close_downstream_links()
        self.run_in_background(self._start_new_history())

    def fail_queued_writes(self, exc: BaseException) -> None:
        """Fails every head write queued for the store with ``exc``."""
        while self._writes:
            write = self._writes.popleft()
            if not write.future.done():
                write.future.set_exception(exc)

    async def wait_for_writer(self) -> None:
        """Returns once the head's group-commit loop, if one runs, has ended."""
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.wait([writer])

    async def _start_new_history(self) -> None:
        writer = self._writer
        if writer is not None and writer is not asyncio.current_task():
            with contextlib.suppress(Exception):
                await asyncio.shield(writer)
        try:
            await self._become_head_when_space()
        except Exception as exc:
            log.error(
                "shard %s: head cannot start a new history (%s); writes stay refused until the "
                "node restarts",
                self.shard_id,
                exc,
            )
            return
        self.local_commit_done()
        self._write_failure = None
        log.warning("shard %s: head resumes writes at seq %s", self.shard_id, self._next_seq)

    async def _become_head_when_space(self) -> None:
        """``become_head``, tried again every ``limits.disk_full_retry_ms`` while the disk is
        full (until the replica closes, which cancels this task), so that writes resume by
        themselves once space is freed."""
        while True:
            try:
                await self.become_head()
            except DiskFullError:
                self.disk_full = True
                await asyncio.sleep(limits.disk_full_retry_ms / 1000)
                continue
            self.disk_full = False
            return

    def _commit_landed(self, started: float) -> None:
        """A store commit begun at ``started`` (``time.perf_counter``) landed: the disk had room,
        and the commit observer and the copy pacer's counter get its duration."""
        self.disk_full = False
        took_s = time.perf_counter() - started
        self.live_rate.note_commit(self.clock.monotonic_s(), took_s)
        if self.commit_observer is not None:
            self.commit_observer(took_s)

    def _commit_now(self, columns: Columns, **options: Any) -> CommitResult:
        """A store commit on the event loop (small ones only: it blocks for one fsync)."""
        started = time.perf_counter()
        try:
            result = self.store.commit_columns(*columns, **options)
        except DiskFullError:
            self.disk_full = True
            raise
        self._commit_landed(started)
        return result

    async def timed_commit(
        self, columns: Columns, *, inline: bool = False, **options: Any
    ) -> CommitResult:
        """A store commit of ``columns`` (``ShardStore.commit_columns``, which ``options`` go
        to) in a worker thread; ``inline`` runs a small one on the event loop instead (when
        nothing else waits, the thread hand-off costs more than the commit)."""
        if inline and len(columns[0]) <= limits.inline_commit_entries_max:
            return self._commit_now(columns, **options)
        started = time.perf_counter()
        future = asyncio.ensure_future(
            asyncio.to_thread(self.store.commit_columns, *columns, **options)
        )
        self._commit_in_flight = future
        try:
            result = await asyncio.shield(future)
        except DiskFullError:
            self.disk_full = True
            raise
        self._commit_landed(started)
        return result

    async def settle(self) -> None:
        """Returns once no store commit of this replica runs in a worker thread any more (one
        whose awaiting task was cancelled still lands), and counts what landed."""
        future = self._commit_in_flight
        if future is not None:
            if not future.done():
                await asyncio.wait([future])
            if not future.cancelled():
                future.exception()  # retrieved: its task, if still alive, raised it already
        self.local_commit_done()
