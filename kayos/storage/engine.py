"""The shard store, ``ShardStore``: one shard's append-only copy-on-write B-tree file
(docs/storage-format.md) and the derived index beside it.

Threads: any number of threads may call ``commit`` at once; one of them becomes the leader and
writes every queued batch in one group commit (one write, one fdatasync), the others wait for
their result. Readers (snapshots, ``get``) never take the commit lock: nodes are immutable once
written and the current (file, header) pair is swapped atomically.

``ShardStore`` is one class written in parts over one state (kayos.storage.core): the group
commit (kayos.storage.commit), rollback (kayos.storage.rollback) and open and recovery
(kayos.storage.recovery); this module adds reads, the hooks compaction drives
(kayos.storage.maintenance.compact) and close. Around it: value types (kayos.storage.records),
batch checks (kayos.storage.batch), the group commit's layout (kayos.storage.group), snapshots
(kayos.storage.reads) and what lies on disk (kayos.storage.disk). The names other modules
import from here are re-exported.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from kayos import limits
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import InvalidRequest, LimitExceeded, StorageError, StoreClosedError
from kayos.storage.batch import (
    BatchColumns,
    ops_to_columns,
    prepare_columns,
    validate_meta,
    validate_ops,
)
from kayos.storage.commit import GroupCommit
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import (
    DATA_PREFIX,
    DATA_SUFFIX,
    SNAPSHOT_SUFFIX,
    Current,
    DataFile,
    data_file_name,
    find_last_header,
    header_end,
    header_with,
    parse_generation,
    read_header_at,
    region_matches,
)
from kayos.storage.disk.fileops import OS_FILEOPS, FileHandle, FileOps
from kayos.storage.reads import Snapshot, read_entry
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
from kayos.storage.rollback import StoreRollback

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

# Each retry needs a whole compaction to swap files between two reads of _current; the bound
# only turns a livelock bug into an error.
_PIN_ATTEMPTS_MAX = 100


class ShardStore(GroupCommit, StoreRollback, StoreRecovery):
    """One shard's store (docs/storage-format.md). Open with ``ShardStore.open(path)``."""

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

    # --- reads ----------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Pins the current committed state. Release it (or use ``with``) when done."""
        self.check_open()
        current = self._pin_current()
        return Snapshot(self, current.file, current.header, current.meta)

    def pin_prefix(self) -> tuple[DataFile, fmt.Header, int]:
        """The current file pinned (release it when done), its current header and the end of
        that header's chunk: bytes before it are a store by itself (docs/storage-format.md,
        "A prefix ending at a header"). Read under the write lock, so the three agree."""
        with self._write_lock:
            self.check_open()
            current = self._pin_current()
            try:
                end = header_end(current.file.handle, self._last_header_block)
            except BaseException:
                current.file.release()
                raise
        return current.file, current.header, end

    def check_open(self) -> None:
        """Raises ``StoreClosedError`` if the store was closed or failed an fsync: a failed fsync
        poisons reads too, as the page cache may hold bytes the disk never got."""
        self._check_usable()

    def _pin_current(self) -> Current:
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
        self.check_open()
        found = self._index.lookup_one(key)
        if found is None:
            return None
        current = self._pin_current()
        data_file = current.file
        try:
            located = btree.find_entry(data_file.reader, current.header.root, found[0])
            if located is None:
                return None
            entry = read_entry(data_file.reader, *located)
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

    @property
    def succ_segments(self) -> list[memoryview]:
        return self._index.succ.segments

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
        self._current = Current(DataFile(handle, generation), header, old.meta)
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
