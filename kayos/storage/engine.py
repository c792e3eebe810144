"""The shard store: group commit, reads, rollback and the hooks compaction drives.

Threads: any number of threads may call ``commit`` at once; one of them becomes the leader
and writes every queued batch in one group commit (one write, one fdatasync), the others wait for
their result. Readers (snapshots, ``get``) never take the commit lock: nodes are immutable once
written and the current (file, header) pair is swapped atomically.

The rest of the store lives beside it: value types (kayos.storage.records), data files and
headers (kayos.storage.disk.datafile), batch checks (kayos.storage.batch), the group commit's layout
(kayos.storage.group), snapshots (kayos.storage.reads) and open/recovery
(kayos.storage.recovery). The names other modules import from here are re-exported.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from itertools import repeat
from operator import lt
from typing import TYPE_CHECKING, Any

from kayos import limits
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import (
    DiskFullError,
    InvalidRequest,
    LimitExceeded,
    RollbackTooFarError,
    StorageError,
    StoreClosedError,
)
from kayos.storage.batch import (
    BatchColumns,
    ops_to_columns,
    prepare_columns,
    validate_meta,
    validate_ops,
)
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import (
    DATA_PREFIX,
    DATA_SUFFIX,
    SNAPSHOT_SUFFIX,
    DataFile,
    _Current,
    data_file_name,
    find_last_header,
    header_end,
    header_with,
    parse_generation,
    read_header_at,
    region_matches,
)
from kayos.storage.disk.fileops import OS_FILEOPS, FileHandle, FileOps, free_bytes
from kayos.storage.disk.headerwalk import meta_as_of
from kayos.storage.disk.index import DerivedIndex
from kayos.storage.group import (
    _add_stored_values,
    _extend_column,
    _GroupBuild,
    _Pending,
    _seq_problem,
    _supersede,
)
from kayos.storage.reads import Snapshot, _entry_at
from kayos.storage.records import (
    CommitResult,
    Delete,
    Entry,
    Op,
    Put,
    RecoveryReport,
    StoreOptions,
)
from kayos.storage.recovery import StoreRecovery

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "DATA_PREFIX",
    "DATA_SUFFIX",
    "SNAPSHOT_SUFFIX",
    "BatchColumns",
    "CommitResult",
    "DataFile",
    "Delete",
    "Entry",
    "Op",
    "Put",
    "RecoveryReport",
    "ShardStore",
    "Snapshot",
    "StoreOptions",
    "data_file_name",
    "find_last_header",
    "header_end",
    "header_with",
    "ops_to_columns",
    "parse_generation",
    "prepare_columns",
    "read_header_at",
    "region_matches",
    "validate_meta",
    "validate_ops",
]

log = logging.getLogger("kayos.storage")

# Each retry needs a whole compaction to swap files between two reads of _current; the bound
# only turns a livelock bug into an error.
_PIN_ATTEMPTS_MAX = 100
# The zero padding before a header block, for its CRC (a view: no copy per commit).
_ZERO_BLOCK = memoryview(bytes(fmt.BLOCK))


class ShardStore(StoreRecovery):
    """One shard's store (docs/storage-format.md). Open with ``ShardStore.open(path)``."""

    def __init__(
        self,
        directory: str,
        *,
        fileops: FileOps,
        clock: Clock,
        options: StoreOptions,
    ) -> None:
        self.directory = directory
        self._ops = fileops
        self._clock = clock
        self.options = options
        self._write_lock = threading.RLock()
        self._cv = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._leader_active = False
        self._poisoned: BaseException | None = None
        self._closed = False
        self._rollbacks: list[tuple[int, int]] = []  # (rollback epoch, target seq)
        self._commits_since_checkpoint = 0
        self.recovery = RecoveryReport()
        self._current: _Current
        self._edge: btree.Edge
        self._index: DerivedIndex
        self.compactions = 0
        self._last_header_block = 0
        # The seq of each metadata key's last change since the store opened (in memory only; a
        # key unchanged since counts as changed at the seq the store opened at): a tail serves a
        # group's mark only once the commit point covers the seq that wrote it.
        self._meta_seqs: dict[str, int] = {}
        self._meta_floor = 0

    # --- open -----------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str,
        *,
        fileops: FileOps = OS_FILEOPS,
        clock: Clock = SYSTEM_CLOCK,
        options: StoreOptions | None = None,
    ) -> ShardStore:
        store = cls(directory, fileops=fileops, clock=clock, options=options or StoreOptions())
        try:
            store._open()
        except OSError as exc:
            raise StorageError(f"cannot open store {directory}: {exc}") from exc
        store._meta_floor = store.last_seq
        return store

    # --- properties -----------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._current.header.last_seq

    @property
    def header(self) -> fmt.Header:
        return self._current.header

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self._current.meta)

    def meta_written_at(self, name: str) -> int:
        """The seq of the commit that last changed metadata key ``name`` (set or deleted) since
        the store opened; the seq it opened at for a key unchanged since (at most the seq of a
        rollback since that restored the metadata). Read after the metadata it vouches for: a
        commit landing in between only makes it higher."""
        return self._meta_seqs.get(name, self._meta_floor)

    @property
    def path(self) -> str:
        return self._current.file.handle.path

    def file_bytes(self) -> int:
        return self._current.file.handle.size()

    def garbage_ratio(self) -> float:
        header = self._current.header
        size = self.file_bytes()
        if size <= 0:
            return 0.0
        live = (header.payload_bytes - header.superseded_bytes) * header.file_overhead
        return max(0.0, 1.0 - live / size)

    def compaction_due(self) -> bool:
        return (
            self.file_bytes() >= self.options.compaction_file_bytes_min
            and self.garbage_ratio() >= self.options.compaction_garbage_ratio
        )

    def stats(self) -> dict[str, Any]:
        header = self._current.header
        return {
            "last_seq": header.last_seq,
            "commit_no": header.commit_no,
            "generation": header.generation,
            "file_bytes": self.file_bytes(),
            "entry_count": header.entry_count,
            "payload_bytes": header.payload_bytes,
            "superseded_count": header.superseded_count,
            "superseded_bytes": header.superseded_bytes,
            "live_count": header.entry_count - header.superseded_count,
            "garbage_ratio": round(self.garbage_ratio(), 4),
            "min_rollback_seq": header.min_rollback_seq,
            "keys": self._index.key_count(),
            "compactions": self.compactions,
        }

    # --- commit ---------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.directory} is closed")
        if self._poisoned is not None:
            raise StoreClosedError(
                f"store {self.directory} failed an fsync ({self._poisoned}); reopen it"
            )

    def commit(
        self,
        ops: Sequence[Op],
        *,
        meta: dict[str, Any] | None = None,
        seqs: Sequence[int] | None = None,
        last_seq: int | None = None,
        claim_seq: bool = False,
    ) -> CommitResult:
        """Commits ``ops`` as one all-or-nothing batch, durable when this returns.

        ``meta`` updates shard metadata in the same commit (a value of None removes a key).
        ``seqs`` gives explicit, strictly increasing seqs above ``last_seq`` (replicas applying
        their upstream's batches); otherwise seqs are assigned consecutively.
        ``last_seq`` makes the commit cover the log range up to that seq even where no entry
        holds it (a replica applying a ``BATCH`` whose range ends past its last entry); it must
        lie above the store's last seq and at or above every explicit seq.
        ``claim_seq`` makes a commit without ops take one seq of its own, so a metadata-only
        change (a consumer high-water mark) is a log range a replication link can carry."""
        return self.commit_columns(
            *ops_to_columns(ops), meta=meta, seqs=seqs, last_seq=last_seq, claim_seq=claim_seq
        )

    def commit_columns(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        expiries_ms: Sequence[int] | None = None,
        headers: Sequence[dict[str, bytes] | None] | None = None,
        *,
        meta: dict[str, Any] | None = None,
        seqs: Sequence[int] | None = None,
        last_seq: int | None = None,
        claim_seq: bool = False,
        validated: bool = False,
    ) -> CommitResult:
        """``commit`` for a batch given as columns, without an object per entry: entry i is
        ``keys[i]`` with ``values[i]`` (None: delete the key), ``expiries_ms[i]`` and
        ``headers[i]`` (a column left None is 0 / no headers for every entry). Same atomicity,
        group commit and durability as ``commit``, and the same checks, unless ``validated``
        says the caller ran ``prepare_columns`` on these columns already."""
        columns = prepare_columns(keys, values, expiries_ms, headers, check=not validated)
        validate_meta(meta)
        if seqs is not None:
            if len(seqs) != len(keys):
                raise InvalidRequest("seqs and ops differ in length")
            if not all(map(lt, seqs, itertools.islice(seqs, 1, None))):
                raise InvalidRequest("seqs must be strictly increasing")
        if last_seq is not None and seqs and last_seq < seqs[-1]:
            raise InvalidRequest(f"last_seq {last_seq} is below the explicit seq {seqs[-1]}")
        if claim_seq and (keys or last_seq is not None):
            raise InvalidRequest("claim_seq is for a commit without ops or last_seq")
        self._check_usable()
        # Checked against the last seq as queued: commits that land before this one is built
        # only shrink the gap.
        highest = seqs[-1] if last_seq is None and seqs else last_seq
        store_last_seq = self.last_seq
        if highest is not None and highest - store_last_seq > limits.seq_gap_max:
            raise InvalidRequest(
                f"seq {highest} is more than seq_gap_max ({limits.seq_gap_max}) past the last "
                f"seq {store_last_seq}"
            )
        pending = _Pending(columns, meta, seqs, last_seq, claim_seq)
        with self._cv:
            while len(self._queue) >= limits.commit_queue_batches_max:
                self._cv.wait()
            self._queue.append(pending)
            while not pending.done and self._leader_active:
                self._cv.wait()
            if not pending.done:
                self._leader_active = True
        if not pending.done:
            self._lead(pending)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _lead(self, own: _Pending) -> None:
        try:
            while not own.done:
                with self._cv:
                    group: list[_Pending] = []
                    budget = limits.group_commit_bytes_max
                    while self._queue and (
                        not group or self._queue[0].columns.payload_bytes <= budget
                    ):
                        item = self._queue.popleft()
                        budget -= item.columns.payload_bytes
                        group.append(item)
                    self._cv.notify_all()
                if not group:
                    break
                try:
                    with self._write_lock:
                        self._check_usable()
                        self._commit_group(group)
                except BaseException as exc:
                    for item in group:
                        if not item.done:
                            item.error = exc
                with self._cv:
                    for item in group:
                        item.done = True
                    self._cv.notify_all()
        finally:
            with self._cv:
                self._leader_active = False
                self._cv.notify_all()

    def _build_group(self, group: list[_Pending]) -> _GroupBuild:
        """Lays out the group's entries as leaf columns (prevs still unset: ``_supersede``
        fills them from the index) and writes the out-of-line values. Fails the batches whose
        explicit seqs no longer lie above the last seq, and leaves them out."""
        current = self._current
        header = current.header
        build = _GroupBuild(btree.Appender(current.file.handle.size()), fmt.empty_leaf())
        cols = build.cols
        next_seq = header.last_seq + 1
        for pending in group:
            problem = _seq_problem(pending, next_seq)
            if problem is not None:
                pending.error = InvalidRequest(problem)
                pending.done = True
                continue
            build.live += 1
            columns = pending.columns
            count = len(columns.keys)
            first = pending.seqs[0] if pending.seqs else next_seq
            if count:
                start = len(cols.seqs)
                cols.seqs += (
                    range(next_seq, next_seq + count) if pending.seqs is None else pending.seqs
                )
                cols.keys += columns.keys
                cols.sizes += columns.sizes
                if columns.plain:
                    cols.vals += columns.values
                    cols.flags += repeat(0, count)
                else:
                    _add_stored_values(build.out, columns.values, cols)
                cols.flags[-1] |= fmt.FLAG_BATCH_END
                cols.expiries = _extend_column(cols.expiries, columns.expiries_ms, start, count, 0)
                cols.headers = _extend_column(cols.headers, columns.headers, start, count, None)
                build.payload_bytes += columns.payload_bytes
                next_seq = cols.seqs[-1] + 1
            if pending.last_seq is not None:
                next_seq = pending.last_seq + 1
            elif pending.claim_seq:
                next_seq += 1
            pending.result = CommitResult(first, next_seq - 1, header.commit_no + 1)
            if pending.meta:
                build.meta = dict(current.meta) if build.meta is None else build.meta
                for name, value in pending.meta.items():
                    if value is None:
                        build.meta.pop(name, None)
                    else:
                        build.meta[name] = value
        build.last_seq = next_seq - 1
        return build

    def _commit_group(self, group: list[_Pending]) -> None:
        build = self._build_group(group)
        if not build.live:
            return
        current = self._current
        header = current.header
        cols = build.cols
        index = self._index
        # The group's newest version of each key; a key that repeats within it keeps its last.
        latest = dict(zip(cols.keys, zip(cols.seqs, cols.sizes, strict=True), strict=True))
        ordered = sorted(latest)  # lmdb's cursor moves forward through sorted keys
        txn = index.begin_write()
        try:
            existing = index.lookup_many(txn, ordered)
            _supersede(build, existing, unique=len(latest) == len(cols.keys))
            edge = self._edge
            root = header.root
            if cols.seqs:
                edge = edge.append(build.out, cols)
                root = edge.write_root(build.out)
            meta_pos = header.meta
            if build.meta is not None:
                meta_pos = build.out.add_chunk(fmt.encode_meta(build.meta))
            new_header = header_with(
                header,
                commit_no=header.commit_no + 1,
                last_seq=max(header.last_seq, build.last_seq),
                root=root,
                entry_count=header.entry_count + len(cols.seqs),
                payload_bytes=header.payload_bytes + build.payload_bytes,
                superseded_count=header.superseded_count + len(build.supersede),
                superseded_bytes=header.superseded_bytes + build.superseded_bytes,
                meta=meta_pos,
                timestamp_ms=int(self._clock.now_s() * 1000),
            )
            # Grown before the write: once the commit is durable, installing it must not fail.
            succ = index.succ
            succ.ensure(new_header.last_seq)
            new_header = self._write_commit(build.out, new_header)
            # Durable. Successors first, so a reader of the new header never sees both versions.
            succ.set_many(build.supersede)
            meta = build.meta if build.meta is not None else current.meta
            # Before the new state is installed: a reader of it finds its metadata's seqs.
            for pending in group:
                if pending.meta and pending.result is not None and pending.error is None:
                    self._meta_seqs.update(dict.fromkeys(pending.meta, pending.result.last_seq))
            self._current = _Current(current.file, new_header, meta)
            self._edge = edge
            index.write_latest(txn, latest, (), new_header.last_seq, ordered=ordered)
            index.commit(txn, new_header.last_seq)
        except BaseException:
            txn.abort()
            raise
        self._maybe_checkpoint()

    def _write_commit(self, out: btree.Appender, header: fmt.Header) -> fmt.Header:
        """Appends ``out`` plus a header for it, then fdatasyncs. Returns the header written."""
        handle = self._current.file.handle
        region_start = out.start
        assert region_start == handle.size(), "a commit starts at the end of the file"
        body = out.take()
        pad = -out.pos % fmt.BLOCK
        region_crc = fmt.crc32c(_ZERO_BLOCK[:pad], fmt.crc32c(body))
        previous_block = self._last_header_block
        header = header_with(
            header, prev_header=previous_block, region_start=region_start, region_crc=region_crc
        )
        header_bytes, block_pos, _ = fmt.header_block(out.pos, fmt.encode_header(header))
        self.check_space(len(body) + len(header_bytes), self.options.disk_reserve_bytes)
        try:
            handle.append(body + header_bytes)
        except OSError as exc:
            self._undo_append(handle, region_start)
            if exc.errno == errno.ENOSPC:
                raise DiskFullError(f"{handle.path}: disk full; commit not written") from exc
            raise StorageError(f"{handle.path}: write failed: {exc}") from exc
        try:
            handle.sync()
        except OSError as exc:
            self._poisoned = exc
            raise StorageError(f"{handle.path}: fsync failed, store closed: {exc}") from exc
        self._last_header_block = block_pos
        return header

    def check_space(self, size: int, reserve: int) -> None:
        """Refuses (``DiskFullError``) a write of ``size`` bytes that would leave less than
        ``reserve`` bytes free on the store's filesystem; nothing is written."""
        if reserve <= 0:
            return
        try:
            free = free_bytes(self.directory)
        except OSError as exc:
            raise StorageError(f"{self.directory}: cannot read free space: {exc}") from exc
        if free < reserve + size:
            raise DiskFullError(
                f"{self.directory}: disk full: {free} bytes free, a write of {size} would pass "
                f"the reserve of {reserve} (limits.disk_reserve_bytes); nothing written"
            )

    def _undo_append(self, handle: FileHandle, size: int) -> None:
        try:
            handle.truncate(size)
        except OSError as exc:
            self._poisoned = exc
            log.error("%s: could not truncate a failed commit: %s", handle.path, exc)

    def _maybe_checkpoint(self) -> None:
        """Every ``index_checkpoint_commits`` commits, asks the background thread to flush the
        derived index (kayos.storage.disk.index: a bound on dirty pages, not a durability point)."""
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint >= self.options.index_checkpoint_commits:
            self._commits_since_checkpoint = 0
            self._index.request_checkpoint()

    # --- reads ----------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Pins the current committed state. Release it (or use ``with``) when done."""
        self._check_open()
        current = self._pin_current()
        return Snapshot(self, current.file, current.header, current.meta)

    def pin_prefix(self) -> tuple[DataFile, fmt.Header, int]:
        """The current file pinned (release it when done), its current header and the end of
        that header's chunk: bytes before it are a store by itself (docs/storage-format.md,
        "A prefix ending at a header"). Read under the write lock, so the three agree."""
        with self._write_lock:
            self._check_open()
            current = self._pin_current()
            try:
                end = header_end(current.file.handle, self._last_header_block)
            except BaseException:
                current.file.release()
                raise
        return current.file, current.header, end

    def _check_open(self) -> None:
        # A failed fsync poisons reads too: the page cache may hold bytes the disk never got.
        self._check_usable()

    def _pin_current(self) -> _Current:
        """The current state with its file acquired. Readers take no lock, so a compaction may
        swap files between reading ``_current`` and acquiring its file, and close the old one;
        then the new current state is pinned instead."""
        for _ in range(_PIN_ATTEMPTS_MAX):
            current = self._current
            try:
                current.file.acquire()
            except StoreClosedError:
                if self._current is current:
                    raise  # the store itself was closed
                continue
            return current
        raise StoreClosedError(f"store {self.directory}: files kept changing while pinning one")

    def get(self, key: bytes, *, now_ms: int | None = None) -> Entry | None:
        """The newest version of ``key``; None if it never existed, was deleted or expired."""
        if not isinstance(key, bytes) or not key:
            raise InvalidRequest("a key must be non-empty bytes")  # lmdb refuses empty keys
        if len(key) > limits.key_bytes_max:
            raise LimitExceeded(f"key of {len(key)} bytes exceeds {limits.key_bytes_max}")
        self._check_open()
        found = self._index.lookup_one(key)
        if found is None:
            return None
        current = self._pin_current()
        data_file = current.file
        try:
            located = btree.find_entry(data_file.reader, current.header.root, found[0])
            if located is None:
                return None
            entry = _entry_at(data_file.reader, *located)
        finally:
            data_file.release()
        now = int(self._clock.now_s() * 1000) if now_ms is None else now_ms
        if entry.deleted or (entry.expiry_ms and entry.expiry_ms <= now):
            return None
        return entry

    def scan(self, after_seq: int = 0, upto_seq: int | None = None) -> list[Entry]:
        """Convenience: the live entries in ``(after_seq, upto_seq]`` as of now."""
        with self.snapshot() as snap:
            return list(snap.scan(after_seq, upto_seq))

    def export(
        self, after_seq: int, *, page_entries: int = limits.scan_page_entries_max
    ) -> Iterator[list[Entry]]:
        """Pages of live entries (deletes included) after ``after_seq``, from one snapshot; for a
        replica catching up."""
        with self.snapshot() as snap:
            yield from snap.pages(after_seq, page_entries=page_entries, include_expired=True)

    def _snapshot_invalidated(self, epoch: int, boundary: int) -> bool:
        return any(e >= epoch and target < boundary for e, target in self._rollbacks)

    @property
    def rollback_epoch(self) -> int:
        return len(self._rollbacks)

    @property
    def succ_segments(self) -> list[memoryview]:
        return self._index.succ.segments

    # --- rollback -------------------------------------------------------------------------------

    def rollback_to(self, seq: int, restore: Callable[[str], bool] | None = None) -> bool:
        """Drops every entry after ``seq`` and restores the state as of ``seq``: the metadata
        keys ``restore`` names too, from the newest header at or below ``seq`` (the others stay
        as they are). False: that header was not reached (docs/storage-format.md, "Rollback")
        and the metadata stays as it is; True otherwise (nothing to roll back included)."""
        if seq < 0:
            raise InvalidRequest(f"cannot roll back to seq {seq}")
        with self._write_lock:
            self._check_usable()
            current = self._current
            header = current.header
            if seq >= header.last_seq:
                return True
            if seq < header.min_rollback_seq:
                raise RollbackTooFarError(
                    f"cannot roll back to {seq}: compaction kept versions from "
                    f"{header.min_rollback_seq} on"
                )
            try:
                meta = None if restore is None else self._meta_restored(seq, restore)
                self._rollback(seq, meta)
            except OSError as exc:
                raise StorageError(f"rollback failed: {exc}") from exc
            return restore is None or meta is not None

    def _meta_restored(self, seq: int, restore: Callable[[str], bool]) -> dict[str, Any] | None:
        """The metadata after a rollback to ``seq``: the keys ``restore`` names as the newest
        header at or below ``seq`` held them, the others as they are; None if no such header
        is within ``limits.rollback_meta_headers_max`` of the current one."""
        current = self._current
        file = current.file
        found = meta_as_of(
            file.handle,
            file.reader,
            current.header,
            self._last_header_block,
            seq,
            current=current.meta,
            headers_max=limits.rollback_meta_headers_max,
        )
        if found is None:
            return None
        kept = {name: value for name, value in current.meta.items() if not restore(name)}
        return {**{k: v for k, v in found.meta.items() if restore(k)}, **kept}

    def _rollback(self, seq: int, meta: dict[str, Any] | None = None) -> None:
        current = self._current
        header = current.header
        reader = current.file.reader
        succ = self._index.succ
        first_prev: dict[bytes, int] = {}
        removed_count = removed_bytes = unsuperseded_count = unsuperseded_bytes = 0
        for leaf in btree.iter_leaves(reader, header.root, seq, header.last_seq):
            lo = bisect.bisect_right(leaf.seqs, seq)
            for index in range(lo, len(leaf.seqs)):
                entry_seq, size = leaf.seqs[index], leaf.sizes[index]
                removed_count += 1
                removed_bytes += size
                if succ.get(entry_seq):
                    unsuperseded_count += 1
                    unsuperseded_bytes += size
                first_prev.setdefault(leaf.keys[index], leaf.prevs[index])
        restored: dict[bytes, tuple[int, int]] = {}
        for key, prev in first_prev.items():
            if not prev:
                continue
            located = btree.find_entry(reader, header.root, prev)
            if located is None or located[0].flags[located[1]] & fmt.FLAG_COMMIT_MARKER:
                # A retention floor dropped the version this one superseded (docs/retention.md):
                # the key has no version left, so it leaves the index.
                continue
            size = located[0].sizes[located[1]]
            restored[key] = (prev, size)
            unsuperseded_count += 1
            unsuperseded_bytes += size
        edge = btree.Edge.from_root(reader, header.root, upto_seq=seq)
        out = btree.Appender(current.file.handle.size())
        root = edge.write_root(out)
        new_header = header_with(
            header,
            commit_no=header.commit_no + 1,
            last_seq=seq,
            root=root,
            entry_count=header.entry_count - removed_count,
            payload_bytes=header.payload_bytes - removed_bytes,
            superseded_count=header.superseded_count - unsuperseded_count,
            superseded_bytes=header.superseded_bytes - unsuperseded_bytes,
            timestamp_ms=int(self._clock.now_s() * 1000),
        )
        if meta is not None:
            new_header = header_with(new_header, meta=out.add_chunk(fmt.encode_meta(meta)))
        assert (root.count if root else 0) == new_header.entry_count, "rollback counts agree"
        new_header = self._write_commit(out, new_header)
        self._rollbacks.append((len(self._rollbacks), seq))
        for prev, _ in restored.values():
            succ.set(prev, 0)
        succ.clear_from(seq + 1)
        if meta is not None:
            # The metadata is as of ``seq`` now: every key was last changed at or below it as far
            # as a reader can tell, those changed back included, and those unchanged since the
            # store opened (a seq past ``seq`` would wait for a commit point of a dropped seq).
            changed = {k for k in {*meta, *current.meta} if meta.get(k) != current.meta.get(k)}
            self._meta_seqs = {k: min(at, seq) for k, at in self._meta_seqs.items()}
            self._meta_seqs.update(dict.fromkeys(changed, seq))
            self._meta_floor = min(self._meta_floor, seq)
        self._current = _Current(current.file, new_header, current.meta if meta is None else meta)
        self._edge = edge
        txn = self._index.begin_write()
        try:
            removed = [key for key in first_prev if key not in restored]
            self._index.write_latest(txn, restored, removed, seq)
            self._index.commit(txn, seq)
        except BaseException:
            txn.abort()
            raise
        self._index.checkpoint()

    # --- compaction hooks (kayos.storage.maintenance.compact drives these) ---------------------

    @property
    def write_lock(self) -> threading.RLock:
        return self._write_lock

    @property
    def fileops(self) -> FileOps:
        return self._ops

    @property
    def clock(self) -> Clock:
        return self._clock

    def current_file(self) -> DataFile:
        return self._current.file

    def install_compacted(
        self,
        handle: FileHandle,
        generation: int,
        header: fmt.Header,
        header_block: int,
        edge: btree.Edge,
    ) -> None:
        """Switches writers to a compacted file (call with the write lock held)."""
        old = self._current
        self._current = _Current(DataFile(handle, generation), header, old.meta)
        self._edge = edge
        self._last_header_block = header_block
        self.compactions += 1
        old.file.release()

    def forget_keys(self, entries: Sequence[tuple[bytes, int]]) -> None:
        """Takes each ``(key, seq)`` out of the key index if that seq is still the key's newest
        version: compaction dropped it (retention, docs/retention.md). Call with the write lock
        held, after the compacted file is installed (the index is never ahead of the file)."""
        if not entries:
            return
        index = self._index
        txn = index.begin_write()
        try:
            found = index.lookup_many(txn, sorted({key for key, _ in entries}))
            gone = [key for key, seq in entries if found.get(key, (0, 0))[0] == seq]
            index.write_latest(txn, {}, gone, index.applied_seq)
            index.commit(txn, index.applied_seq)
        except BaseException:
            txn.abort()
            raise

    # --- close ----------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        with self._write_lock:
            self._closed = True
            self._index.close(clean=self._poisoned is None)
            self._current.file.release()

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
