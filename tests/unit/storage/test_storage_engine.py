"""The shard store's API: commits, limits, explicit seqs, group commit, expiry, snapshots,
rollback, metadata and the shape of the sequence tree (docs/storage-format.md).

Goal: each documented promise of ``ShardStore`` is pinned by a test that fails when it breaks.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

import pytest

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import (
    InvalidRequest,
    LimitExceeded,
    SnapshotInvalidatedError,
    StoreClosedError,
)
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.fileops import FileHandle
from kayos.storage.engine import (
    CommitResult,
    Delete,
    Entry,
    Put,
    ShardStore,
    StoreOptions,
)
from tests.support.storage import (
    JOIN_TIMEOUT_S,
    TEST_STORE_UUID,
    CountingFileOps,
    HeldFileOps,
    WaitWatchingCondition,
)

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from pathlib import Path


def reopen(store: ShardStore, clock: ManualClock | None = None) -> ShardStore:
    store.close()
    return ShardStore.open(
        store.directory,
        clock=clock or ManualClock(),
        options=StoreOptions(store_uuid=TEST_STORE_UUID),
    )


def view(entries: list[Entry]) -> list[tuple[int, bytes, bytes | None]]:
    return [(entry.seq, entry.key, entry.value) for entry in entries]


# --- commit and read ----------------------------------------------------------------------------


def test_commit_assigns_consecutive_seqs_and_reads_back(tmp_store: ShardStore) -> None:
    first = tmp_store.commit([Put(b"a", b"1"), Put(b"b", b"2")])
    second = tmp_store.commit([Put(b"a", b"3"), Delete(b"b"), Put(b"c", b"4")])
    assert first == CommitResult(first_seq=1, last_seq=2, commit_no=1)
    assert second == CommitResult(first_seq=3, last_seq=5, commit_no=2)
    assert tmp_store.last_seq == 5
    # A scan returns the newest version of each key, deletes as tombstones, in seq order.
    assert view(tmp_store.scan()) == [(3, b"a", b"3"), (4, b"b", None), (5, b"c", b"4")]
    tombstone = tmp_store.scan(3, 4)[0]
    assert tombstone.deleted
    assert tombstone.prev_seq == 2
    assert tombstone.flags & fmt.FLAG_DELETE
    # Only the last entry of each batch carries the batch-end flag.
    assert [bool(e.flags & fmt.FLAG_BATCH_END) for e in tmp_store.scan()] == [False, False, True]
    a = tmp_store.get(b"a")
    assert a is not None
    assert (a.seq, a.value, a.prev_seq) == (3, b"3", 1)
    assert tmp_store.get(b"b") is None, "deleted"
    assert tmp_store.get(b"zzz") is None, "never written"


def test_scan_bounds_are_after_exclusive_upto_inclusive(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"k%d" % n, b"v") for n in range(1, 7)])
    assert [e.seq for e in tmp_store.scan(2, 4)] == [3, 4]
    assert [e.seq for e in tmp_store.scan(4, 4)] == []
    assert [e.seq for e in tmp_store.scan(5, 2)] == []
    assert [e.seq for e in tmp_store.scan(5, 100)] == [6]


def test_values_headers_and_large_values_survive_reopen(tmp_store: ShardStore) -> None:
    large = bytes(range(256)) * 40  # over value_inline_bytes_max: its own value chunk
    assert len(large) > limits.value_inline_bytes_max
    tmp_store.commit(
        [Put(b"small", b"x", headers={"trace": b"t1"}), Put(b"large", large), Put(b"empty", b"")]
    )
    store = reopen(tmp_store)
    try:
        entries = {e.key: e for e in store.scan()}
        assert entries[b"small"].headers == {"trace": b"t1"}
        assert entries[b"large"].value == large
        assert entries[b"large"].flags & fmt.FLAG_VALUE_OUT_OF_LINE
        assert entries[b"empty"].value == b""
        assert not entries[b"empty"].deleted
        got = store.get(b"large")
        assert got is not None
        assert got.value == large
    finally:
        store.close()


def test_meta_updates_removals_and_meta_only_commits(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1")], meta={"hwm": 1, "owner": b"n1"})
    result = tmp_store.commit([], meta={"hwm": 2, "owner": None})
    assert (result.first_seq, result.last_seq) == (2, 1), "metadata-only: no seqs"
    assert tmp_store.meta == {"hwm": 2}
    tmp_store.meta["hwm"] = 99  # a copy: callers cannot change the store's metadata
    assert tmp_store.meta == {"hwm": 2}
    store = reopen(tmp_store)
    try:
        assert store.meta == {"hwm": 2}
        assert store.last_seq == 1
    finally:
        store.close()


def test_stats_count_versions_and_superseded_ones(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"11"), Put(b"b", b"2")])
    tmp_store.commit([Put(b"a", b"333"), Delete(b"b")])
    stats = tmp_store.stats()
    assert stats["entry_count"] == 4
    assert stats["payload_bytes"] == 3 + 2 + 4 + 1  # key + value per version; a delete is its key
    assert stats["superseded_count"] == 2
    assert stats["superseded_bytes"] == 3 + 2
    assert stats["live_count"] == 2
    assert stats["keys"] == 2
    assert stats["commit_no"] == 2


# --- limits ---------------------------------------------------------------------------------------

LARGE_VALUE = bytes(limits.value_bytes_max)


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([Put(b"k" * (limits.key_bytes_max + 1), b"v")], "key"),
        ([Delete(b"k" * (limits.key_bytes_max + 1))], "key"),
        ([Put(b"k", LARGE_VALUE + b"!")], "value"),
        ([Put(b"k", b"v", headers={"h": bytes(limits.headers_bytes_max)})], "headers"),
        ([Delete(b"k")] * (limits.batch_entries_max + 1), "batch of"),
        ([Put(b"k%d" % n, LARGE_VALUE) for n in range(5)], "batch of"),
    ],
    ids=["key", "delete-key", "value", "headers", "batch-entries", "batch-bytes"],
)
def test_oversize_input_is_refused_and_nothing_is_written(
    tmp_store: ShardStore, ops: list[Put | Delete], message: str
) -> None:
    tmp_store.commit([Put(b"before", b"1")])
    size, stats = tmp_store.file_bytes(), tmp_store.stats()
    with pytest.raises(LimitExceeded, match=message):
        tmp_store.commit(ops)
    assert tmp_store.file_bytes() == size
    assert tmp_store.stats() == stats


def test_bounds_are_inclusive(tmp_store: ShardStore) -> None:
    key = b"k" * limits.key_bytes_max
    tmp_store.commit([Put(key, LARGE_VALUE)])
    got = tmp_store.get(key)
    assert got is not None
    assert len(got.value or b"") == limits.value_bytes_max


@pytest.mark.parametrize(
    "op",
    [Put(b"", b"v"), Delete(b""), Put("text", b"v"), Put(b"k", "text"), Put(b"k", b"v", -1)],  # type: ignore[arg-type]
    ids=["empty-key", "empty-delete-key", "str-key", "str-value", "negative-expiry"],
)
def test_invalid_input_is_refused(tmp_store: ShardStore, op: Put | Delete) -> None:
    with pytest.raises(InvalidRequest):
        tmp_store.commit([op])
    assert tmp_store.stats()["commit_no"] == 0


@pytest.mark.parametrize(
    "meta",
    [{"hwm": object()}, {"hwm": 2**70}, ["not", "a", "dict"]],
    ids=["unencodable", "integer-too-large", "not-a-dict"],
)
def test_bad_metadata_is_refused_before_it_is_queued(tmp_store: ShardStore, meta: Any) -> None:
    """Regression: metadata msgpack cannot encode raised a raw TypeError from inside the group
    commit (failing every batch that shared the group) instead of InvalidRequest up front."""
    tmp_store.commit([Put(b"a", b"1")], meta={"hwm": 1})
    size, stats = tmp_store.file_bytes(), tmp_store.stats()
    with pytest.raises(InvalidRequest):
        tmp_store.commit([Put(b"b", b"2")], meta=meta)
    assert (tmp_store.file_bytes(), tmp_store.stats()) == (size, stats)
    assert tmp_store.meta == {"hwm": 1}
    tmp_store.commit([Put(b"b", b"2")], meta={"hwm": 2})
    assert tmp_store.meta == {"hwm": 2}


def test_reads_and_rollbacks_refuse_impossible_arguments(tmp_store: ShardStore) -> None:
    """Regression: get(b"") leaked lmdb's BadValsizeError and rollback_to(-1) claimed that
    compaction had dropped what it needed."""
    tmp_store.commit([Put(b"a", b"1")])
    with pytest.raises(InvalidRequest):
        tmp_store.get(b"")
    with pytest.raises(InvalidRequest):
        tmp_store.get("a")  # type: ignore[arg-type]
    with pytest.raises(LimitExceeded):
        tmp_store.get(b"k" * (limits.key_bytes_max + 1))
    with pytest.raises(InvalidRequest):
        tmp_store.rollback_to(-1)
    assert tmp_store.last_seq == 1


# --- explicit seqs (replica apply) ----------------------------------------------------------------


def test_explicit_seqs_may_skip_but_must_grow(tmp_store: ShardStore) -> None:
    result = tmp_store.commit([Put(b"a", b"1"), Put(b"b", b"2")], seqs=[10, 20])
    assert (result.first_seq, result.last_seq) == (10, 20)
    after = tmp_store.commit([Put(b"c", b"3")])
    assert (after.first_seq, after.last_seq) == (21, 21), "assigned seqs continue above"
    assert [e.seq for e in tmp_store.scan()] == [10, 20, 21]
    assert [e.seq for e in tmp_store.scan(10, 20)] == [20]
    a = tmp_store.get(b"a")
    assert a is not None
    assert a.seq == 10


@pytest.mark.parametrize(
    "seqs",
    [[21, 22], [20, 25], [30, 30], [31, 30], [25]],
    ids=["overlaps", "at-last-seq", "repeated", "decreasing", "length-mismatch"],
)
def test_bad_explicit_seqs_leave_the_store_unchanged(
    tmp_store: ShardStore, seqs: list[int]
) -> None:
    tmp_store.commit([Put(b"a", b"1")], seqs=[5])
    tmp_store.commit([Put(b"b", b"2"), Put(b"a", b"3")], seqs=[19, 24])
    size, stats, entries = tmp_store.file_bytes(), tmp_store.stats(), tmp_store.scan()
    with pytest.raises(InvalidRequest):
        tmp_store.commit([Put(b"x", b"1"), Put(b"y", b"2")], seqs=seqs)
    assert tmp_store.file_bytes() == size
    assert tmp_store.stats() == stats
    assert tmp_store.scan() == entries


def test_explicit_seqs_may_not_run_past_the_seq_gap_bound(
    tmp_store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """limits.seq_gap_max: a commit's explicit seqs, or its last_seq, may run at most that far
    past the store's last seq (one absurd seq would map a successor array to match). At the
    bound is fine; one past it is refused and changes nothing."""
    monkeypatch.setattr(limits, "seq_gap_max", 100)
    tmp_store.commit([Put(b"a", b"1")], seqs=[5])
    size, stats, entries = tmp_store.file_bytes(), tmp_store.stats(), tmp_store.scan()
    segments = len(tmp_store.succ_segments)
    for seqs, last_seq in (([106], None), ([50, 106], None), ([50], 106), (None, 106)):
        ops = [Put(b"k%d" % n, b"v") for n in range(len(seqs or []))]
        with pytest.raises(InvalidRequest, match="seq_gap_max"):
            tmp_store.commit(ops, seqs=seqs, last_seq=last_seq)
    assert tmp_store.file_bytes() == size
    assert tmp_store.stats() == stats
    assert tmp_store.scan() == entries
    assert len(tmp_store.succ_segments) == segments
    result = tmp_store.commit([Put(b"b", b"2")], seqs=[105])
    assert (result.first_seq, result.last_seq) == (105, 105)
    assert tmp_store.commit([], last_seq=205).last_seq == 205


# --- group commit -------------------------------------------------------------------------------


def test_concurrent_commits_get_distinct_consecutive_ranges(tmp_path: Path) -> None:
    """Threads committing at once each get their own seq range; together the ranges tile
    1..N without gaps, every batch is visible whole, and each group commit costs one fdatasync
    (so at most one per commit; fewer when batches shared a group)."""
    ops = CountingFileOps()
    store = ShardStore.open(str(tmp_path / "shard"), fileops=ops, clock=ManualClock())
    threads_count, commits_each = 6, 15
    barrier = threading.Barrier(threads_count)
    results: list[tuple[int, int, CommitResult]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def producer(thread_index: int) -> None:
        try:
            barrier.wait(timeout=JOIN_TIMEOUT_S)
            for commit_index in range(commits_each):
                size = 1 + (thread_index + commit_index) % 4
                batch = [
                    Put(b"t%d-%d-%d" % (thread_index, commit_index, n), b"v") for n in range(size)
                ]
                result = store.commit(batch)
                with lock:
                    results.append((thread_index, commit_index, result))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(threads_count)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
            assert not thread.is_alive(), "a committer hung"
        assert errors == []
        assert len(results) == threads_count * commits_each
        ranges = sorted((r.first_seq, r.last_seq) for _, _, r in results)
        expected_next = 1
        for first, last in ranges:
            assert first == expected_next, "ranges overlap or leave a gap"
            expected_next = last + 1
        assert store.last_seq == expected_next - 1
        by_seq = {e.seq: e for e in store.scan()}
        for thread_index, commit_index, result in results:
            keys = [by_seq[seq].key for seq in range(result.first_seq, result.last_seq + 1)]
            size = 1 + (thread_index + commit_index) % 4
            assert keys == [b"t%d-%d-%d" % (thread_index, commit_index, n) for n in range(size)]
        group_commits = {r.commit_no for _, _, r in results}
        syncs = ops.syncs[store.path]  # creation synced data.1.kys.init, not this path
        assert syncs == len(group_commits) <= len(results)
        assert store.stats()["commit_no"] == len(group_commits)
    finally:
        store.close()


def test_batches_queued_behind_a_commit_share_one_group_and_one_fsync(tmp_path: Path) -> None:
    """While one commit is being written, four more queue up; they are written together: one
    header, one fdatasync, one commit_no, consecutive seqs in queue order. A batch among them
    whose explicit seqs are no longer above last_seq fails alone; the others are unaffected.
    (White box: the store's queue condition is replaced by one that reports its waiters.)"""
    ops = HeldFileOps()
    store = ShardStore.open(str(tmp_path / "shard"), fileops=ops, clock=ManualClock())
    watched = WaitWatchingCondition()
    store._cv = watched
    outcomes: dict[str, CommitResult | BaseException] = {}

    def run(name: str, ops_list: list[Put | Delete], **kwargs: Any) -> None:
        try:
            outcomes[name] = store.commit(ops_list, **kwargs)
        except BaseException as exc:
            outcomes[name] = exc

    ops.hold_next = True
    leader = threading.Thread(target=run, args=("leader", [Put(b"first", b"1")]))
    leader.start()
    followers = [
        threading.Thread(target=run, args=("plain", [Put(b"a", b"1"), Put(b"b", b"2")])),
        threading.Thread(target=run, args=("stale", [Put(b"c", b"3")]), kwargs={"seqs": [1]}),
        threading.Thread(target=run, args=("meta-only", []), kwargs={"meta": {"m": 1}}),
        threading.Thread(target=run, args=("with-meta", [Delete(b"a")]), kwargs={"meta": {"n": 2}}),
    ]
    try:
        assert ops.held.wait(JOIN_TIMEOUT_S)
        for thread in followers:
            thread.start()
        watched.wait_for_waiters(len(followers))
    finally:
        ops.release.set()
        for thread in [leader, *followers]:
            thread.join(JOIN_TIMEOUT_S)
    try:
        assert not any(thread.is_alive() for thread in [leader, *followers])
        assert outcomes["leader"] == CommitResult(1, 1, 1)
        assert isinstance(outcomes["stale"], InvalidRequest)
        grouped = [outcomes[name] for name in ("plain", "meta-only", "with-meta")]
        assert all(isinstance(result, CommitResult) for result in grouped), outcomes
        results = [r for r in grouped if isinstance(r, CommitResult)]
        assert {r.commit_no for r in results} == {2}
        ranges = sorted((r.first_seq, r.last_seq) for r in results if r.last_seq >= r.first_seq)
        assert ranges in ([(2, 3), (4, 4)], [(2, 2), (3, 4)])
        assert ops.syncs[store.path] == 2
        assert store.stats()["commit_no"] == 2
        assert store.meta == {"m": 1, "n": 2}
        assert store.get(b"a") is None
        assert store.get(b"c") is None
    finally:
        store.close()


# --- expiry ---------------------------------------------------------------------------------------


def test_expired_entries_are_skipped_by_scans_and_get(
    tmp_store: ShardStore, clock: ManualClock
) -> None:
    now_ms = int(clock.now_s() * 1000)
    tmp_store.commit(
        [
            Put(b"soon", b"1", expiry_ms=now_ms + 1000),
            Put(b"never", b"2"),
            Put(b"later", b"3", expiry_ms=now_ms + 5000),
        ]
    )
    assert [e.key for e in tmp_store.scan()] == [b"soon", b"never", b"later"]
    assert tmp_store.get(b"soon") is not None
    clock.advance(1.0)  # now == expiry of "soon": expired (expiry_ms <= now)
    assert [e.key for e in tmp_store.scan()] == [b"never", b"later"]
    assert tmp_store.get(b"soon") is None
    assert tmp_store.get(b"later") is not None
    # An explicit now overrides the clock, both ways.
    assert tmp_store.get(b"soon", now_ms=now_ms) is not None
    with tmp_store.snapshot() as snapshot:
        assert [e.key for e in snapshot.scan(now_ms=now_ms + 5000)] == [b"never"]
        # Replicas need every entry: export and include_expired keep expired ones.
        every = [e.key for page in snapshot.pages(include_expired=True) for e in page]
        assert every == [b"soon", b"never", b"later"]
    exported = [e.key for page in tmp_store.export(0) for e in page]
    assert exported == [b"soon", b"never", b"later"]


# --- snapshots ----------------------------------------------------------------------------------


def test_snapshot_sees_the_versions_current_at_its_boundary(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1"), Put(b"b", b"2")])
    snapshot = tmp_store.snapshot()
    tmp_store.commit([Put(b"a", b"3"), Delete(b"b"), Put(b"c", b"4")])
    try:
        assert snapshot.boundary == 2
        assert view(list(snapshot.scan())) == [(1, b"a", b"1"), (2, b"b", b"2")]
        assert view(list(snapshot.scan(0, 100))) == [(1, b"a", b"1"), (2, b"b", b"2")]
        assert view(tmp_store.scan()) == [(3, b"a", b"3"), (4, b"b", None), (5, b"c", b"4")]
    finally:
        snapshot.release()
    with pytest.raises(StoreClosedError):
        list(snapshot.scan())
    snapshot.release()  # idempotent


def test_pages_split_a_scan_without_losing_entries(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"k%d" % n, b"v") for n in range(10)])
    tmp_store.commit([Put(b"k%d" % n, b"w") for n in range(0, 10, 3)])
    with tmp_store.snapshot() as snapshot:
        pages = list(snapshot.pages(page_entries=3))
        assert [len(page) for page in pages] == [3, 3, 3, 1]
        assert [e for page in pages for e in page] == list(snapshot.scan())


def test_pages_default_to_the_cache_sized_page(tmp_store: ShardStore) -> None:
    """A caller that names no page size gets pages of limits.scan_page_entries_default (small,
    so a page's entries stay in cache and die young), not the maximum."""
    count = limits.scan_page_entries_default * 2 + 5
    tmp_store.commit([Put(b"k%d" % n, b"v") for n in range(count)])
    with tmp_store.snapshot() as snapshot:
        sizes = [len(page) for page in snapshot.pages()]
    default = limits.scan_page_entries_default
    assert sizes == [default, default, 5]
    assert default < limits.scan_page_entries_max


def test_rollback_restores_the_state_and_invalidates_later_snapshots(
    tmp_store: ShardStore,
) -> None:
    tmp_store.commit([Put(b"a", b"1"), Put(b"b", b"2")])
    below = tmp_store.snapshot()
    tmp_store.commit([Put(b"a", b"3"), Delete(b"b")])
    above = tmp_store.snapshot()
    tmp_store.rollback_to(4)  # at or above last_seq: nothing to do
    assert tmp_store.stats()["commit_no"] == 2
    tmp_store.rollback_to(2)
    try:
        assert view(tmp_store.scan()) == [(1, b"a", b"1"), (2, b"b", b"2")]
        b = tmp_store.get(b"b")
        assert b is not None
        assert b.value == b"2"
        assert tmp_store.stats()["superseded_count"] == 0
        with pytest.raises(SnapshotInvalidatedError):
            list(above.scan())
        assert view(list(below.scan())) == [(1, b"a", b"1"), (2, b"b", b"2")]
    finally:
        below.release()
        above.release()
    # Seqs after the rollback point are reused.
    result = tmp_store.commit([Put(b"c", b"5")])
    assert (result.first_seq, result.last_seq) == (3, 3)
    store = reopen(tmp_store)
    try:
        assert view(store.scan()) == [(1, b"a", b"1"), (2, b"b", b"2"), (3, b"c", b"5")]
    finally:
        store.close()


def test_snapshot_at_or_below_the_rollback_point_stays_valid(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1")])
    tmp_store.commit([Put(b"a", b"2")])
    with tmp_store.snapshot() as snapshot:
        tmp_store.commit([Put(b"a", b"3")])
        tmp_store.rollback_to(2)
        tmp_store.commit([Put(b"a", b"4")])
        assert view(list(snapshot.scan())) == [(2, b"a", b"2")]
    assert view(tmp_store.scan()) == [(3, b"a", b"4")]


def test_a_rollback_racing_a_snapshot_scan_invalidates_it(
    tmp_store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a rollback below a snapshot's boundary that ran while the snapshot's scan was
    between reading a leaf and reading the successor map went unnoticed for the last page, and
    the scan returned a superseded version next to its successor."""
    tmp_store.commit([Put(b"a", b"1")])
    tmp_store.commit([Put(b"a", b"2")])
    snapshot = tmp_store.snapshot()
    original_read_node = btree.NodeReader.read_node
    armed = [True]

    def read_then_roll_back(self: btree.NodeReader, pos: int) -> fmt.Leaf | fmt.Interior:
        node = original_read_node(self, pos)
        if armed[0]:
            armed[0] = False
            tmp_store.rollback_to(1)  # another thread's rollback, landing mid-scan
        return node

    monkeypatch.setattr(btree.NodeReader, "read_node", read_then_roll_back)
    try:
        with pytest.raises(SnapshotInvalidatedError):
            list(snapshot.scan())
    finally:
        snapshot.release()
    assert not armed[0]
    assert view(tmp_store.scan()) == [(1, b"a", b"1")]


def test_rollback_to_zero_empties_the_store(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1")], meta={"m": 1})
    tmp_store.rollback_to(0)
    assert tmp_store.scan() == []
    assert tmp_store.get(b"a") is None
    assert tmp_store.stats()["keys"] == 0
    assert tmp_store.meta == {"m": 1}, "rollback cuts the tree, not the metadata"


# --- closed stores --------------------------------------------------------------------------------


def test_a_closed_store_refuses_every_call(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1")])
    tmp_store.close()
    tmp_store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        tmp_store.commit([Put(b"b", b"2")])
    with pytest.raises(StoreClosedError):
        tmp_store.get(b"a")
    with pytest.raises(StoreClosedError):
        tmp_store.scan()
    with pytest.raises(StoreClosedError):
        tmp_store.snapshot()
    with pytest.raises(StoreClosedError):
        tmp_store.rollback_to(0)


def test_a_snapshot_outliving_its_store_refuses_to_scan(tmp_store: ShardStore) -> None:
    """Regression: a snapshot scanned after its store closed read a released successor map and
    returned superseded versions as if they were current."""
    tmp_store.commit([Put(b"a", b"1")])
    tmp_store.commit([Put(b"a", b"2")])
    snapshot = tmp_store.snapshot()
    tmp_store.close()
    try:
        with pytest.raises(StoreClosedError):
            list(snapshot.scan())
    finally:
        snapshot.release()


# --- the tree's shape ("The sequence tree") -----------------------------------------------------


def tree_nodes(store: ShardStore) -> list[tuple[int, fmt.Leaf | fmt.Interior]]:
    """Walks the current tree, checking the invariants every node must keep: all leaves at the
    same depth, child pointers' first seq, counts and bytes agree with the child, seqs grow."""
    header = store.header
    reader = store.current_file().reader
    found: list[tuple[int, fmt.Leaf | fmt.Interior]] = []
    seqs: list[int] = []

    def walk(ptr: fmt.Ptr, height: int) -> None:
        node = reader.read_node(ptr.pos)
        found.append((height, node))
        if height == 1:
            assert isinstance(node, fmt.Leaf)
            assert node.seqs[0] == ptr.first_seq
            assert (len(node), sum(node.sizes)) == (ptr.count, ptr.payload_bytes)
            seqs.extend(node.seqs)
            return
        assert isinstance(node, fmt.Interior)
        assert node.children[0].first_seq == ptr.first_seq
        assert sum(c.count for c in node.children) == ptr.count
        assert sum(c.payload_bytes for c in node.children) == ptr.payload_bytes
        for child in node.children:
            walk(child, height - 1)

    root = header.root
    if root is not None:
        walk(fmt.Ptr(root.first_seq, root.pos, root.count, root.payload_bytes), root.height)
    assert seqs == sorted(set(seqs))
    assert len(seqs) == header.entry_count
    return found


@pytest.fixture
def small_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny nodes, so a few hundred entries make a tree five levels deep."""
    monkeypatch.setattr(limits, "leaf_bytes_target", 100)
    monkeypatch.setattr(limits, "interior_children_max", 3)


@pytest.mark.usefixtures("small_nodes")
def test_interior_nodes_never_exceed_their_fan_out(tmp_store: ShardStore) -> None:
    """Regression: the right edge wrote interior nodes with interior_children_max + 1 children
    (the full finalized children plus the open one)."""
    for n in range(150):
        tmp_store.commit([Put(b"k%d" % (n % 7), b"v" * 40)])
        widest = max(
            (
                len(node.children)
                for _, node in tree_nodes(tmp_store)
                if isinstance(node, fmt.Interior)
            ),
            default=0,
        )
        assert widest <= limits.interior_children_max, f"after commit {n + 1}"
    assert tmp_store.header.root is not None
    assert tmp_store.header.root.height >= 4


@pytest.mark.usefixtures("small_nodes")
def test_rollback_cuts_deep_trees_anywhere(tmp_store: ShardStore) -> None:
    keys = {seq: b"k%d" % (seq % 5) for seq in range(1, 61)}
    for seq, key in keys.items():
        tmp_store.commit([Put(key, b"v" * (seq % 30))])
    for target in range(59, -1, -7):
        tmp_store.rollback_to(target)
        nodes = tree_nodes(tmp_store)
        widest = max((len(n.children) for _, n in nodes if isinstance(n, fmt.Interior)), default=0)
        assert widest <= limits.interior_children_max
        newest = {keys[seq]: seq for seq in range(1, target + 1)}
        assert [e.seq for e in tmp_store.scan()] == sorted(newest.values())
        tmp_store.commit([Put(b"k0", b"again")])
        tmp_store.rollback_to(target)
        assert tmp_store.last_seq == target


class _PreadCountingHandle:
    """A file handle that counts preads (only reads are used)."""

    def __init__(self, inner: FileHandle) -> None:
        self.inner = inner
        self.path = inner.path
        self.preads = 0

    def pread(self, size: int, offset: int) -> bytes:
        self.preads += 1
        return self.inner.pread(size, offset)


@pytest.mark.parametrize("run_bytes", [1, 20_000, None])
def test_runs_of_leaves_read_back_like_single_leaves(
    tmp_store: ShardStore, monkeypatch: pytest.MonkeyPatch, run_bytes: int | None
) -> None:
    """Scans read the leaves under one interior node in runs of few preads
    (``NodeReader.read_leaves``): each run yields exactly what reading every leaf alone does, in
    the order asked, whatever the run size, also for positions out of file order."""
    if run_bytes is not None:
        monkeypatch.setattr(btree, "_RUN_READ_BYTES", run_bytes)
    for n in range(30):
        tmp_store.commit([Put(b"k%d" % (n * 10 + i), bytes([i]) * 300) for i in range(10)])
    header = tmp_store.header
    reader = tmp_store.current_file().reader
    assert header.root is not None
    assert header.root.height == 2
    root = reader.read_node(header.root.pos)
    assert isinstance(root, fmt.Interior)
    positions = [child.pos for child in root.children]
    assert len(positions) > 3
    counting = _PreadCountingHandle(tmp_store.current_file().handle)
    runs = btree.NodeReader(cast("FileHandle", counting))
    alone = [reader.read_node(pos) for pos in positions]
    assert list(runs.read_leaves(positions)) == alone
    if run_bytes is None:
        assert counting.preads < len(positions), "one pread covers several leaves"
    assert list(runs.read_leaves(positions[::-1])) == alone[::-1]
    assert list(runs.read_leaves(positions[1::2])) == alone[1::2]
