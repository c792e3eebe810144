"""Pauseless compaction: copy live data from a snapshot into a new file, catch up, swap.

Commits go on while the bulk copy and the first catch-up rounds run; only the last round, which
copies what arrived since the previous round and writes the header, holds the commit lock
(docs/storage-format.md, "Compaction").
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kayos import limits
from kayos.errors import DiskFullError, StorageError
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import DataFile, data_file_name, header_with
from kayos.storage.disk.index import SEGMENT_MASK, SEGMENT_SHIFT
from kayos.storage.engine import ShardStore

if TYPE_CHECKING:
    from kayos.storage.disk.fileops import FileHandle

_FLUSH_BYTES = 4 * 1024 * 1024
# One compaction per store at a time. Weakly keyed, so an entry goes with its store (a dict keyed
# by id() grew with every store ever compacted, and a new store could inherit a dead one's lock).
compaction_locks: weakref.WeakKeyDictionary[ShardStore, threading.Lock] = (
    weakref.WeakKeyDictionary()
)
_compaction_locks_guard = threading.Lock()


@dataclass(frozen=True, slots=True)
class CompactionResult:
    generation: int
    bytes_before: int
    bytes_after: int
    entries_copied: int
    entries_dropped: int
    catchup_rounds: int
    min_rollback_seq: int
    # Entries dropped because their queue's retention floor passed them (docs/retention.md).
    retention_dropped: int = 0


@dataclass(slots=True)
class _RetentionDrops:
    """Entries dropped by a retention floor (not for being superseded): whether each was
    superseded is settled only when the header is written (a commit during the catch-up may
    supersede it), so ``_finish`` counts them then. ``markers``: those left as commit-end
    markers (an entry of no bytes, counted as superseded)."""

    seqs: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    markers: list[bool] = field(default_factory=list)
    # (key, seq) of those still the newest version of their key: they leave the key index once
    # the new file is installed.
    forgotten: list[tuple[bytes, int]] = field(default_factory=list)


class _Copier:
    """Streams leaves from the old file into the new one through a right edge."""

    def __init__(self, source: DataFile, target: FileHandle, store: ShardStore) -> None:
        self.store = store
        self.source = source
        self.target = target
        self.edge = btree.Edge()
        self.out = btree.Appender(0)
        self.copied = 0
        self.unsynced_bytes = 0

    def add(self, leaf: fmt.Leaf, keep: list[int] | None) -> None:
        if keep is not None:
            if not keep:
                return
            if len(keep) != len(leaf.seqs):
                leaf = _pick(leaf, keep)
        leaf = self._relocate_values(leaf)
        self.edge = self.edge.append(self.out, leaf)
        self.copied += len(leaf.seqs)
        if self.out.pending_bytes() >= _FLUSH_BYTES:
            self.flush()

    def _relocate_values(self, leaf: fmt.Leaf) -> fmt.Leaf:
        if not any(flag & fmt.FLAG_VALUE_OUT_OF_LINE for flag in leaf.flags):
            return leaf
        vals = list(leaf.vals)
        for index, flag in enumerate(leaf.flags):
            if flag & fmt.FLAG_VALUE_OUT_OF_LINE:
                value = self.source.reader.read_value(vals[index])
                vals[index] = self.out.add_chunk(fmt.frame_chunk(fmt.CHUNK_VALUE, value))
        return fmt.Leaf(
            leaf.seqs,
            leaf.keys,
            vals,
            leaf.prevs,
            leaf.flags,
            leaf.sizes,
            leaf.expiries,
            leaf.headers,
        )

    def flush(self) -> None:
        data = self.out.take()
        if data:
            # Compaction may use half the disk reserve (limits.disk_reserve_bytes): enough for
            # a retention compaction to free a full disk, never the room the index needs.
            self.store.check_space(len(data), self.store.options.disk_reserve_bytes // 2)
            self.target.append(data)
            self.unsynced_bytes += len(data)
        if self.unsynced_bytes >= limits.compaction_sync_bytes:
            self.target.sync()
            self.unsynced_bytes = 0

    def copy_range(self, header: fmt.Header, after_seq: int, upto_seq: int) -> None:
        """Copies every entry (all versions) in ``(after_seq, upto_seq]``."""
        for leaf in btree.iter_leaves(self.source.reader, header.root, after_seq, upto_seq):
            lo = bisect.bisect_right(leaf.seqs, after_seq)
            hi = bisect.bisect_right(leaf.seqs, upto_seq)
            if lo == 0 and hi == len(leaf.seqs):
                self.add(leaf, None)
            else:
                self.add(btree.slice_leaf(leaf, lo, hi), None)


def _pick(leaf: fmt.Leaf, keep: list[int]) -> fmt.Leaf:
    return fmt.Leaf(
        [leaf.seqs[i] for i in keep],
        [leaf.keys[i] for i in keep],
        [leaf.vals[i] for i in keep],
        [leaf.prevs[i] for i in keep],
        [leaf.flags[i] for i in keep],
        [leaf.sizes[i] for i in keep],
        None if leaf.expiries is None else [leaf.expiries[i] for i in keep],
        None if leaf.headers is None else [leaf.headers[i] for i in keep],
    )


def _lock_for(store: ShardStore) -> threading.Lock:
    with _compaction_locks_guard:
        return compaction_locks.setdefault(store, threading.Lock())


def compact(store: ShardStore, floors: Mapping[bytes, int] | None = None) -> CompactionResult:
    """Compacts ``store`` into a new file generation; commits keep flowing meanwhile.

    ``floors`` (retention, docs/retention.md): key prefix (the bytes up to and including a key's
    first NUL) -> seq; every entry whose key has that prefix and whose seq is at or below it is
    dropped too, superseded or not."""
    lock = _lock_for(store)
    if not lock.acquire(blocking=False):
        raise StorageError("a compaction of this store is already running")
    try:
        return _compact(store, dict(floors or {}))
    except OSError as exc:
        # _compact removed its unfinished file; callers see kayos errors only.
        if exc.errno == errno.ENOSPC:
            raise DiskFullError(f"compaction of {store.directory}: disk full") from exc
        raise StorageError(f"compaction of {store.directory} failed: {exc}") from exc
    finally:
        lock.release()


def _compact(store: ShardStore, floors: dict[bytes, int]) -> CompactionResult:
    ops = store.fileops
    epoch = store.rollback_epoch
    snapshot = store.snapshot()
    try:
        source = store.current_file()
        header = snapshot.header
        bytes_before = source.handle.size()
        generation = header.generation + 1
        final_path = os.path.join(store.directory, data_file_name(generation))
        temp_path = final_path + ".compact"
        target = ops.open(temp_path, create=True)
        target.truncate(0)
        try:
            copier = _Copier(source, target, store)
            floor = max(
                header.min_rollback_seq, header.last_seq - store.options.rollback_window_seqs
            )
            retained = _RetentionDrops()
            dropped, dropped_bytes, dropped_superseded, dropped_superseded_bytes = _bulk_copy(
                store, copier, header, floor, floors, retained
            )
        except BaseException:
            target.close()
            ops.unlink(temp_path)
            raise
    finally:
        snapshot.release()
    copied_upto = header.last_seq
    rounds = 0
    try:
        while rounds < limits.compaction_catchup_rounds_max:
            current = store.header
            if current.last_seq - copied_upto <= 0 or store.current_file() is not source:
                break
            copier.copy_range(current, copied_upto, current.last_seq)
            copied_upto = current.last_seq
            rounds += 1
        with store.write_lock:
            if store.rollback_epoch != epoch or store.current_file() is not source:
                raise StorageError("compaction abandoned: the store was rolled back meanwhile")
            current = store.header
            copier.copy_range(current, copied_upto, current.last_seq)
            new_header, header_block = _finish(
                store,
                copier,
                current,
                generation=generation,
                floor=floor,
                dropped=(dropped, dropped_bytes, dropped_superseded, dropped_superseded_bytes),
                retained=retained,
            )
            target.close()
            ops.rename(temp_path, final_path)
            ops.sync_dir(store.directory)
            handle = ops.open(final_path)
            store.install_compacted(handle, generation, new_header, header_block, copier.edge)
            store.forget_keys(retained.forgotten)
            # Measured before the lock goes: later commits are not compaction output.
            bytes_after = handle.size()
            ops.unlink(source.handle.path)
    except BaseException:
        target.close()
        if ops.exists(temp_path):
            ops.unlink(temp_path)
        raise
    return CompactionResult(
        generation=generation,
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        entries_copied=copier.copied,
        entries_dropped=dropped,
        catchup_rounds=rounds,
        min_rollback_seq=floor,
        retention_dropped=len(retained.seqs) - sum(retained.markers),
    )


def _bulk_copy(
    store: ShardStore,
    copier: _Copier,
    header: fmt.Header,
    floor: int,
    floors: dict[bytes, int],
    retained: _RetentionDrops,
) -> tuple[int, int, int, int]:
    """Copies the snapshot's entries, dropping versions superseded at or below ``floor`` and
    entries at or below their queue's retention floor (``floors``; counted in ``retained``, not
    in the returned counts)."""
    segments = store.succ_segments
    dropped = dropped_bytes = 0
    # Commit boundaries outlive the entries that ended them (docs/storage-format.md, "Commit
    # boundaries"): a dropped entry that ended a commit moves its flag to the commit's last kept
    # entry, or leaves a marker when that entry sits in a leaf already written; a commit dropped
    # whole needs neither (cutting at the boundary before it is the same cut). A marker from an
    # earlier compaction is such a dropped end too: it goes when its commit is dropped whole, or
    # hands its flag on when the commit's last kept entry now shares its leaf.
    last_boundary = 0  # seq of the last commit boundary walked, as the new file will know it
    last_kept = 0  # seq of the last entry kept (markers aside)
    highest_floor = max(floors.values(), default=0)
    for leaf in btree.iter_leaves(copier.source.reader, header.root, 0, header.last_seq):
        keep: list[int] = []
        ends: list[int] = []  # kept entries that now end their commit
        markers: list[int] = []
        segment_count = len(segments)
        check_floors = leaf.seqs[0] <= highest_floor
        for index, seq in enumerate(leaf.seqs):
            flag = leaf.flags[index]
            by_retention = False
            if flag & fmt.FLAG_COMMIT_MARKER:
                drop = True  # it stands for a dropped entry; kept below only while still needed
            else:
                segment = seq >> SEGMENT_SHIFT
                successor = segments[segment][seq & SEGMENT_MASK] if segment < segment_count else 0
                drop = 0 < successor <= floor
                if not drop and check_floors:
                    key = leaf.keys[index]
                    cut = key.find(b"\x00")
                    if cut >= 0 and seq <= floors.get(key[: cut + 1], 0):
                        drop = by_retention = True
            if by_retention:
                # Counted when the header is written (_finish); boundaries as for any drop.
                marker = False
                if flag & fmt.FLAG_BATCH_END:
                    marker = _hand_on_end(
                        leaf, index, keep, ends, markers, last_kept, last_boundary
                    )
                    last_boundary = seq
                retained.seqs.append(seq)
                retained.keys.append(leaf.keys[index])
                retained.sizes.append(leaf.sizes[index])
                retained.markers.append(marker)
                continue
            if drop:
                dropped_bytes += leaf.sizes[index]
                if flag & fmt.FLAG_BATCH_END:
                    marker = _hand_on_end(
                        leaf, index, keep, ends, markers, last_kept, last_boundary
                    )
                    last_boundary = seq
                    if marker:
                        continue  # a marker stays an entry (of no bytes)
                dropped += 1
                continue
            keep.append(index)
            last_kept = seq
            if flag & fmt.FLAG_BATCH_END:
                last_boundary = seq
        if ends or markers:
            leaf = _with_boundaries(leaf, ends, markers)
        copier.add(leaf, keep)
    # Every dropped entry was superseded, so superseded counters drop by the same amounts (a
    # marker, kept or dropped, is a superseded entry of no bytes).
    return dropped, dropped_bytes, dropped, dropped_bytes


def _hand_on_end(
    leaf: fmt.Leaf,
    index: int,
    keep: list[int],
    ends: list[int],
    markers: list[int],
    last_kept: int,
    last_boundary: int,
) -> bool:
    """Where the commit end of the dropped entry ``leaf[index]`` goes. A commit dropped whole
    (nothing kept since ``last_boundary``) needs none. Otherwise the flag moves to the commit's
    last kept entry ``last_kept`` when this leaf holds it (added to ``ends``); else the dropped
    entry stays as a commit-end marker (added to ``markers`` and ``keep``), and True says so."""
    if last_kept <= last_boundary:
        return False
    if keep and leaf.seqs[keep[-1]] == last_kept:
        ends.append(keep[-1])
        return False
    markers.append(index)
    keep.append(index)
    return True


def _with_boundaries(leaf: fmt.Leaf, ends: list[int], markers: list[int]) -> fmt.Leaf:
    """The leaf with the entries at ``ends`` flagged as ending a commit and those at ``markers``
    turned into commit-end markers (seq, key and prev kept; no value, size, expiry or headers)."""
    vals, flags, sizes = list(leaf.vals), list(leaf.flags), list(leaf.sizes)
    expiries = None if leaf.expiries is None else list(leaf.expiries)
    headers = None if leaf.headers is None else list(leaf.headers)
    for index in ends:
        flags[index] |= fmt.FLAG_BATCH_END
    for index in markers:
        vals[index] = None
        flags[index] = fmt.COMMIT_MARKER_FLAGS
        sizes[index] = 0
        if expiries is not None:
            expiries[index] = 0
        if headers is not None:
            headers[index] = None
    return fmt.Leaf(leaf.seqs, leaf.keys, vals, leaf.prevs, flags, sizes, expiries, headers)


def _finish(
    store: ShardStore,
    copier: _Copier,
    current: fmt.Header,
    *,
    generation: int,
    floor: int,
    dropped: tuple[int, int, int, int],
    retained: _RetentionDrops,
) -> tuple[fmt.Header, int]:
    dropped_count, dropped_bytes, dropped_superseded, dropped_superseded_bytes = dropped
    if retained.seqs:
        # Settled now, under the commit lock: superseded as of the header being written. A
        # dropped entry still the newest version of its key leaves the key index with it.
        segments = store.succ_segments
        for seq, key, size, marker in zip(
            retained.seqs, retained.keys, retained.sizes, retained.markers, strict=True
        ):
            segment = seq >> SEGMENT_SHIFT
            superseded = segment < len(segments) and segments[segment][seq & SEGMENT_MASK] != 0
            dropped_bytes += size
            if marker:  # stays as an entry of no bytes that counts as superseded
                if superseded:
                    dropped_superseded_bytes += size
                else:
                    dropped_superseded -= 1
            else:
                dropped_count += 1
                if superseded:
                    dropped_superseded += 1
                    dropped_superseded_bytes += size
            if not superseded:
                retained.forgotten.append((key, seq))
    out = copier.out
    root = copier.edge.write_root(out)
    meta = store.meta
    meta_pos = out.add_chunk(fmt.encode_meta(meta)) if meta else -1
    copier.flush()
    copier.target.sync()
    region_start = out.pos
    pad = -region_start % fmt.BLOCK
    live_payload = (current.payload_bytes - dropped_bytes) - (
        current.superseded_bytes - dropped_superseded_bytes
    )
    new_header = header_with(
        current,
        generation=generation,
        commit_no=current.commit_no + 1,
        root=root,
        prev_header=-1,
        region_start=region_start,
        region_crc=fmt.crc32c(bytes(pad)),
        entry_count=current.entry_count - dropped_count,
        payload_bytes=current.payload_bytes - dropped_bytes,
        superseded_count=current.superseded_count - dropped_superseded,
        superseded_bytes=current.superseded_bytes - dropped_superseded_bytes,
        meta=meta_pos,
        min_rollback_seq=floor,
        timestamp_ms=int(store.clock.now_s() * 1000),
    )
    assert (root.count if root else 0) == new_header.entry_count, "compaction counts agree"
    size_estimate = region_start + pad + fmt.BLOCK
    overhead = size_estimate / live_payload if live_payload > 0 else 1.25
    new_header = header_with(new_header, file_overhead=min(4.0, max(1.0, overhead)))
    data, block_pos, _ = fmt.header_block(region_start, fmt.encode_header(new_header))
    copier.target.append(data)
    copier.target.sync()
    return new_header, block_pos
