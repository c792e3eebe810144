"""Derived state of a shard store: the key -> latest version index and the successor map.

Both are rebuildable from the file at any time (docs/storage-format.md, "Derived state"). They
live on disk so that memory stays bounded by configuration, not by key or message count:

- ``latest`` (lmdb): key -> (seq, size) of the newest version of each key. Looked up in sorted
  batches (``getmulti``) once per group commit, written with ``putmulti``.
- the successor map (an mmap'd array of u64 indexed by seq): ``succ[s]`` is the seq of the version
  that superseded entry ``s``, 0 if none. Snapshot readers test it per entry, so it must be a
  plain array lookup, not a database call.

The store updates both only after its file fsync, so they are never ahead of the file.

Nothing here is synced on the commit path. While a store is open its ``state`` file says
"unclean", and an unclean stop under another boot id (an OS crash, where unsynced pages may be
lost) wipes and rebuilds the index on open; after a process crash the page cache still holds
every page written. The periodic checkpoint (``request_checkpoint``, run by one background
thread) only limits how many dirty pages build up between kernel writebacks; a clean close
syncs everything before it marks the state clean.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import struct
import threading
from typing import TYPE_CHECKING, Any

import lmdb
import msgpack

from kayos import limits

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

log = logging.getLogger("kayos.storage")

LATEST_ROW = struct.Struct(">QI")  # key -> (seq, size) rows of the latest database
SEGMENT_SHIFT = 20  # 1 Mi entries (8 MiB) per mapped segment
SEGMENT_ENTRIES = 1 << SEGMENT_SHIFT
SEGMENT_MASK = SEGMENT_ENTRIES - 1
_SEGMENT_BYTES = SEGMENT_ENTRIES * 8


def boot_id() -> str:
    """Identifies this boot of the machine: derived state written under another boot id by a store
    that was not closed cleanly may have lost unsynced pages, so it is rebuilt."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class SuccessorMap:
    """A growable array of u64 in fixed 8 MiB mmap segments that are never remapped, so readers
    can hold a segment while the writer grows the map."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._maps: list[mmap.mmap] = []
        self.segments: list[memoryview] = []
        size = os.fstat(self._fd).st_size
        for _ in range(size // _SEGMENT_BYTES):
            self._map_segment()

    def _map_segment(self) -> None:
        index = len(self._maps)
        needed = (index + 1) * _SEGMENT_BYTES
        if os.fstat(self._fd).st_size < needed:
            os.ftruncate(self._fd, needed)
        segment = mmap.mmap(self._fd, _SEGMENT_BYTES, offset=index * _SEGMENT_BYTES)
        self._maps.append(segment)
        self.segments.append(memoryview(segment).cast("Q"))

    def ensure(self, seq: int) -> None:
        """Makes ``seq`` addressable."""
        while (seq >> SEGMENT_SHIFT) >= len(self.segments):
            self._map_segment()

    def get(self, seq: int) -> int:
        segment = seq >> SEGMENT_SHIFT
        if segment >= len(self.segments):
            return 0
        return int(self.segments[segment][seq & SEGMENT_MASK])

    def set(self, seq: int, value: int) -> None:
        self.ensure(seq)
        self.segments[seq >> SEGMENT_SHIFT][seq & SEGMENT_MASK] = value

    def set_many(self, pairs: Iterable[tuple[int, int]]) -> None:
        """``set`` for each (seq, value); every seq must be addressable (``ensure``) already."""
        segments = self.segments
        for seq, value in pairs:
            segments[seq >> SEGMENT_SHIFT][seq & SEGMENT_MASK] = value

    def clear_from(self, seq: int) -> None:
        """Zeroes every entry at or above ``seq`` (after a rollback those seqs will be reused)."""
        for segment_index in range(seq >> SEGMENT_SHIFT, len(self.segments)):
            segment = self.segments[segment_index]
            start = seq & SEGMENT_MASK if segment_index == seq >> SEGMENT_SHIFT else 0
            segment_map = self._maps[segment_index]
            segment_map[start * 8 : _SEGMENT_BYTES] = bytes(_SEGMENT_BYTES - start * 8)
            del segment

    def flush(self) -> None:
        """Writes the mapped segments' dirty pages to disk. fdatasync of the file does what an
        msync of every segment does (the mappings are shared), and releases the GIL."""
        os.fdatasync(self._fd)

    def close(self) -> None:
        for view in self.segments:
            view.release()
        self.segments = []
        for segment_map in self._maps:
            with contextlib.suppress(BufferError):
                segment_map.close()
        self._maps = []
        os.close(self._fd)


class _Checkpointer:
    """One daemon thread that runs the checkpoints stores request, off their commit paths.
    A checkpoint requested while one for the same index is still queued is not queued again."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._due: dict[DerivedIndex, None] = {}  # queued indexes, oldest first
        self._thread: threading.Thread | None = None

    def request(self, index: DerivedIndex) -> None:
        with self._wake:
            self._due[index] = None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="kayos-index-checkpoint", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def forget(self, index: DerivedIndex) -> None:
        with self._wake:
            self._due.pop(index, None)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due:
                    self._wake.wait()
                index = next(iter(self._due))
                del self._due[index]
            try:
                index.checkpoint()
            except Exception:  # a failed flush only means the kernel writes the pages back later
                log.exception("%s: index checkpoint failed", index.directory)


_CHECKPOINTER = _Checkpointer()


class DerivedIndex:
    """The ``derived/`` directory of a store."""

    def __init__(self, directory: str, store_uuid: bytes) -> None:
        self.directory = directory
        self.store_uuid = store_uuid
        # Serializes checkpoints (run on the background thread) with close.
        self._checkpoint_lock = threading.Lock()
        self._closed = False
        os.makedirs(directory, exist_ok=True)
        state = self._read_state()
        stale = (
            state.get("store_uuid") != store_uuid
            or (not state.get("clean") and state.get("boot_id") != boot_id())
            or state.get("version") != 1
        )
        if stale:
            self._wipe()
        self._write_state(clean=False)
        self._env = lmdb.open(
            os.path.join(directory, "index.lmdb"),
            map_size=limits.index_map_bytes,
            max_dbs=4,
            sync=False,
            metasync=False,
            writemap=True,
            readahead=False,
            lock=True,
        )
        self._latest = self._env.open_db(b"latest")
        self._meta = self._env.open_db(b"state")
        self.succ = SuccessorMap(os.path.join(directory, "succ.u64"))
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"applied_seq")
        self.applied_seq = int(raw) if raw is not None else 0

    # state file --------------------------------------------------------------------------------

    def _state_path(self) -> str:
        return os.path.join(self.directory, "state")

    def _read_state(self) -> dict[str, Any]:
        try:
            with open(self._state_path(), "rb") as handle:
                loaded = msgpack.unpackb(handle.read(), raw=False)
        except (OSError, ValueError, msgpack.UnpackException):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def _write_state(self, *, clean: bool) -> None:
        temp = self._state_path() + ".tmp"
        state = {"version": 1, "store_uuid": self.store_uuid, "boot_id": boot_id(), "clean": clean}
        with open(temp, "wb") as handle:
            handle.write(msgpack.packb(state, use_bin_type=True))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self._state_path())

    def _wipe(self) -> None:
        for name in ("index.lmdb", "succ.u64", "state"):
            path = os.path.join(self.directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)

    def reset(self) -> None:
        """Empties the index (before a full rebuild)."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._latest, delete=False)
            txn.put(b"applied_seq", b"0", db=self._meta)
        self.succ.clear_from(0)
        self.applied_seq = 0

    # reads ------------------------------------------------------------------------------------

    def lookup_one(self, key: bytes) -> tuple[int, int] | None:
        with self._env.begin(db=self._latest) as txn:
            raw = txn.get(key)
        if raw is None:
            return None
        seq, size = LATEST_ROW.unpack(raw)
        return int(seq), int(size)

    def begin_write(self) -> lmdb.Transaction:
        return self._env.begin(write=True, db=self._latest)

    def lookup_many(
        self, txn: lmdb.Transaction, ordered_keys: Iterable[bytes]
    ) -> dict[bytes, tuple[int, int]]:
        """(seq, size) of the newest version of each of ``ordered_keys`` (sorted, so lmdb's
        cursor only moves forward) that exists."""
        found = txn.cursor().getmulti(ordered_keys)
        if not found:
            return {}
        keys, rows = zip(*found, strict=True)
        return dict(zip(map(bytes, keys), map(LATEST_ROW.unpack, rows), strict=True))

    # writes -----------------------------------------------------------------------------------

    def write_latest(
        self,
        txn: lmdb.Transaction,
        latest: Mapping[bytes, tuple[int, int]],
        removed: Iterable[bytes],
        applied_seq: int,
        *,
        ordered: Sequence[bytes] | None = None,
    ) -> None:
        """Sets the (seq, size) of each key of ``latest`` (``ordered``: its keys sorted, if the
        caller has them) and deletes the ``removed`` keys."""
        if ordered is None:
            ordered = sorted(latest)
        if ordered:
            rows = map(LATEST_ROW.pack, *zip(*map(latest.__getitem__, ordered), strict=True))
            txn.cursor().putmulti(zip(ordered, rows, strict=True))
        for key in removed:
            txn.delete(key)
        txn.put(b"applied_seq", str(applied_seq).encode(), db=self._meta)

    def commit(self, txn: lmdb.Transaction, applied_seq: int) -> None:
        txn.commit()
        self.applied_seq = applied_seq

    def checkpoint(self) -> None:
        """Forces derived state to disk (nothing if the index is closed). Not needed for
        correctness (see the module docstring): it bounds the dirty pages that build up."""
        with self._checkpoint_lock:
            if self._closed:
                return
            self.succ.flush()
            self._env.sync(True)

    def request_checkpoint(self) -> None:
        """``checkpoint`` soon, on the background checkpoint thread."""
        _CHECKPOINTER.request(self)

    def iter_latest(self) -> Iterable[tuple[bytes, int, int]]:
        with self._env.begin(db=self._latest) as txn:
            for key, raw in txn.cursor():
                seq, size = LATEST_ROW.unpack(raw)
                yield bytes(key), int(seq), int(size)

    def key_count(self) -> int:
        with self._env.begin(db=self._latest) as txn:
            return int(txn.stat(self._latest)["entries"])

    def close(self, *, clean: bool) -> None:
        _CHECKPOINTER.forget(self)
        if clean:
            self.checkpoint()
        with self._checkpoint_lock:
            self._closed = True
            self.succ.close()
            self._env.close()
        if clean:
            self._write_state(clean=True)
