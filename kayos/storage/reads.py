"""Reading a pinned committed state: ``Snapshot`` and the entry decoding it shares with
``ShardStore.get``.

Separate from the engine: the read path takes no commit lock and only needs a few things of the
store (``SnapshotStore``), so it does not import the engine that builds snapshots.
"""

from __future__ import annotations

import bisect
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

from kayos import limits
from kayos.errors import InvalidRequest, SnapshotInvalidatedError, StoreClosedError
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.headerwalk import MetaAsOf, meta_as_of
from kayos.storage.disk.index import SEGMENT_MASK, SEGMENT_SHIFT
from kayos.storage.records import Entry

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kayos.clock import Clock
    from kayos.storage.disk.datafile import DataFile


class SnapshotStore(Protocol):
    """What a snapshot needs of its store (kayos.storage.engine.ShardStore)."""

    @property
    def rollback_epoch(self) -> int: ...

    @property
    def succ_segments(self) -> list[memoryview]: ...

    @property
    def clock(self) -> Clock: ...

    def check_open(self) -> None: ...

    def snapshot_invalidated(self, epoch: int, boundary: int) -> bool: ...


_new_entry = tuple.__new__
_MARKER_OR_OUT_OF_LINE = fmt.FLAG_COMMIT_MARKER | fmt.FLAG_VALUE_OUT_OF_LINE


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


def read_entry(reader: btree.NodeReader, leaf: fmt.Leaf, index: int) -> Entry:
    """Entry ``index`` of ``leaf``, its out-of-line value read through ``reader``."""
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
        self, store: SnapshotStore, data_file: DataFile, header: fmt.Header, meta: dict[str, Any]
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
        self._store.check_open()
        if self._store.snapshot_invalidated(self._epoch, self.boundary):
            raise SnapshotInvalidatedError(
                f"a rollback went below this snapshot's boundary {self.boundary}"
            )
        return self._file

    def leaves(self, after_seq: int, upto_seq: int) -> Iterator[fmt.Leaf]:
        """The leaves holding seqs in ``(after_seq, min(upto_seq, boundary)]`` as stored: every
        version, superseded ones and commit-end markers included (kayos.storage.readback reads
        commit boundaries off them). Call ``check`` after use, as ``pages`` does."""
        reader = self._check().reader
        return btree.iter_leaves(reader, self.header.root, after_seq, min(upto_seq, self.boundary))

    def reader(self) -> btree.NodeReader:
        """The reader of the pinned file (kayos.storage.maintenance.check walks a live store's
        tree with it)."""
        return self._check().reader

    def entry_at(self, leaf: fmt.Leaf, index: int) -> Entry:
        """Entry ``index`` of a leaf from ``leaves``, its out-of-line value read."""
        return read_entry(self._check().reader, leaf, index)

    def check(self) -> None:
        """Raises if the snapshot was released or a rollback went below its boundary."""
        self._check()

    def meta_as_of(self, seq: int) -> MetaAsOf | None:
        """The metadata as of ``seq`` (at most the boundary; kayos.storage.disk.headerwalk): this
        snapshot's own map, read nowhere, when ``seq`` is its boundary; else the newest header at
        or below ``seq`` found walking back from its header (at most
        ``limits.rollback_meta_headers_max`` headers), None if none is reached."""
        if seq >= self.boundary:
            return MetaAsOf(self.meta, self.boundary, True)
        data_file = self._check()
        handle = data_file.handle
        found = meta_as_of(
            handle,
            data_file.reader,
            self.header,
            handle.size(),
            seq,
            current=self.meta,
            headers_max=limits.rollback_meta_headers_max,
        )
        self._check()  # a rollback below the boundary since: the walk may have read its headers
        return found

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
        superseded_floor: int | None = None,
    ) -> Iterator[list[Entry]]:
        """Pages of the live entries with ``after_seq < seq <= upto_seq`` as of this snapshot,
        in seq order. Deletes are included (consumers apply them); expired entries are not.

        ``as_of`` (at most the boundary) reads the versions that were current at that earlier
        seq instead: a consumer paging through ``(hwm, B]`` over several requests passes
        ``as_of=B`` and gets one consistent view even from newer snapshots, as long as the
        versions superseded since B are still in the file (the rollback window keeps them, and
        a link's read-back sends them: kayos.storage.readback).

        ``superseded_floor`` (a read-back piece's) leaves out only the versions superseded at or
        below it (and at or below the read's boundary): every version superseded later is
        included, as compaction keeps it.

        Refuses a ``page_entries`` below 1 when called (no page could ever be handed out)."""
        if page_entries < 1:
            raise InvalidRequest(f"page_entries must be at least 1, not {page_entries}")
        return self._pages(
            after_seq, upto_seq, page_entries, now_ms, include_expired, as_of, superseded_floor
        )

    def _pages(
        self,
        after_seq: int,
        upto_seq: int | None,
        page_entries: int,
        now_ms: int | None,
        include_expired: bool,
        as_of: int | None,
        superseded_floor: int | None,
    ) -> Iterator[list[Entry]]:
        data_file = self._check()
        reader = data_file.reader
        boundary = self.boundary if as_of is None else min(as_of, self.boundary)
        upto = boundary if upto_seq is None else min(upto_seq, boundary)
        # A version whose successor is at or below this is left out.
        hidden_through = boundary if superseded_floor is None else min(superseded_floor, boundary)
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
                if successor and successor <= hidden_through:
                    continue
                if expiry and skip_expired and expiry <= now_ms:
                    continue
                if flag & _MARKER_OR_OUT_OF_LINE:  # one test for both: a live entry's cost is flat
                    if flag & fmt.FLAG_COMMIT_MARKER:
                        continue  # not a version of its key (docs/storage-format.md)
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
