"""Commit boundaries outlive the entries that ended them (docs/storage-format.md, "Commit
boundaries"): a link reading a range back in frame-sized pieces cuts only where a commit ended,
even when the entry that ended it was superseded later, after a reopen, after compaction (which
hands the boundary on to the commit's last kept entry or to a commit-end marker), after a
rollback, and in a file written by the version 1 code. A piece holds every version except those
superseded at or below the store's window floor (docs/replication-protocol.md, "BATCH"); with a
window of 0 that is the state as of the piece's end, which most tests here read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kayos.clock import ManualClock
from kayos.errors import CorruptionError
from kayos.replication.link.sender import read_range
from kayos.storage.disk import format as fmt
from kayos.storage.engine import Delete, Entry, Put, ShardStore, StoreOptions
from kayos.storage.maintenance import check as check_module
from kayos.storage.maintenance.check import check_store
from kayos.storage.maintenance.compact import compact
from kayos.storage.readback import read_back
from tests.support.storage import TEST_STORE_UUID

pytestmark = pytest.mark.unit

FIXTURE_V1 = Path(__file__).parent / "fixtures" / "store-v1.kys"


def open_store(directory: Path, window: int = 1_000) -> ShardStore:
    return ShardStore.open(
        str(directory),
        clock=ManualClock(),
        options=StoreOptions(rollback_window_seqs=window, store_uuid=TEST_STORE_UUID),
    )


def pieces(store: ShardStore, entries_max: int, bytes_max: int = 1 << 30) -> list[list[int]]:
    """The range (0, last seq] read back as a link would: one list of seqs per piece, each
    ending at its covered seq (appended as a negative number to keep the cut visible)."""
    out: list[list[int]] = []
    after = 0
    upto = store.last_seq
    while after < upto:
        entries, covered, _meta, _boundary = read_range(
            store, after, upto, entries_max=entries_max, bytes_max=bytes_max
        )
        assert covered > after, "a piece always moves on"
        out.append([e.seq for e in entries] + [-covered])
        after = covered
    return out


def commit_ends(store: ShardStore) -> set[int]:
    """Every seq a piece may end at: the commit boundaries as stored (bit 2 on any version,
    superseded ones and markers included)."""
    with store.snapshot() as snap:
        return {
            seq
            for leaf in snap.leaves(0, store.last_seq)
            for seq, flag in zip(leaf.seqs, leaf.flags, strict=True)
            if flag & fmt.FLAG_BATCH_END
        }


def two_transactions_then_supersede(store: ShardStore) -> None:
    store.commit([Put(b"a%d" % i, b"A") for i in range(5)])  # seqs 1-5, ends at 5
    store.commit([Put(b"b%d" % i, b"B") for i in range(5)])  # seqs 6-10, ends at 10
    store.commit([Put(b"a4", b"later")])  # 11: supersedes A's end
    store.commit([Put(b"b4", b"later"), Put(b"a2", b"later")])  # 12-13: B's end, A's middle


def test_a_superseded_commit_end_still_bounds_the_pieces(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    two_transactions_then_supersede(store)
    # Within the window every version goes down; the pieces still end at commit boundaries.
    assert pieces(store, entries_max=7) == [
        [1, 2, 3, 4, 5, -5],
        [6, 7, 8, 9, 10, 11, -11],
        [12, 13, -13],
    ]
    store.close()
    store = open_store(tmp_path / "s", window=0)
    # A piece of at most 7 entries: the old rule found no visible end among seqs 1-4, 6-8 and
    # cut at the bound, inside B. Now the piece ends at A's end (5) and holds A as of 5, the
    # superseded a2 and a4 versions included.
    got = pieces(store, entries_max=7)
    # Then the rest fits: the state as of 13 (b4's version 10 superseded within it).
    assert got == [[1, 2, 3, 4, 5, -5], [6, 7, 8, 9, 11, 12, 13, -13]]
    # Whole: the state as of the end, superseded versions left out.
    assert pieces(store, entries_max=100) == [[1, 2, 4, 6, 7, 8, 9, 11, 12, 13, -13]]
    store.close()
    store = open_store(tmp_path / "s", window=0)  # the bounds are in the file, not in memory
    assert pieces(store, entries_max=7) == got
    store.close()


def test_a_piece_holds_versions_superseded_after_its_end(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    two_transactions_then_supersede(store)
    with store.snapshot() as snap:
        entries, covered = read_back(
            snap, 0, store.last_seq, floor=store.last_seq, entries_max=10, bytes_max=1 << 30
        )
    # Through B (10): a2 and a4 are superseded only at 11 and 13, so A is whole.
    assert covered == 10
    assert [(e.key, e.value) for e in entries[:5]] == [(b"a%d" % i, b"A") for i in range(5)]
    store.close()


def test_a_bytes_bound_cuts_at_a_boundary_too(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    two_transactions_then_supersede(store)
    size = len(b"a0") + len(b"A")
    assert pieces(store, entries_max=100, bytes_max=7 * size)[0] == [1, 2, 3, 4, 5, -5]
    store.close()


def big_commit_spanning_leaves(store: ShardStore) -> tuple[int, int, list[int]]:
    """A commit of entries large enough to span several leaves, then newer versions of every
    entry in its last leaf. Returns the commit's first and last seq and the superseded seqs."""
    result = store.commit([Put(b"t%02d" % i, bytes([65 + i % 26]) * 1500) for i in range(20)])
    first, last = result.first_seq, result.last_seq
    with store.snapshot() as snap:
        leaves = [leaf.seqs for leaf in snap.leaves(first - 1, last)]
    assert len(leaves) >= 2, "the commit spans leaves"
    tail = [s for s in leaves[-1] if first <= s <= last]
    store.commit([Put(b"t%02d" % (s - first), b"new") for s in tail])
    return first, last, tail


def test_compaction_hands_the_boundary_on_and_keeps_markers(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", window=0)
    two_transactions_then_supersede(store)  # 1-13
    first, last, tail = big_commit_spanning_leaves(store)
    store.commit([Put(b"z", b"z")])
    result = compact(store)
    assert result.min_rollback_seq == store.last_seq  # window 0: every superseded version goes
    ends = commit_ends(store)
    # A's end (5, a4) went: its last kept entry (4, a3) ends A now. B's end (10) went: 9 ends B.
    # The big commit's last leaf went whole: a marker keeps its end.
    assert {4, 9, last} <= ends
    assert not {5, 10} & ends
    with store.snapshot() as snap:
        stored = {
            seq: (key, val, flag, size)
            for leaf in snap.leaves(0, store.last_seq)
            for seq, key, val, flag, size in zip(
                leaf.seqs, leaf.keys, leaf.vals, leaf.flags, leaf.sizes, strict=True
            )
        }
    last_key = b"t%02d" % (last - first)
    assert stored[last] == (last_key, None, fmt.COMMIT_MARKER_FLAGS, 0)
    assert all(s not in stored for s in tail if s != last)
    # Readers never see a marker.
    assert last not in [e.seq for e in store.scan()]
    newest = store.get(last_key)
    assert newest is not None
    assert newest.value == b"new"
    # Pieces end only at commit boundaries.
    after = pieces(store, entries_max=25)
    assert len(after) > 1
    assert all(-p[-1] in ends | {store.last_seq} for p in after)
    stats = store.stats()
    store.close()
    assert check_store(str(tmp_path / "s")).ok
    # After reopen, with the derived index rebuilt, the same.
    shutil.rmtree(tmp_path / "s" / "derived")
    store = open_store(tmp_path / "s", window=0)
    assert commit_ends(store) == ends
    assert pieces(store, entries_max=25) == after
    assert last not in [e.seq for e in store.scan()]
    assert store.stats()["entry_count"] == stats["entry_count"]
    assert store.stats()["superseded_count"] == stats["superseded_count"]
    # A second compaction keeps the marker: part of its commit is still kept, in an earlier leaf.
    store.commit([Put(b"z", b"z2")])
    compact(store)
    assert commit_ends(store) >= {4, 9, last}
    # Rollback never goes below the floor, where the markers are; one to the floor keeps them.
    store.commit([Put(b"z", b"z3")])
    store.rollback_to(store.header.min_rollback_seq)
    assert last in commit_ends(store)
    store.close()
    assert check_store(str(tmp_path / "s")).ok


def test_check_refuses_a_marker_that_is_more_than_a_boundary() -> None:
    bad = fmt.Leaf([3], [b"k"], [b"v"], [0], [fmt.COMMIT_MARKER_FLAGS], [2], None, None)
    with pytest.raises(CorruptionError, match="holds more than a boundary"):
        check_module.check_marker(bad, 0, 4096)
    header = fmt.Header(
        store_uuid=TEST_STORE_UUID, generation=2, commit_no=3, last_seq=9, root=None,
        prev_header=-1, region_start=0, region_crc=0, entry_count=0, payload_bytes=0,
        superseded_count=0, superseded_bytes=0, meta=-1, min_rollback_seq=5, timestamp_ms=0,
        file_overhead=1.0,
    )  # fmt: skip
    with pytest.raises(CorruptionError, match="newest version of its key"):
        check_module.check_markers([(b"k", 3, 4096)], {b"k": (2, 1, 0)}, header)
    with pytest.raises(CorruptionError, match="above min_rollback_seq"):
        check_module.check_markers([(b"k", 7, 4096)], {b"k": (8, 1, 0)}, header)
    check_module.check_markers([(b"k", 3, 4096)], {b"k": (8, 1, 0)}, header)


def test_version_1_file_opens_reads_and_bounds_pieces(tmp_path: Path) -> None:
    """tests/unit/storage/fixtures/store-v1.kys was written by the version 1 code (commit d15a823):
    txn1 = t1/0-4 (seqs 1-5), x (6), txn2 = t2/0-2 (7-9), t1/4 again (10: supersedes txn1's
    end), a delete of t2/2 (11: supersedes txn2's end), t1/0 again and y with an out-of-line
    value (12-13)."""
    directory = tmp_path / "s"
    os.makedirs(directory)
    shutil.copy(FIXTURE_V1, directory / "data.1.kys")
    store = open_store(directory, window=0)  # pieces as of their ends
    assert store.last_seq == 13
    live = {e.key: e.value for e in store.scan() if not e.deleted}
    assert live == {
        b"t1/0": b"later",
        b"t1/1": b"txn1",
        b"t1/2": b"txn1",
        b"t1/3": b"txn1",
        b"t1/4": b"later",
        b"x": b"single",
        b"t2/0": b"txn2",
        b"t2/1": b"txn2",
        b"y": b"big" * 600,
    }
    assert [e.seq for e in store.scan() if e.deleted] == [11]
    # 5 and 9 ended txn1 and txn2 and were superseded (by 10 and 11): the first piece still
    # ends at a boundary (6), the second holds the state as of 13.
    assert pieces(store, entries_max=6) == [[1, 2, 3, 4, 5, 6, -6], [7, 8, 10, 11, 12, 13, -13]]
    store.close()
    # The next commit writes a version 2 header; compaction then hands the ends on.
    store = open_store(directory, window=0)
    store.commit([Put(b"w", b"w")])
    compact(store)
    assert store.stats()["entry_count"] >= 10
    ends = commit_ends(store)
    assert {4, 6, 8} <= ends  # txn1's end went to t1/3 (4), txn2's to t2/1 (8)
    store.close()
    assert check_store(str(directory)).ok
    store = open_store(directory)
    assert {e.key: e.value for e in store.scan() if not e.deleted} == {**live, b"w": b"w"}
    store.close()


def test_entries_are_entries(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s", window=0)
    store.commit([Put(b"k", b"v"), Delete(b"k")])
    entries, covered, _, _ = read_range(store, 0, store.last_seq)
    assert covered == 2
    assert entries == [Entry(2, b"k", None, 0, None, 1, fmt.FLAG_DELETE | fmt.FLAG_BATCH_END)]
    store.close()
    # Within the window the superseded put goes down too.
    store = open_store(tmp_path / "s")
    entries, covered, _, _ = read_range(store, 0, store.last_seq)
    assert covered == 2
    assert entries == [
        Entry(1, b"k", b"v", 0, None, 0, 0),
        Entry(2, b"k", None, 0, None, 1, fmt.FLAG_DELETE | fmt.FLAG_BATCH_END),
    ]
    store.close()


def stored_flags(store: ShardStore) -> dict[int, int]:
    with store.snapshot() as snap:
        return {
            seq: flag
            for leaf in snap.leaves(0, store.last_seq)
            for seq, flag in zip(leaf.seqs, leaf.flags, strict=True)
        }


def marker_then_rest_of_commit_superseded(
    tmp_path: Path, keep_first: bool
) -> tuple[ShardStore, int, int]:
    """The big commit compacted to a marker at its end (its first leaves kept), then newer
    versions of the rest of it but its first entry (``keep_first``) or of all of it."""
    store = open_store(tmp_path / "s", window=0)
    first, last, tail = big_commit_spanning_leaves(store)
    store.commit([Put(b"z", b"z")])
    compact(store)
    assert stored_flags(store)[last] == fmt.COMMIT_MARKER_FLAGS
    start = first + 1 if keep_first else first
    store.commit(
        [Put(b"t%02d" % (s - first), b"n") for s in range(start, last + 1) if s not in tail]
    )
    return store, first, last


def assert_consistent(store: ShardStore, directory: Path) -> None:
    """Counters agree with the leaves, pieces end at boundaries, check passes, and a reopen that
    rebuilds the derived state reads the same."""
    stats = store.stats()
    assert stats["entry_count"] == len(stored_flags(store))
    ends = commit_ends(store)
    got = pieces(store, entries_max=25)
    assert all(-p[-1] in ends | {store.last_seq} for p in got)
    store.close()
    assert check_store(str(directory)).ok
    shutil.rmtree(directory / "derived")
    store = open_store(directory, window=0)
    assert pieces(store, entries_max=25) == got
    assert store.stats()["entry_count"] == stats["entry_count"]
    assert store.stats()["superseded_count"] == stats["superseded_count"]
    store.close()


def test_a_marker_goes_when_its_commit_is_dropped_whole(tmp_path: Path) -> None:
    store, first, last = marker_then_rest_of_commit_superseded(tmp_path, keep_first=False)
    before = store.stats()["entry_count"]
    compact(store)
    flags = stored_flags(store)
    # The commit went whole, its marker with it (the boundary before the commit is the same cut).
    assert not any(flag & fmt.FLAG_COMMIT_MARKER for flag in flags.values())
    assert not set(range(first, last + 1)) & set(flags)
    assert store.stats()["entry_count"] < before
    assert store.stats()["superseded_count"] == 0  # window 0: the marker was its last one
    assert_consistent(store, tmp_path / "s")


def test_a_marker_hands_its_end_on_once_it_shares_a_leaf_with_the_last_kept_entry(
    tmp_path: Path,
) -> None:
    store, first, last = marker_then_rest_of_commit_superseded(tmp_path, keep_first=True)
    compact(store)
    # The commit's first entry is kept, in an earlier leaf of the file compacted: the marker
    # stays. The new file packs the two into one leaf.
    flags = stored_flags(store)
    assert flags[last] == fmt.COMMIT_MARKER_FLAGS
    assert not flags[first] & fmt.FLAG_BATCH_END
    with store.snapshot() as snap:
        assert any({first, last} <= set(leaf.seqs) for leaf in snap.leaves(0, snap.boundary))
    store.commit([Put(b"z", b"z3")])
    compact(store)
    # Now the entry it stands for is dropped within the leaf of the commit's last kept entry,
    # which ends the commit instead, as a dropped entry's end would.
    flags = stored_flags(store)
    assert last not in flags
    assert flags[first] & fmt.FLAG_BATCH_END
    assert not any(flag & fmt.FLAG_COMMIT_MARKER for flag in flags.values())
    assert_consistent(store, tmp_path / "s")
