"""File operations behind one interface, so tests can put a faulty twin in front of the disk.

``OsFileOps`` is the real thing. ``FaultyFileOps`` delegates to it but remembers what was written
since the last sync, so a test can simulate a power cut (lose some or all unsynced pages), tear a
write at a byte offset, fail an fsync, or run out of space.

Errors surface as ``OSError``; the store maps them to ``kayos.errors`` at its boundary.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from typing import Protocol

PAGE_BYTES = 4096


class FileHandle(Protocol):
    path: str

    def pread(self, size: int, offset: int) -> bytes: ...

    def append(self, data: bytes) -> None:
        """Writes ``data`` at the end of the file (all of it, or raises)."""

    def size(self) -> int: ...

    def truncate(self, size: int) -> None: ...

    def sync(self) -> None:
        """Makes every write so far durable (fdatasync)."""

    def close(self) -> None: ...


class FileOps(Protocol):
    def open(self, path: str, *, create: bool = False) -> FileHandle: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def rename(self, source: str, target: str) -> None: ...

    def unlink(self, path: str) -> None: ...

    def makedirs(self, path: str) -> None: ...

    def sync_dir(self, path: str) -> None: ...


class OsFile:
    def __init__(self, path: str, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.path = path
        self._fd = os.open(path, flags, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def append(self, data: bytes) -> None:
        with self._lock:
            view = memoryview(data)
            written = 0
            try:
                while written < len(data):
                    written += os.pwrite(self._fd, view[written:], self._size + written)
            finally:
                self._size += written

    def size(self) -> int:
        return self._size

    def truncate(self, size: int) -> None:
        with self._lock:
            os.ftruncate(self._fd, size)
            self._size = size

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def fileno(self) -> int:
        """The descriptor (a store copy sends the file's bytes with sendfile from it)."""
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsFileOps:
    def open(self, path: str, *, create: bool = False) -> FileHandle:
        return OsFile(path, create=create)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


OS_FILEOPS = OsFileOps()


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


# --- the faulty twin ----------------------------------------------------------------------------


class SimulatedCrash(Exception):
    """Raised by ``FaultyFileOps`` where a power cut was scheduled; the test then calls
    ``crash()`` and reopens the store."""


class _FaultyFile:
    def __init__(self, ops: FaultyFileOps, inner: FileHandle) -> None:
        self._ops = ops
        self._inner = inner
        self.path = inner.path

    def pread(self, size: int, offset: int) -> bytes:
        return self._inner.pread(size, offset)

    def append(self, data: bytes) -> None:
        ops = self._ops
        ops._check_alive()
        start = self._inner.size()
        state = ops._state_for(self.path, start)
        ops._remember_pages(self._inner, state, start, len(data))
        tear_at = ops.tear_next_append_at
        if tear_at is not None:
            ops.tear_next_append_at = None
            self._inner.append(data[: max(0, min(tear_at, len(data)))])
            ops.crashed = True
            raise SimulatedCrash(f"power cut after {tear_at} bytes of a {len(data)}-byte write")
        if ops.space_left_bytes is not None:
            if len(data) > ops.space_left_bytes:
                partial = ops.space_left_bytes
                self._inner.append(data[:partial])
                ops.space_left_bytes = 0
                raise OSError(errno.ENOSPC, "No space left on device (simulated)", self.path)
            ops.space_left_bytes -= len(data)
        self._inner.append(data)

    def size(self) -> int:
        return self._inner.size()

    def truncate(self, size: int) -> None:
        ops = self._ops
        ops._check_alive()
        state = ops._state_for(self.path, self._inner.size())
        ops._remember_pages(self._inner, state, size, max(0, self._inner.size() - size))
        if ops.space_left_bytes is not None:
            ops.space_left_bytes += max(0, self._inner.size() - size)
        self._inner.truncate(size)

    def sync(self) -> None:
        ops = self._ops
        ops._check_alive()
        if ops.fail_next_sync:
            ops.fail_next_sync = False
            raise OSError(errno.EIO, "Input/output error (simulated fsync failure)", self.path)
        self._inner.sync()
        ops._states[self.path] = _SyncState(self._inner.size())

    def close(self) -> None:
        self._inner.close()


class _SyncState:
    """What a file looked like at its last sync: its size, and the old bytes of every page that
    was changed since (None for pages that did not exist then)."""

    def __init__(self, synced_size: int) -> None:
        self.synced_size = synced_size
        self.old_pages: dict[int, bytes] = {}


class FaultyFileOps:
    """``OsFileOps`` with injectable faults. Not thread-safe for fault setup; set faults between
    operations."""

    def __init__(self, inner: FileOps | None = None) -> None:
        self._inner: FileOps = inner if inner is not None else OS_FILEOPS
        self._states: dict[str, _SyncState] = {}
        self.tear_next_append_at: int | None = None
        self.fail_next_sync = False
        self.space_left_bytes: int | None = None
        self.crashed = False

    # FileOps ------------------------------------------------------------------------------------

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        self._check_alive()
        inner = self._inner.open(path, create=create)
        self._states.setdefault(path, _SyncState(inner.size()))
        return _FaultyFile(self, inner)

    def exists(self, path: str) -> bool:
        return self._inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self._inner.listdir(path)

    def rename(self, source: str, target: str) -> None:
        self._check_alive()
        self._inner.rename(source, target)
        if source in self._states:
            self._states[target] = self._states.pop(source)

    def unlink(self, path: str) -> None:
        self._check_alive()
        self._inner.unlink(path)
        self._states.pop(path, None)

    def makedirs(self, path: str) -> None:
        self._inner.makedirs(path)

    def sync_dir(self, path: str) -> None:
        self._check_alive()
        self._inner.sync_dir(path)

    # faults -------------------------------------------------------------------------------------

    def crash(self, *, keep_page_probability: float = 0.0, seed: int = 0) -> None:
        """Simulates a power cut: every page changed since its file's last sync reverts to its
        synced bytes, except that each is kept with ``keep_page_probability``. Pages past the
        synced size that are lost read back as zeros if a later page survived."""
        rng = random.Random(seed)  # noqa: S311 - fault placement, not security
        for path, state in list(self._states.items()):
            if not self._inner.exists(path):
                continue
            handle = self._inner.open(path)
            try:
                self._revert(handle, state, keep_page_probability, rng)
            finally:
                handle.close()
            self._states[path] = _SyncState(self._current_size(path))
        self.crashed = False
        self.tear_next_append_at = None
        self.fail_next_sync = False

    def _current_size(self, path: str) -> int:
        handle = self._inner.open(path)
        try:
            return handle.size()
        finally:
            handle.close()

    @staticmethod
    def _revert(handle: FileHandle, state: _SyncState, keep: float, rng: random.Random) -> None:
        current_size = handle.size()
        pages = sorted(state.old_pages)
        kept_end = state.synced_size
        lost: list[int] = []
        for page in pages:
            if keep > 0 and rng.random() < keep:
                kept_end = max(kept_end, min(current_size, (page + 1) * PAGE_BYTES))
            else:
                lost.append(page)
        # Rebuild the file: synced bytes for lost pages, current bytes for kept ones.
        image = bytearray(handle.pread(kept_end, 0).ljust(kept_end, b"\x00"))
        for page in lost:
            start = page * PAGE_BYTES
            if start >= kept_end:
                continue
            old = state.old_pages[page]
            end = min(kept_end, start + PAGE_BYTES)
            image[start:end] = old[: end - start].ljust(end - start, b"\x00")
        handle.truncate(0)
        handle.append(bytes(image))
        handle.sync()

    def _check_alive(self) -> None:
        if self.crashed:
            raise SimulatedCrash("the simulated machine is down; call crash() first")

    def _state_for(self, path: str, size: int) -> _SyncState:
        return self._states.setdefault(path, _SyncState(size))

    @staticmethod
    def _remember_pages(handle: FileHandle, state: _SyncState, start: int, length: int) -> None:
        if length <= 0:
            return
        first = start // PAGE_BYTES
        last = (start + length - 1) // PAGE_BYTES
        for page in range(first, last + 1):
            if page in state.old_pages:
                continue
            page_start = page * PAGE_BYTES
            if page_start >= state.synced_size:
                state.old_pages[page] = b""
            else:
                state.old_pages[page] = handle.pread(
                    min(PAGE_BYTES, state.synced_size - page_start), page_start
                )
