"""The shard store agrees with an in-memory model under random operations.

Goal: every read the store offers (get, scans as of now, scans of snapshots pinned earlier, pages,
export, meta, stats) returns exactly what a model built from the committed batches predicts, across
explicit seqs, expiry, reopen (with and without derived state), power cuts during a commit,
compaction and rollback.

The model is a list of the versions in the tree, in seq order. The state as of seq B is, for each
key, its newest version with seq <= B. A scan of (after, upto] as of boundary B returns the versions
with after < seq <= min(upto, B) that are the newest of their key as of B, in seq order, deletes
included as tombstones (docs/storage-format.md, "Derived state": succ[s] == 0 or succ[s] > B).
Expired versions still supersede older ones but are not returned (export returns them).

Compaction drops versions superseded at or below its floor F = max(min_rollback_seq, C - window)
and records F; a rollback below F raises RollbackTooFarError ("Rollback", "Compaction").

A power cut during a commit (a torn write, then lost or kept unsynced pages) leaves the store in
exactly the old state or, when every page survived, exactly the new one.

The machine shrinks nodes (``leaf_bytes_target``, ``interior_children_max``) so that a few dozen
entries already make trees several levels deep; the format does not depend on these bounds.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import InvalidRequest, RollbackTooFarError, SnapshotInvalidatedError
from kayos.storage.disk import format as fmt
from kayos.storage.disk.fileops import FaultyFileOps, SimulatedCrash
from kayos.storage.engine import Delete, Entry, Put, ShardStore, Snapshot, StoreOptions
from kayos.storage.maintenance.compact import compact

pytestmark = pytest.mark.unit

ROLLBACK_WINDOW_SEQS = 6
KEYS = [f"k{index}".encode() for index in range(6)]
SNAPSHOTS_MAX = 3
# FaultyFileOps simulates durability, so a RAM-backed directory loses nothing but fsync time.
RAM_DIRECTORY = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@dataclass(frozen=True, slots=True)
class Version:
    seq: int
    key: bytes
    value: bytes | None  # None for a delete
    headers: dict[str, bytes] | None
    prev_seq: int
    batch_end: bool
    expiry_ms: int

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expiry_ms <= now_ms

    @property
    def size(self) -> int:
        headers = len(msgpack.packb(self.headers, use_bin_type=True)) if self.headers else 0
        return len(self.key) + (len(self.value) if self.value is not None else 0) + headers


def newest_as_of(versions: list[Version], boundary: int) -> dict[bytes, Version]:
    newest: dict[bytes, Version] = {}
    for version in versions:
        if version.seq <= boundary:
            newest[version.key] = version
    return newest


def model_scan(
    versions: list[Version],
    boundary: int,
    after: int,
    upto: int | None,
    now_ms: int | None,  # None: expired versions too
) -> list[Version]:
    top = boundary if upto is None else min(upto, boundary)
    newest = newest_as_of(versions, boundary)
    return [
        v
        for v in versions
        if after < v.seq <= top and newest[v.key] is v and (now_ms is None or not v.expired(now_ms))
    ]


def assert_entries_match(entries: list[Entry], expected: list[Version]) -> None:
    assert [e.seq for e in entries] == [v.seq for v in expected]
    for entry, version in zip(entries, expected, strict=True):
        assert entry.key == version.key
        assert entry.deleted == (version.value is None)
        assert entry.value == version.value
        assert entry.headers == version.headers
        assert entry.expiry_ms == version.expiry_ms
        assert entry.prev_seq == version.prev_seq
        assert bool(entry.flags & fmt.FLAG_BATCH_END) == version.batch_end
        out_of_line = (
            version.value is not None and len(version.value) > limits.value_inline_bytes_max
        )
        assert bool(entry.flags & fmt.FLAG_VALUE_OUT_OF_LINE) == out_of_line


@dataclass(slots=True)
class PinnedSnapshot:
    snapshot: Snapshot
    boundary: int
    versions: list[Version]
    invalidated: bool = False


values = st.one_of(
    st.binary(max_size=12),
    # Sometimes large enough to be stored out of line as a value chunk.
    st.integers(min_value=0, max_value=255).map(
        lambda byte: bytes([byte]) * (limits.value_inline_bytes_max + 1 + byte)
    ),
)
headers_maps = st.one_of(st.none(), st.just({"h": b"v"}))
# Seconds from now until the version expires; 0 for never.
expiry_delays = st.sampled_from([0, 0, 0, 1, 2, 3])
raw_ops = st.tuples(st.sampled_from(KEYS), st.booleans(), values, headers_maps, expiry_delays)
RawOp = tuple[bytes, bool, bytes, dict[str, bytes] | None, int]
operations = st.lists(raw_ops, min_size=0, max_size=6)
operations_nonempty = st.lists(raw_ops, min_size=1, max_size=6)
meta_updates = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["hwm", "owner", "epoch"]),
        st.one_of(st.none(), st.integers(min_value=0, max_value=99), st.binary(max_size=4)),
        max_size=2,
    ),
)


class StoreMachine(RuleBasedStateMachine):
    pinned = Bundle("pinned")
    # (leaf_bytes_target, interior_children_max) while the machine runs.
    NODE_LIMITS = (160, 3)

    def __init__(self) -> None:
        super().__init__()
        self._saved_limits = (limits.leaf_bytes_target, limits.interior_children_max)
        limits.leaf_bytes_target, limits.interior_children_max = self.NODE_LIMITS
        self.directory = tempfile.mkdtemp(prefix="kayos-model-", dir=RAM_DIRECTORY)
        self.clock = ManualClock()
        self.options = StoreOptions(rollback_window_seqs=ROLLBACK_WINDOW_SEQS)
        self.fileops = FaultyFileOps()
        self.store = self._open()
        self.versions: list[Version] = []
        self.boundaries: list[int] = [0]
        self.last_seq = 0
        self.min_rollback_seq = 0
        # Commit-end markers compaction left (docs/storage-format.md, "Commit boundaries"): no
        # read returns them; the header counts them as superseded entries of no bytes.
        self.markers: set[int] = set()
        self.meta: dict[str, Any] = {}
        self.snapshots: list[PinnedSnapshot] = []

    def teardown(self) -> None:
        try:
            for pinned in self.snapshots:
                pinned.snapshot.release()
            self.store.close()
        finally:
            limits.leaf_bytes_target, limits.interior_children_max = self._saved_limits
            shutil.rmtree(self.directory, ignore_errors=True)

    def _open(self) -> ShardStore:
        return ShardStore.open(
            self.directory, fileops=self.fileops, clock=self.clock, options=self.options
        )

    def _close(self) -> None:
        for pinned in self.snapshots:
            pinned.snapshot.release()
        self.snapshots.clear()
        self.store.close()

    def _now_ms(self) -> int:
        return int(self.clock.now_s() * 1000)

    # --- model helpers ----------------------------------------------------------------------

    def _apply_batch(
        self, ops: list[Put | Delete], seqs: list[int], meta: dict[str, Any] | None
    ) -> None:
        newest = newest_as_of(self.versions, self.last_seq)
        for position, (op, seq) in enumerate(zip(ops, seqs, strict=True)):
            previous = newest.get(op.key)
            version = Version(
                seq=seq,
                key=op.key,
                value=op.value if isinstance(op, Put) else None,
                headers=(op.headers or None) if isinstance(op, Put) else None,
                prev_seq=previous.seq if previous is not None else 0,
                batch_end=position == len(ops) - 1,
                expiry_ms=op.expiry_ms if isinstance(op, Put) else 0,
            )
            self.versions.append(version)
            newest[op.key] = version
        if seqs:
            self.last_seq = seqs[-1]
            self.boundaries.append(seqs[-1])
        for name, value in (meta or {}).items():
            if value is None:
                self.meta.pop(name, None)
            else:
                self.meta[name] = value

    def _ops(self, raw: list[RawOp]) -> list[Put | Delete]:
        now_ms = self._now_ms()
        return [
            Put(key, value, now_ms + delay * 1000 if delay else 0, headers)
            if is_put
            else Delete(key)
            for key, is_put, value, headers, delay in raw
        ]

    # --- rules --------------------------------------------------------------------------------

    @initialize(raw=operations_nonempty)
    def first_commit(self, raw: list[RawOp]) -> None:
        self.commit(raw, None, None)

    @rule(batches=st.lists(operations_nonempty, min_size=1, max_size=4))
    def commit_several(self, batches: list[list[RawOp]]) -> None:
        for raw in batches:
            self.commit(raw, None, None)

    @rule(
        raw=operations,
        meta=meta_updates,
        gaps=st.one_of(
            st.none(), st.lists(st.integers(min_value=1, max_value=4), min_size=6, max_size=6)
        ),
    )
    def commit(
        self,
        raw: list[RawOp],
        meta: dict[str, Any] | None,
        gaps: list[int] | None,
    ) -> None:
        """One batch; with ``gaps``, explicit seqs as a replica applying its upstream's batch
        uses: they may skip numbers but only grow. An empty batch updates metadata only."""
        ops = self._ops(raw)
        if gaps is None:
            seqs = list(range(self.last_seq + 1, self.last_seq + 1 + len(ops)))
            result = self.store.commit(ops, meta=meta)
        else:
            seqs = list(itertools.accumulate(gaps[: len(ops)], initial=self.last_seq))[1:]
            result = self.store.commit(ops, meta=meta, seqs=seqs)
        if seqs:
            assert (result.first_seq, result.last_seq) == (seqs[0], seqs[-1])
        else:
            assert (result.first_seq, result.last_seq) == (self.last_seq + 1, self.last_seq)
        self._apply_batch(ops, seqs, meta)

    @precondition(lambda self: self.last_seq > 0)
    @rule(raw=operations_nonempty, back=st.integers(min_value=0, max_value=3))
    def commit_stale_explicit_seqs(self, raw: list[RawOp], back: int) -> None:
        """Explicit seqs at or below last_seq are refused and change nothing."""
        ops = self._ops(raw)
        start = max(0, self.last_seq - back)
        before = self.store.stats()
        with pytest.raises(InvalidRequest):
            self.store.commit(ops, seqs=list(range(start, start + len(ops))))
        assert self.store.stats() == before

    @precondition(lambda self: len(self.snapshots) < SNAPSHOTS_MAX)
    @rule(target=pinned)
    def pin_snapshot(self) -> PinnedSnapshot:
        snapshot = self.store.snapshot()
        assert snapshot.boundary == self.last_seq
        pinned = PinnedSnapshot(snapshot, self.last_seq, list(self.versions))
        self.snapshots.append(pinned)
        return pinned

    @rule(
        pinned=pinned,
        after=st.integers(min_value=0, max_value=60),
        span=st.one_of(st.none(), st.integers(min_value=0, max_value=60)),
    )
    def scan_snapshot(self, pinned: PinnedSnapshot, after: int, span: int | None) -> None:
        if pinned not in self.snapshots:
            return  # released by a reopen
        upto = None if span is None else after + span
        if pinned.invalidated:
            with pytest.raises(SnapshotInvalidatedError):
                list(pinned.snapshot.scan(after, upto))
            return
        entries = list(pinned.snapshot.scan(after, upto))
        expected = model_scan(pinned.versions, pinned.boundary, after, upto, self._now_ms())
        assert_entries_match(entries, expected)

    @rule(pinned=consumes(pinned))
    def release_snapshot(self, pinned: PinnedSnapshot) -> None:
        if pinned in self.snapshots:
            self.snapshots.remove(pinned)
            pinned.snapshot.release()

    @rule(
        after=st.integers(min_value=0, max_value=60),
        span=st.one_of(st.none(), st.integers(min_value=0, max_value=60)),
        page_entries=st.integers(min_value=1, max_value=4),
        key=st.sampled_from([*KEYS, b"never-written"]),
    )
    def read_now(self, after: int, span: int | None, page_entries: int, key: bytes) -> None:
        """get, scan, snapshot pages and export as of the last commit."""
        now_ms = self._now_ms()
        newest = newest_as_of(self.versions, self.last_seq).get(key)
        entry = self.store.get(key)
        if newest is None or newest.value is None or newest.expired(now_ms):
            assert entry is None
        else:
            assert entry is not None
            assert_entries_match([entry], [newest])
        upto = None if span is None else after + span
        expected = model_scan(self.versions, self.last_seq, after, upto, now_ms)
        assert_entries_match(self.store.scan(after, upto), expected)
        with self.store.snapshot() as snapshot:
            pages = list(snapshot.pages(after, upto, page_entries=page_entries))
        assert all(0 < len(page) <= page_entries for page in pages)
        assert_entries_match([entry for page in pages for entry in page], expected)
        exported = [entry for page in self.store.export(after) for entry in page]
        assert_entries_match(exported, model_scan(self.versions, self.last_seq, after, None, None))

    @rule(wipe_derived=st.booleans())
    def reopen(self, wipe_derived: bool) -> None:
        self._close()
        if wipe_derived:
            shutil.rmtree(f"{self.directory}/derived")
        self.store = self._open()
        assert self.store.recovery.dropped_bytes == 0, "a clean close leaves no torn tail"
        assert self.store.recovery.rebuilt_index == (wipe_derived and self.last_seq > 0)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(
        raw=operations_nonempty,
        torn_at=st.integers(min_value=0, max_value=3 * 4096),
        keep_page_probability=st.sampled_from([0.0, 0.5, 1.0]),
        seed=st.integers(min_value=0, max_value=2**16),
    )
    def power_cut_during_commit(
        self, raw: list[RawOp], torn_at: int, keep_page_probability: float, seed: int
    ) -> None:
        """The commit's write stops after ``torn_at`` bytes (or completes) and the power goes
        before its fsync; each unsynced page survives with ``keep_page_probability``."""
        ops = self._ops(raw)
        self.fileops.tear_next_append_at = torn_at
        with pytest.raises(SimulatedCrash):
            self.store.commit(ops)
        self._close()
        self.fileops.crash(keep_page_probability=keep_page_probability, seed=seed)
        self.store = self._open()
        if self.store.last_seq != self.last_seq:  # every page of the commit reached the disk
            seqs = list(range(self.last_seq + 1, self.last_seq + 1 + len(ops)))
            assert self.store.last_seq == seqs[-1]
            self._apply_batch(ops, seqs, None)

    @rule()
    def compact(self) -> None:
        floor = max(self.min_rollback_seq, self.last_seq - ROLLBACK_WINDOW_SEQS)
        successor: dict[int, int] = {}
        newest: dict[bytes, Version] = {}
        for version in self.versions:
            if version.key in newest:
                successor[newest[version.key].seq] = version.seq
            newest[version.key] = version
        result = compact(self.store)
        assert result.min_rollback_seq == floor
        stored = self._stored_flags()
        # A dropped entry that ended a commit whose other entries are partly kept hands its
        # boundary on: a marker in its place, or the flag on the commit's last kept entry (which
        # of the two depends on the leaf layout: read it from the store, check it is one of them).
        # A marker from an earlier compaction is such a dropped end too: kept or handed on the
        # same way while part of its commit is kept, gone once the commit is dropped whole.
        kept: list[Version] = []
        markers: set[int] = set()
        last_boundary = 0
        for version in sorted(self.versions + [_marker_slot(m) for m in self.markers], key=_seq):
            if version.seq in self.markers or 0 < successor.get(version.seq, 0) <= floor:
                if version.batch_end:
                    if kept and kept[-1].seq > last_boundary:
                        if stored.get(version.seq) == fmt.COMMIT_MARKER_FLAGS:
                            markers.add(version.seq)
                        else:
                            assert stored[kept[-1].seq] & fmt.FLAG_BATCH_END
                            kept[-1] = replace(kept[-1], batch_end=True)
                    last_boundary = version.seq
                continue
            kept.append(version)
            if version.batch_end:
                last_boundary = version.seq
        assert {s for s, f in stored.items() if f & fmt.FLAG_COMMIT_MARKER} == markers
        assert result.entries_dropped == (
            len(self.versions) + len(self.markers) - len(kept) - len(markers)
        )
        self.versions = kept
        self.markers = markers
        self.min_rollback_seq = floor

    def _stored_flags(self) -> dict[int, int]:
        """seq -> flags of every entry in the store's tree, markers included."""
        with self.store.snapshot() as snap:
            return {
                seq: flag
                for leaf in snap.leaves(0, self.last_seq)
                for seq, flag in zip(leaf.seqs, leaf.flags, strict=True)
            }

    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(self.boundaries), label="target")
        if target < self.min_rollback_seq and target < self.last_seq:
            before = self.store.stats()
            with pytest.raises(RollbackTooFarError):
                self.store.rollback_to(target)
            assert self.store.stats() == before
            return
        self.store.rollback_to(target)
        if target >= self.last_seq:
            return
        self.versions = [v for v in self.versions if v.seq <= target]
        self.boundaries = [b for b in self.boundaries if b <= target]
        assert all(m <= target for m in self.markers), "markers lie at or below the floor"
        self.last_seq = target
        for pinned in self.snapshots:
            if pinned.boundary > target:
                pinned.invalidated = True

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def header_agrees(self) -> None:
        stats = self.store.stats()
        newest = newest_as_of(self.versions, self.last_seq)
        superseded = [v for v in self.versions if newest[v.key] is not v]
        assert stats["last_seq"] == self.last_seq
        assert stats["min_rollback_seq"] == self.min_rollback_seq
        assert stats["entry_count"] == len(self.versions) + len(self.markers)
        assert stats["payload_bytes"] == sum(v.size for v in self.versions)
        assert stats["superseded_count"] == len(superseded) + len(self.markers)
        assert stats["superseded_bytes"] == sum(v.size for v in superseded)
        assert stats["keys"] == len(newest)
        assert self.store.meta == self.meta


def _seq(version: Version) -> int:
    return version.seq


def _marker_slot(seq: int) -> Version:
    """A stand-in for a marker in the walk: only its seq is read."""
    return Version(seq, b"", None, None, 0, True, 0)


class RealNodeSizesMachine(StoreMachine):
    """The same model with the production node bounds: fewer, fuller nodes, more entries per
    leaf, large values crossing block boundaries inside leaves."""

    NODE_LIMITS = (limits.leaf_bytes_target, limits.interior_children_max)


PROPERTY_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
StoreMachine.TestCase.settings = PROPERTY_SETTINGS
RealNodeSizesMachine.TestCase.settings = settings(PROPERTY_SETTINGS, max_examples=50)
# A failure can take Hypothesis up to five minutes to shrink; the suite's 300 s timeout would cut
# that short and lose the falsifying steps. A passing run takes seconds.
TestStoreModel = pytest.mark.timeout(900)(StoreMachine.TestCase)
TestStoreModelRealNodeSizes = pytest.mark.timeout(900)(RealNodeSizesMachine.TestCase)
