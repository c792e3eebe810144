"""What a replica writes down of its progress: the commit point in its store, the durable mark
beside it, and the time index file.

``PersistedProgress`` holds the commit point a member below the head writes into its store's local
metadata (a restarted tail serves what was committed before it stopped), the durable mark beside
the store (docs/storage-format.md, "Beside the store (`durable-mark`)": how far the store was known
to hold the committed history, across re-makes and restarts) with what the replica decides about it
when it opens, and the time index file. Apart from ``kayos.replication.shard.replica`` because it
is one seam of the replica: written now and then from the node's loops, read back only on open.
``kayos.replication.shard.replica.ShardReplica`` inherits it and sets every attribute declared
here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kayos import limits
from kayos.clock import Clock
from kayos.replication.logic import chain, durablemark, timeindex
from kayos.replication.shard.local_meta import COMMIT_POINT_META_KEY
from kayos.storage import ShardStore

log = logging.getLogger("kayos.replication")


class PersistedProgress:
    """The commit point, durable mark and time index written down (see the module's docstring)."""

    # The replica's state this uses (``ShardReplica.__init__`` sets it).
    clock: Clock
    store: ShardStore
    store_path: str
    upstream: str | None
    repairing: bool
    progress: chain.Progress
    time_index: timeindex.TimeIndex
    _mark_written: int
    _point_persisted: int
    _time_index_written_s: float

    if TYPE_CHECKING:
        # The replica's methods this uses (``ShardReplica`` defines them).
        @property
        def shard_id(self) -> int: ...

    @property
    def commit_point_persisted(self) -> int:
        """The commit point last written to the store (members below the head; 0 at a head)."""
        return self._point_persisted

    @property
    def marked_committed(self) -> int:
        """The seq the durable mark beside the store names: what this store was known to hold
        committed, across re-makes and restarts (docs/storage-format.md)."""
        return self._mark_written

    def _settle_mark_on_open(self, *, alone: bool) -> None:
        """Raises the durable mark to what the store is known to hold committed as it opens, and
        keeps the store's ``alone`` key in step with whether the replica runs as a chain of one
        (``alone``). A chain of one commits all it holds: its mark says so at once, so a re-make
        that adds a downstream (commit point 0 again) still knows what it acknowledged
        (``kayos.replication.shard.lostcommit``)."""
        ran_alone = self.store.meta.get(durablemark.ALONE_META_KEY) is not None
        mark = durablemark.known_on_open(
            self.progress.commit_point, self.store.last_seq, ran_alone=ran_alone
        )
        if mark > self._mark_written and not self.repairing:
            self._write_mark_now(mark)
        if alone and not ran_alone:
            self.store.commit([], meta={durablemark.ALONE_META_KEY: 1})
        elif ran_alone and not alone and (self.repairing or self._mark_written >= mark):
            self.store.commit([], meta={durablemark.ALONE_META_KEY: None})

    def _write_mark_now(self, mark: int) -> None:
        try:
            durablemark.write(self.store_path, mark)
        except OSError as exc:
            log.warning("shard %s: durable mark not written: %s", self.shard_id, exc)
            return
        self._mark_written = mark

    def commit_point_to_persist(self) -> int | None:
        """The commit point to write down now, or None: only members below the head keep one,
        and only when it moved since it was last written."""
        if self.upstream is None or self.progress.commit_point <= self._point_persisted:
            return None
        return self.progress.commit_point

    async def persist_commit_point(self) -> None:
        """Writes the commit point into the store's local metadata (no seq, never replicated), so
        a restarted tail serves what was committed before it stopped; then the durable mark."""
        point = self.commit_point_to_persist()
        if point is not None:
            await asyncio.to_thread(self.store.commit, [], meta={COMMIT_POINT_META_KEY: point})
            self._point_persisted = max(self._point_persisted, point)
        await self.persist_durable_mark()

    async def persist_durable_mark(self) -> None:
        """Raises the durable mark beside the store (docs/storage-format.md) to what this store
        holds of the committed history; left alone while the store repairs what it lost."""
        mark = min(self.progress.commit_point, self.store.last_seq)
        if self.repairing or mark <= self._mark_written:
            return
        await asyncio.to_thread(self._write_mark_now, mark)

    async def set_durable_mark(self, seq: int) -> None:
        """Writes ``seq`` into the durable mark whatever it held (a head stepping down to repair
        records the commit point its downstream named); an ``OSError`` is raised."""
        await asyncio.to_thread(durablemark.write, self.store_path, seq)
        self._mark_written = seq

    def lower_durable_mark(self, seq: int) -> None:
        """A rollback to ``seq`` the replica accepted: the mark follows it down."""
        if self._mark_written > seq:
            durablemark.write(self.store_path, seq)
            self._mark_written = seq

    async def persist_time_index(self, *, force: bool = False) -> None:
        """Writes the time index file when it changed, at most every
        ``limits.time_index_persist_interval_ms`` unless ``force``d (the node stops)."""
        now = self.clock.monotonic_s()
        due = now - self._time_index_written_s >= limits.time_index_persist_interval_ms / 1000
        if self.time_index.dirty and (force or due):
            self._time_index_written_s = now
            raw = self.time_index.encode()
            try:
                await asyncio.to_thread(timeindex.write, self.store_path, raw)
            except OSError as exc:
                self.time_index.dirty = True
                log.warning("shard %s: time index not written: %s", self.shard_id, exc)
