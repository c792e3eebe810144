"""Read-back (kayos.storage.readback) holds memory in proportion to the piece it returns, not to
the range it walks, and its pieces are exactly the state as of their cut.

A link far behind on a shard that overwrites a few keys walks every version of the range to find
the commit boundaries; the first read-back kept every walked version (its decoded leaf, inline
values included) until the cut: 400k versions of 10 keys peaked at ~140 MB for a piece of 10."""

from __future__ import annotations

import itertools
import random
import tracemalloc
from pathlib import Path

import pytest

from kayos.clock import ManualClock
from kayos.storage.disk import format as fmt
from kayos.storage.engine import Delete, Entry, Put, ShardStore, Snapshot, StoreOptions
from kayos.storage.maintenance.compact import compact
from kayos.storage.readback import read_back
from tests.support.storage import TEST_STORE_UUID

pytestmark = pytest.mark.unit

# Reading leaves costs a fixed buffer whatever the range (one pread covers up to 1 MiB of
# sibling leaves, kayos.storage.disk.btree) plus a few decoded leaves: the allowance on top of the
# piece. The range in the test holds ~5 MB of payload; walking it the old way peaked near 20 MB.
READ_BUFFERS_BYTES = 2 << 20
PIECE_OBJECT_BYTES = 1024  # generous per returned entry: an Entry, its key and value objects


def open_store(directory: Path, window: int = 1_000_000) -> ShardStore:
    return ShardStore.open(
        str(directory),
        clock=ManualClock(),
        options=StoreOptions(rollback_window_seqs=window, store_uuid=TEST_STORE_UUID),
    )


def test_memory_follows_the_piece_not_the_range(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    keys, versions, value = 10, 40_000, b"v" * 100
    for start in range(0, versions, 1_000):
        store.commit([Put(b"key%d" % (i % keys), value) for i in range(start, start + 1_000)])
    with store.snapshot() as snap:
        tracemalloc.start()
        try:
            entries, covered = read_back(
                snap,
                0,
                store.last_seq,
                floor=store.last_seq,
                entries_max=1_000,
                bytes_max=1 << 30,
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert covered == versions
    assert [e.seq for e in entries] == list(range(versions - keys + 1, versions + 1))
    assert all(e.value == value for e in entries)
    bound = READ_BUFFERS_BYTES + PIECE_OBJECT_BYTES * len(entries)
    assert peak < bound, f"peak {peak} bytes reading {versions} versions for {len(entries)}"
    store.close()


def reference_piece(snap: Snapshot, after: int, end: int, floor: int) -> list[Entry]:
    """The piece's meaning, spelled out: every version in ``(after, end]`` (markers are not
    versions) that no version in ``(after, min(end, floor)]`` supersedes, its value read."""
    versions = [
        (leaf, index)
        for leaf in snap.leaves(after, end)
        for index, (seq, flag) in enumerate(zip(leaf.seqs, leaf.flags, strict=True))
        if after < seq <= end and not flag & fmt.FLAG_COMMIT_MARKER
    ]
    superseded = {leaf.prevs[index] for leaf, index in versions if leaf.seqs[index] <= floor}
    return [
        snap.entry_at(leaf, index) for leaf, index in versions if leaf.seqs[index] not in superseded
    ]


def test_pieces_are_the_state_as_of_their_cut(tmp_path: Path) -> None:
    """Random commits (puts, deletes, repeated keys, expiries, out-of-line values), compacted
    part way: every piece a link would read equals the reference, cut by cut."""
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    store = open_store(tmp_path / "s", window=50)
    for round_no in range(300):
        ops: list[Put | Delete] = []
        for _ in range(rng.choice((1, 1, 2, 5, 20))):
            key = b"k%d" % rng.randrange(30)
            if rng.random() < 0.15:
                ops.append(Delete(key))
            else:
                size = rng.choice((1, 10, 100, 5_000))
                expiry = rng.choice((0, 0, 1))  # 1 ms after the epoch: long expired
                ops.append(Put(key, bytes([65 + round_no % 26]) * size, expiry_ms=expiry))
        store.commit(ops)
        if round_no == 200:
            compact(store)
    with store.snapshot() as snap:
        markers = sum(
            flag & fmt.FLAG_COMMIT_MARKER != 0
            for leaf in snap.leaves(0, snap.boundary)
            for flag in leaf.flags
        )
    print(f"{markers} commit-end markers")
    bounds = ((7, 1 << 30), (40, 1 << 30), (1_000, 20_000), (10_000, 1 << 30))
    # The floor at the end: the state as of each cut; inside the range: what a link sends, every
    # version superseded above its window floor kept (docs/replication-protocol.md, "BATCH").
    floors = (store.last_seq, store.last_seq - 50, store.last_seq // 2, 0)
    for (entries_max, bytes_max), floor in itertools.product(bounds, floors):
        after = 0
        while after < store.last_seq:
            with store.snapshot() as snap:
                entries, covered = read_back(
                    snap,
                    after,
                    snap.boundary,
                    floor=floor,
                    entries_max=entries_max,
                    bytes_max=bytes_max,
                )
                assert covered > after
                expected = reference_piece(snap, after, covered, floor)
                assert entries == expected, (entries_max, floor, after)
            after = covered
    store.close()
