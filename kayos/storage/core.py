"""The state every part of ``ShardStore`` shares, and the one way bytes reach its file.

``ShardStore`` (kayos.storage.engine) is one class written in parts that all work on the same
state: this base sets that state up and holds the write every change ends with, a region and its
header appended and then one fdatasync (``_write_commit``). The group commit
(kayos.storage.commit), rollback (kayos.storage.rollback) and open and recovery
(kayos.storage.recovery) add their methods on top of it; the engine adds reads, the hooks
compaction drives, and close.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

from kayos.errors import DiskFullError, StorageError, StoreClosedError
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import header_with
from kayos.storage.disk.fileops import free_bytes
from kayos.storage.records import RecoveryReport

if TYPE_CHECKING:
    from kayos.clock import Clock
    from kayos.storage.disk import btree
    from kayos.storage.disk.datafile import Current
    from kayos.storage.disk.fileops import FileHandle, FileOps
    from kayos.storage.disk.index import DerivedIndex
    from kayos.storage.group import Pending
    from kayos.storage.records import StoreOptions

log = logging.getLogger("kayos.storage")

# The zero padding before a header block, for its CRC (a view: no copy per commit).
_ZERO_BLOCK = memoryview(bytes(fmt.BLOCK))


class StoreCore:
    """The state of one shard's store and the append-and-sync every commit and rollback makes."""

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
        self._queue: deque[Pending] = deque()
        self._leader_active = False
        self._poisoned: BaseException | None = None
        self._closed = False
        self._rollbacks: list[tuple[int, int]] = []  # (rollback epoch, target seq)
        self._commits_since_checkpoint = 0
        self.recovery = RecoveryReport()
        self._current: Current
        self._edge: btree.Edge
        self._index: DerivedIndex
        self.compactions = 0
        self._last_header_block = 0
        # The seq of each metadata key's last change since the store opened (in memory only; a
        # key unchanged since counts as changed at the seq the store opened at): a tail serves a
        # group's mark only once the commit point covers the seq that wrote it.
        self._meta_seqs: dict[str, int] = {}
        self._meta_floor = 0

    @property
    def last_seq(self) -> int:
        return self._current.header.last_seq

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.directory} is closed")
        if self._poisoned is not None:
            raise StoreClosedError(
                f"store {self.directory} failed an fsync ({self._poisoned}); reopen it"
            )

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
