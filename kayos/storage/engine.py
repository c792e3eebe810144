"""The shard store: open/recover, group commit, snapshots, rollback.

Threads: any number of threads may call ``commit`` at once; one of them becomes the leader
and writes every queued batch in one group commit (one write, one fdatasync), the others wait for
their result. Readers (snapshots, ``get``) never take the commit lock: nodes are immutable once
written and the current (file, header) pair is swapped atomically.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import logging
import os
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack

from kayos import limits
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import (
    CorruptionError,
    DiskFullError,
    InvalidRequest,
    LimitExceeded,
    RollbackTooFarError,
    SnapshotInvalidatedError,
    StorageError,
    StoreClosedError,
)
from kayos.storage import btree
from kayos.storage import format as fmt
from kayos.storage.fileops import OS_FILEOPS, FileHandle, FileOps
from kayos.storage.index import SEGMENT_MASK, SEGMENT_SHIFT, DerivedIndex

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

log = logging.getLogger("kayos.storage")

DATA_PREFIX = "data."
DATA_SUFFIX = ".kys"
_REGION_READ_BYTES = 1 << 20
# Each retry needs a whole compaction to swap files between two reads of _current; the bound
# only turns a livelock bug into an error.
_PIN_ATTEMPTS_MAX = 100


# --- public value types -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    expiry_ms: int = 0
    headers: dict[str, bytes] | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


Op = Put | Delete


class Entry(NamedTuple):
    seq: int
    key: bytes
    value: bytes | None  # None for a delete (tombstone)
    expiry_ms: int
    headers: dict[str, bytes] | None
    prev_seq: int  # the version of this key it superseded, 0 if none
    flags: int

    @property
    def deleted(self) -> bool:
        return bool(self.flags & fmt.FLAG_DELETE)


class CommitResult(NamedTuple):
    first_seq: int  # first_seq == last_seq + 1 for a metadata-only commit
    last_seq: int
    commit_no: int


@dataclass(slots=True)
class StoreOptions:
    rollback_window_seqs: int = limits.rollback_window_seqs
    compaction_garbage_ratio: float = limits.compaction_garbage_ratio
    compaction_file_bytes_min: int = limits.compaction_file_bytes_min
    index_checkpoint_commits: int = limits.index_checkpoint_commits
    store_uuid: bytes | None = None  # for tests; new stores get a random one


@dataclass(slots=True)
class RecoveryReport:
    dropped_bytes: int = 0
    dropped_from: int = -1
    rebuilt_index: bool = False
    replayed_entries: int = 0
    reason: str = ""


# --- files --------------------------------------------------------------------------------------


class DataFile:
    """One generation's file, shared by the store and the snapshots pinned on it."""

    def __init__(self, handle: FileHandle, generation: int) -> None:
        self.handle = handle
        self.reader = btree.NodeReader(handle)
        self.generation = generation
        self._refs = 1
        self._lock = threading.Lock()

    def acquire(self) -> DataFile:
        with self._lock:
            if self._refs <= 0:
                raise StoreClosedError(f"{self.handle.path} is closed")
            self._refs += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            closing = self._refs == 0
        if closing:
            self.handle.close()


class _Current(NamedTuple):
    file: DataFile
    header: fmt.Header
    meta: dict[str, Any]


def data_file_name(generation: int) -> str:
    return f"{DATA_PREFIX}{generation}{DATA_SUFFIX}"


def parse_generation(name: str) -> int | None:
    if not (name.startswith(DATA_PREFIX) and name.endswith(DATA_SUFFIX)):
        return None
    middle = name[len(DATA_PREFIX) : -len(DATA_SUFFIX)]
    return int(middle) if middle.isdigit() else None


def read_header_at(handle: FileHandle, block_pos: int) -> fmt.Header:
    """Parses the header in the block at ``block_pos``; raises CorruptionError if it is not one."""
    raw = handle.pread(fmt.BLOCK, block_pos)
    path = handle.path
    if len(raw) < 1 + fmt.PREFIX_BYTES or raw[0] != fmt.BLOCK_HEADER:
        raise CorruptionError("not a header block", path=path, offset=block_pos)
    length, crc = fmt.parse_chunk_prefix(raw[1 : 1 + fmt.PREFIX_BYTES], path=path, offset=block_pos)
    if 1 + fmt.PREFIX_BYTES + length > len(raw):
        raise CorruptionError("header runs past its block", path=path, offset=block_pos)
    body = raw[1 + fmt.PREFIX_BYTES : 1 + fmt.PREFIX_BYTES + length]
    _, payload = fmt.check_chunk_body(
        body, crc, path=path, offset=block_pos, expect=fmt.CHUNK_HEADER
    )
    header = fmt.decode_header(payload, path=path, offset=block_pos)
    if not (0 <= header.region_start <= block_pos):
        raise CorruptionError("header region out of bounds", path=path, offset=block_pos)
    return header


def header_end(handle: FileHandle, block_pos: int) -> int:
    raw = handle.pread(1 + fmt.PREFIX_BYTES, block_pos)
    length, _ = fmt.parse_chunk_prefix(raw[1:], path=handle.path, offset=block_pos)
    return block_pos + 1 + fmt.PREFIX_BYTES + length


def region_matches(handle: FileHandle, header: fmt.Header, block_pos: int) -> bool:
    crc = 0
    pos = header.region_start
    while pos < block_pos:
        data = handle.pread(min(_REGION_READ_BYTES, block_pos - pos), pos)
        if not data:
            return False
        crc = fmt.crc32c(data, crc)
        pos += len(data)
    return crc == header.region_crc


def find_last_header(handle: FileHandle) -> tuple[int, fmt.Header]:
    """Steps back from the end of the file to the last header whose chunk and region check out."""
    size = handle.size()
    if size == 0:
        raise CorruptionError("empty data file: no header", path=handle.path, offset=0)
    block = (size - 1) // fmt.BLOCK * fmt.BLOCK
    first_problem: CorruptionError | None = None
    while block >= 0:
        if handle.pread(1, block) == bytes((fmt.BLOCK_HEADER,)):
            try:
                header = read_header_at(handle, block)
                if region_matches(handle, header, block):
                    return block, header
                raise CorruptionError("commit region CRC mismatch", path=handle.path, offset=block)
            except CorruptionError as exc:
                first_problem = first_problem or exc
        block -= fmt.BLOCK
    if first_problem is not None:
        raise first_problem
    raise CorruptionError("no header block found", path=handle.path, offset=0)


# --- the store ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    ops: Sequence[Op]
    meta: dict[str, Any] | None
    seqs: Sequence[int] | None
    last_seq: int | None = None
    claim_seq: bool = False
    result: CommitResult | None = None
    error: BaseException | None = None
    done: bool = False
    payload_bytes: int = 0


@dataclass(slots=True)
class _GroupBuild:
    """Everything one group commit computed before it touches the file."""

    out: btree.Appender
    cols: fmt.Leaf
    supersede: list[tuple[int, int]] = field(default_factory=list)
    latest: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    superseded_count: int = 0
    superseded_bytes: int = 0
    payload_bytes: int = 0
    meta: dict[str, Any] | None = None
    last_seq: int = 0


def _packed_headers_size(headers: dict[str, bytes] | None) -> int:
    if not headers:
        return 0
    return len(msgpack.packb(headers, use_bin_type=True))


def validate_meta(meta: dict[str, Any] | None) -> None:
    """Refuses metadata the meta chunk cannot hold before it is queued: in a group commit it
    would otherwise fail every batch of the group."""
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise InvalidRequest("metadata must be a dict")
    try:
        packed = msgpack.packb(meta, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"metadata cannot be encoded: {exc}") from exc
    if len(packed) >= limits.chunk_bytes_max:
        raise LimitExceeded(f"metadata of {len(packed)} bytes exceeds {limits.chunk_bytes_max}")


def validate_ops(ops: Sequence[Op]) -> int:
    """Checks every bound; returns the batch's payload bytes. Raises before anything is queued."""
    if len(ops) > limits.batch_entries_max:
        raise LimitExceeded(f"batch of {len(ops)} entries exceeds {limits.batch_entries_max}")
    total = 0
    for op in ops:
        key = op.key
        if not isinstance(key, bytes) or not key:
            raise InvalidRequest("every key must be non-empty bytes")
        if len(key) > limits.key_bytes_max:
            raise LimitExceeded(f"key of {len(key)} bytes exceeds {limits.key_bytes_max}")
        total += len(key)
        if isinstance(op, Put):
            if not isinstance(op.value, bytes):
                raise InvalidRequest("values must be bytes")
            if len(op.value) > limits.value_bytes_max:
                raise LimitExceeded(
                    f"value of {len(op.value)} bytes exceeds {limits.value_bytes_max}"
                )
            if op.expiry_ms < 0:
                raise InvalidRequest("expiry_ms must be >= 0")
            header_bytes = _packed_headers_size(op.headers)
            if header_bytes > limits.headers_bytes_max:
                raise LimitExceeded(
                    f"headers of {header_bytes} bytes exceed {limits.headers_bytes_max}"
                )
            total += len(op.value) + header_bytes
        elif not isinstance(op, Delete):
            raise InvalidRequest(f"unknown operation {type(op).__name__}")
    if total > limits.batch_bytes_max:
        raise LimitExceeded(f"batch of {total} bytes exceeds {limits.batch_bytes_max}")
    return total


class ShardStore:
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
        return store

    def _open(self) -> None:
        ops = self._ops
        ops.makedirs(self.directory)
        generations: list[int] = []
        for name in ops.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if name.endswith((".compact", ".init")):
                ops.unlink(path)  # a compaction or creation that never finished
                continue
            generation = parse_generation(name)
            if generation is not None:
                generations.append(generation)
        if not generations:
            self._create(1)
            generations = [1]
        generation = max(generations)
        for old in generations:
            if old != generation:
                ops.unlink(os.path.join(self.directory, data_file_name(old)))
        handle = ops.open(os.path.join(self.directory, data_file_name(generation)))
        try:
            self._load(handle, generation)
        except BaseException:
            handle.close()  # a failed open keeps nothing open
            raise

    def _load(self, handle: FileHandle, generation: int) -> None:
        block_pos, header = find_last_header(handle)
        end = header_end(handle, block_pos)
        if handle.size() > end:
            self._cut_tail(handle, end)
        data_file = DataFile(handle, generation)
        self._last_header_block = block_pos
        meta = data_file.reader.read_meta(header.meta) if header.meta >= 0 else {}
        self._current = _Current(data_file, header, meta)
        self._edge = btree.Edge.from_root(data_file.reader, header.root)
        self._index = DerivedIndex(os.path.join(self.directory, "derived"), header.store_uuid)
        try:
            self._catch_up_index()
        except BaseException:
            self._index.close(clean=False)
            raise

    def _create(self, generation: int) -> None:
        store_uuid = self.options.store_uuid or uuid.uuid4().bytes
        header = fmt.Header(
            store_uuid=store_uuid,
            generation=generation,
            commit_no=0,
            last_seq=0,
            root=None,
            prev_header=-1,
            region_start=0,
            region_crc=0,
            entry_count=0,
            payload_bytes=0,
            superseded_count=0,
            superseded_bytes=0,
            meta=-1,
            min_rollback_seq=0,
            timestamp_ms=int(self._clock.now_s() * 1000),
            file_overhead=1.25,
        )
        data, _, _ = fmt.header_block(0, fmt.encode_header(header))
        final = os.path.join(self.directory, data_file_name(generation))
        temp = final + ".init"
        handle = self._ops.open(temp, create=True)
        try:
            handle.append(data)
            handle.sync()
        finally:
            handle.close()
        self._ops.rename(temp, final)
        self._ops.sync_dir(self.directory)

    def _cut_tail(self, handle: FileHandle, end: int) -> None:
        size = handle.size()
        tail = handle.pread(size - end, end)
        tail_path = handle.path + ".tail"
        saved = self._ops.open(tail_path, create=True)
        try:
            saved.truncate(0)
            saved.append(tail)
            saved.sync()
        finally:
            saved.close()
        handle.truncate(end)
        handle.sync()
        self.recovery.dropped_bytes = size - end
        self.recovery.dropped_from = end
        self.recovery.reason = "bytes after the last valid header (a torn or unsynced commit)"
        log.warning(
            "%s: dropped %d bytes after the last valid header at offset %d (kept in %s)",
            handle.path,
            size - end,
            end,
            tail_path,
        )

    def _catch_up_index(self) -> None:
        index = self._index
        header = self._current.header
        if index.applied_seq > header.last_seq:
            index.reset()
            self.recovery.rebuilt_index = True
        if index.applied_seq == 0 and header.last_seq > 0:
            self.recovery.rebuilt_index = True
        after = index.applied_seq
        if after >= header.last_seq:
            return
        reader = self._current.file.reader
        index.succ.ensure(header.last_seq)
        replayed = 0
        for leaf in btree.iter_leaves(reader, header.root, after, header.last_seq):
            txn = index.begin_write()
            try:
                keys = [k for s, k in zip(leaf.seqs, leaf.keys, strict=True) if s > after]
                existing = index.lookup_many(txn, keys)
                latest: dict[bytes, tuple[int, int]] = {}
                for seq, key, prev, size in zip(
                    leaf.seqs, leaf.keys, leaf.prevs, leaf.sizes, strict=True
                ):
                    if seq <= after:
                        continue
                    current = latest.get(key) or existing.get(key)
                    if current is not None and current[0] >= seq:
                        continue  # already applied before the stop
                    if prev:
                        index.succ.set(prev, seq)
                    latest[key] = (seq, size)
                    replayed += 1
                last = leaf.seqs[-1]
                index.write_latest(
                    txn, ((k, s, z) for k, (s, z) in latest.items()), (), min(last, header.last_seq)
                )
                index.commit(txn, min(last, header.last_seq))
            except BaseException:
                txn.abort()
                raise
        self.recovery.replayed_entries = replayed

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
        payload = validate_ops(ops)
        validate_meta(meta)
        if seqs is not None:
            if len(seqs) != len(ops):
                raise InvalidRequest("seqs and ops differ in length")
            if any(b <= a for a, b in itertools.pairwise(seqs)):
                raise InvalidRequest("seqs must be strictly increasing")
        if last_seq is not None and seqs and last_seq < seqs[-1]:
            raise InvalidRequest(f"last_seq {last_seq} is below the explicit seq {seqs[-1]}")
        if claim_seq and (ops or last_seq is not None):
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
        pending = _Pending(ops, meta, seqs, last_seq, claim_seq, payload_bytes=payload)
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
                    while self._queue and (not group or self._queue[0].payload_bytes <= budget):
                        item = self._queue.popleft()
                        budget -= item.payload_bytes
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

    def _build_group(
        self, group: list[_Pending], existing: dict[bytes, tuple[int, int]]
    ) -> _GroupBuild:
        current = self._current
        build = _GroupBuild(btree.Appender(current.file.handle.size()), fmt.empty_leaf())
        cols = build.cols
        expiries: list[int] = []
        headers: list[dict[str, bytes] | None] = []
        any_expiry = False
        any_headers = False
        latest = build.latest
        next_seq = current.header.last_seq + 1
        inline_max = limits.value_inline_bytes_max
        meta: dict[str, Any] | None = None
        for pending in group:
            if pending.seqs is not None and pending.seqs and pending.seqs[0] < next_seq:
                pending.error = InvalidRequest(
                    f"explicit seq {pending.seqs[0]} is not above last seq {next_seq - 1}"
                )
                pending.done = True
                continue
            if pending.last_seq is not None and pending.last_seq < next_seq:
                pending.error = InvalidRequest(
                    f"last_seq {pending.last_seq} is not above last seq {next_seq - 1}"
                )
                pending.done = True
                continue
            first = next_seq if pending.seqs is None or not pending.seqs else pending.seqs[0]
            for position, op in enumerate(pending.ops):
                seq = next_seq if pending.seqs is None else pending.seqs[position]
                next_seq = seq + 1
                key = op.key
                previous = latest.get(key) or existing.get(key)
                if isinstance(op, Put):
                    value = op.value
                    header_map = op.headers or None
                    size = len(key) + len(value) + _packed_headers_size(header_map)
                    if len(value) > inline_max:
                        stored: Any = build.out.add_chunk(fmt.frame_chunk(fmt.CHUNK_VALUE, value))
                        flag = fmt.FLAG_VALUE_OUT_OF_LINE
                    else:
                        stored = value
                        flag = 0
                    expiry = op.expiry_ms
                    any_expiry = any_expiry or expiry != 0
                    any_headers = any_headers or header_map is not None
                else:
                    header_map = None
                    size = len(key)
                    stored = None
                    flag = fmt.FLAG_DELETE
                    expiry = 0
                cols.seqs.append(seq)
                cols.keys.append(key)
                cols.vals.append(stored)
                cols.prevs.append(previous[0] if previous else 0)
                cols.flags.append(flag)
                cols.sizes.append(size)
                expiries.append(expiry)
                headers.append(header_map)
                if previous is not None:
                    build.supersede.append((previous[0], seq))
                    build.superseded_count += 1
                    build.superseded_bytes += previous[1]
                build.payload_bytes += size
                latest[key] = (seq, size)
            if pending.ops:
                cols.flags[-1] |= fmt.FLAG_BATCH_END
            if pending.last_seq is not None:
                next_seq = pending.last_seq + 1
            elif pending.claim_seq:
                next_seq += 1
            pending.result = CommitResult(first, next_seq - 1, current.header.commit_no + 1)
            if pending.meta:
                meta = dict(current.meta) if meta is None else meta
                for name, value in pending.meta.items():
                    if value is None:
                        meta.pop(name, None)
                    else:
                        meta[name] = value
        cols.expiries = expiries if any_expiry else None
        cols.headers = headers if any_headers else None
        build.meta = meta
        build.last_seq = next_seq - 1
        return build

    def _commit_group(self, group: list[_Pending]) -> None:
        index = self._index
        txn = index.begin_write()
        try:
            keys = list({op.key for pending in group for op in pending.ops})
            existing = index.lookup_many(txn, keys)
            build = self._build_group(group, existing)
            current = self._current
            header = current.header
            live = [p for p in group if not p.done]
            if not live:
                txn.abort()
                return
            edge = self._edge
            root = header.root
            if build.cols.seqs:
                edge = edge.append(build.out, build.cols)
                root = edge.write_root(build.out)
            meta_pos = header.meta
            if build.meta is not None:
                meta_pos = build.out.add_chunk(fmt.encode_meta(build.meta))
            new_header = fmt.Header(
                store_uuid=header.store_uuid,
                generation=header.generation,
                commit_no=header.commit_no + 1,
                last_seq=max(header.last_seq, build.last_seq),
                root=root,
                prev_header=-1,  # filled by _write_commit
                region_start=0,
                region_crc=0,
                entry_count=header.entry_count + len(build.cols.seqs),
                payload_bytes=header.payload_bytes + build.payload_bytes,
                superseded_count=header.superseded_count + build.superseded_count,
                superseded_bytes=header.superseded_bytes + build.superseded_bytes,
                meta=meta_pos,
                min_rollback_seq=header.min_rollback_seq,
                timestamp_ms=int(self._clock.now_s() * 1000),
                file_overhead=header.file_overhead,
            )
            new_header = self._write_commit(build.out, new_header)
            # Durable. Successors first, so a reader of the new header never sees both versions.
            succ = index.succ
            succ.ensure(new_header.last_seq)
            for old_seq, new_seq in build.supersede:
                succ.set(old_seq, new_seq)
            meta = build.meta if build.meta is not None else current.meta
            self._current = _Current(current.file, new_header, meta)
            self._edge = edge
            index.write_latest(
                txn, ((k, s, z) for k, (s, z) in build.latest.items()), (), new_header.last_seq
            )
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
        region_crc = fmt.crc32c(bytes(pad), fmt.crc32c(body))
        previous_block = self._last_header_block
        header = header_with(
            header, prev_header=previous_block, region_start=region_start, region_crc=region_crc
        )
        header_bytes, block_pos, _ = fmt.header_block(out.pos, fmt.encode_header(header))
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

    def _undo_append(self, handle: FileHandle, size: int) -> None:
        try:
            handle.truncate(size)
        except OSError as exc:
            self._poisoned = exc
            log.error("%s: could not truncate a failed commit: %s", handle.path, exc)

    def _maybe_checkpoint(self) -> None:
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint >= self.options.index_checkpoint_commits:
            self._commits_since_checkpoint = 0
            self._index.checkpoint()

    # --- reads ----------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Pins the current committed state. Release it (or use ``with``) when done."""
        self._check_open()
        current = self._pin_current()
        return Snapshot(self, current.file, current.header, current.meta)

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

    def rollback_to(self, seq: int) -> None:
        """Drops every entry after ``seq`` and restores the state as of ``seq``."""
        if seq < 0:
            raise InvalidRequest(f"cannot roll back to seq {seq}")
        with self._write_lock:
            self._check_usable()
            current = self._current
            header = current.header
            if seq >= header.last_seq:
                return
            if seq < header.min_rollback_seq:
                raise RollbackTooFarError(
                    f"cannot roll back to {seq}: compaction kept versions from "
                    f"{header.min_rollback_seq} on"
                )
            try:
                self._rollback(seq)
            except OSError as exc:
                raise StorageError(f"rollback failed: {exc}") from exc

    def _rollback(self, seq: int) -> None:
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
            size = located[0].sizes[located[1]] if located else 0
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
        assert (root.count if root else 0) == new_header.entry_count, "rollback counts agree"
        new_header = self._write_commit(out, new_header)
        self._rollbacks.append((len(self._rollbacks), seq))
        for prev, _ in restored.values():
            succ.set(prev, 0)
        succ.clear_from(seq + 1)
        self._current = _Current(current.file, new_header, current.meta)
        self._edge = edge
        txn = self._index.begin_write()
        try:
            removed = [key for key in first_prev if key not in restored]
            self._index.write_latest(
                txn, ((k, s, z) for k, (s, z) in restored.items()), removed, seq
            )
            self._index.commit(txn, seq)
        except BaseException:
            txn.abort()
            raise
        self._index.checkpoint()

    # --- compaction hooks (kayos.storage.compact drives these) ---------------------------------

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


def header_with(header: fmt.Header, **changes: Any) -> fmt.Header:
    fields = {name: getattr(header, name) for name in fmt.Header.__slots__}
    fields.update(changes)
    return fmt.Header(**fields)


_new_entry = tuple.__new__


def _successors(segments: list[memoryview], seqs: list[int], lo: int, hi: int) -> list[int]:
    """succ[] for seqs[lo:hi]: one slice of the mapped array when the seqs are consecutive in one
    segment (every leaf the write path makes), else one lookup each."""
    first, last = seqs[lo], seqs[hi - 1]
    segment = first >> SEGMENT_SHIFT
    if segment >= len(segments):
        return [0] * (hi - lo)
    if last - first == hi - lo - 1 and last >> SEGMENT_SHIFT == segment:
        start = first & SEGMENT_MASK
        return segments[segment][start : start + (hi - lo)].tolist()
    count = len(segments)
    return [
        segments[seq >> SEGMENT_SHIFT][seq & SEGMENT_MASK] if seq >> SEGMENT_SHIFT < count else 0
        for seq in seqs[lo:hi]
    ]


def _entry_at(reader: btree.NodeReader, leaf: fmt.Leaf, index: int) -> Entry:
    flags = leaf.flags[index]
    value = leaf.vals[index]
    if flags & fmt.FLAG_VALUE_OUT_OF_LINE:
        value = reader.read_value(value)
    return Entry(
        leaf.seqs[index],
        leaf.keys[index],
        value,
        leaf.expiries[index] if leaf.expiries is not None else 0,
        leaf.headers[index] if leaf.headers is not None else None,
        leaf.prevs[index],
        flags,
    )


class Snapshot:
    """A pinned committed state: scans see exactly the versions current as of ``boundary``."""

    def __init__(
        self, store: ShardStore, data_file: DataFile, header: fmt.Header, meta: dict[str, Any]
    ) -> None:
        self._store = store
        self._file: DataFile | None = data_file
        self.header = header
        self.boundary = header.last_seq
        self.meta = meta
        self._epoch = store.rollback_epoch

    def release(self) -> None:
        if self._file is not None:
            self._file.release()
            self._file = None

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _check(self) -> DataFile:
        if self._file is None:
            raise StoreClosedError("snapshot released")
        # The successor map belongs to the store; without it every version looks current.
        self._store._check_open()
        if self._store._snapshot_invalidated(self._epoch, self.boundary):
            raise SnapshotInvalidatedError(
                f"a rollback went below this snapshot's boundary {self.boundary}"
            )
        return self._file

    def scan(
        self, after_seq: int = 0, upto_seq: int | None = None, *, now_ms: int | None = None
    ) -> Iterator[Entry]:
        for page in self.pages(after_seq, upto_seq, now_ms=now_ms):
            yield from page

    def pages(
        self,
        after_seq: int = 0,
        upto_seq: int | None = None,
        *,
        page_entries: int = limits.scan_page_entries_default,
        now_ms: int | None = None,
        include_expired: bool = False,
        as_of: int | None = None,
    ) -> Iterator[list[Entry]]:
        """Pages of the live entries with ``after_seq < seq <= upto_seq`` as of this snapshot,
        in seq order. Deletes are included (consumers apply them); expired entries are not.

        ``as_of`` (at most the boundary) reads the versions that were current at that earlier
        seq instead: a consumer paging through ``(hwm, B]`` over several requests passes
        ``as_of=B`` and gets one consistent view even from newer snapshots, as long as the
        versions superseded since B are still in the file (the rollback window keeps them)."""
        data_file = self._check()
        reader = data_file.reader
        boundary = self.boundary if as_of is None else min(as_of, self.boundary)
        upto = boundary if upto_seq is None else min(upto_seq, boundary)
        if now_ms is None:
            now_ms = int(self._store.clock.now_s() * 1000)
        skip_expired = not include_expired
        segments = self._store.succ_segments
        page: list[Entry] = []
        for leaf in btree.iter_leaves(reader, self.header.root, after_seq, upto):
            seqs = leaf.seqs
            lo = bisect.bisect_right(seqs, after_seq)
            hi = bisect.bisect_right(seqs, upto)
            if lo >= hi:
                continue
            successors = _successors(segments, seqs, lo, hi)
            count = hi - lo
            expiries = leaf.expiries[lo:hi] if leaf.expiries is not None else repeat(0, count)
            headers = leaf.headers[lo:hi] if leaf.headers is not None else repeat(None, count)
            for seq, key, value, prev, flag, successor, expiry, header_map in zip(
                seqs[lo:hi],
                leaf.keys[lo:hi],
                leaf.vals[lo:hi],
                leaf.prevs[lo:hi],
                leaf.flags[lo:hi],
                successors,
                expiries,
                headers,
                strict=False,
            ):
                if successor and successor <= boundary:
                    continue
                if expiry and skip_expired and expiry <= now_ms:
                    continue
                if flag & fmt.FLAG_VALUE_OUT_OF_LINE:
                    value = reader.read_value(value)
                page.append(_new_entry(Entry, (seq, key, value, expiry, header_map, prev, flag)))
            if len(page) >= page_entries:
                # Checked after the page is built and before it is handed out: a rollback marks
                # snapshots invalid before it touches the successor map, so a page that passes
                # was built from a consistent map.
                self._check()
                while len(page) >= page_entries:
                    yield page[:page_entries]
                    page = page[page_entries:]
        if page:
            self._check()
            yield page
