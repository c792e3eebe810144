"""Shard stores for tests: the fixed store identity that keeps file bytes reproducible, and file
operations that count fsyncs or hold an append until the test releases it."""

from __future__ import annotations

import threading
from typing import Any

from kayos.storage.disk.fileops import OS_FILEOPS, FileHandle, FileOps

# A fixed identity keeps file bytes (and so golden tests and offsets) reproducible.
TEST_STORE_UUID = bytes(range(16))
JOIN_TIMEOUT_S = 60.0


class CountingFileOps:
    """Delegates to the real disk and counts fdatasyncs of each file."""

    def __init__(self) -> None:
        self.syncs: dict[str, int] = {}
        self._lock = threading.Lock()
        self._inner: FileOps = OS_FILEOPS

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        return _CountingHandle(self, self._inner.open(path, create=create))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def count(self, path: str) -> None:
        with self._lock:
            self.syncs[path] = self.syncs.get(path, 0) + 1


class _CountingHandle:
    def __init__(self, ops: CountingFileOps, inner: FileHandle) -> None:
        self._ops = ops
        self._inner = inner
        self.path = inner.path

    def sync(self) -> None:
        self._inner.sync()
        self._ops.count(self.path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class WaitWatchingCondition(threading.Condition):
    """The store's commit queue condition, reporting which threads wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters: set[int] = set()
        self.watch = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self.watch:
            self.waiters.add(threading.get_ident())
            self.watch.notify_all()
        return super().wait(timeout)

    def wait_for_waiters(self, count: int) -> None:
        with self.watch:
            reached = self.watch.wait_for(lambda: len(self.waiters) >= count, JOIN_TIMEOUT_S)
        assert reached, f"only {len(self.waiters)} of {count} committers queued"


class HeldFileOps(CountingFileOps):
    """Holds the next append to the data file until released."""

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Event()
        self.release = threading.Event()
        self.hold_next = False

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        handle = super().open(path, create=create)
        inner_append = handle.append

        def append(data: bytes) -> None:
            if self.hold_next:
                self.hold_next = False
                self.held.set()
                assert self.release.wait(JOIN_TIMEOUT_S), "never released"
            inner_append(data)

        handle.append = append  # type: ignore[method-assign]
        return handle
