"""Compaction with retention floors (docs/retention.md, "What compaction does with a dropped newest
version"): entries of a queue at or below its floor go, superseded or not, tombstones included;
other queues' entries stay; the key index forgets what went; counters stay right; `kayos check`
passes; the same floor on two copies of one history gives the same entries."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kayos.errors import DiskFullError
from kayos.storage.engine import Delete, Put, ShardStore, StoreOptions
from kayos.storage.maintenance.check import check_store
from kayos.storage.maintenance.compact import compact
from tests.support.storage import TEST_STORE_UUID

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from pathlib import Path


def open_store(directory: Path) -> ShardStore:
    return ShardStore.open(
        str(directory),
        options=StoreOptions(rollback_window_seqs=4, store_uuid=TEST_STORE_UUID),
    )


def write_history(store: ShardStore) -> None:
    """Queue q: keys k0..k19 (seqs 1-20), then k0 again (21), then a delete of k1 (22); queue
    r: 10 keys (23-32); then q's k2 in a batch of two with r's x (33-34)."""
    for n in range(20):
        store.commit([Put(b"q\x00k%d" % n, b"v" * 50)])
    store.commit([Put(b"q\x00k0", b"new")])
    store.commit([Delete(b"q\x00k1")])
    for n in range(10):
        store.commit([Put(b"r\x00x%d" % n, b"w" * 50)])
    store.commit([Put(b"q\x00k2", b"again"), Put(b"r\x00x0", b"again")])


def live(store: ShardStore) -> list[tuple[int, bytes, bytes | None]]:
    return [(e.seq, e.key, e.value) for e in store.scan()]


def test_floor_drops_the_queue_entries_below_it_and_nothing_else(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    write_history(store)
    before = store.header
    result = compact(store, {b"q\x00": 22})
    after = store.header
    kept = live(store)
    # Every q entry at or below 22 went (k0's new version at 21 and the delete at 22 too); the
    # later q entry (33) and every r entry stayed.
    assert [s for s, k, _ in kept if k.startswith(b"q\x00")] == [33]
    assert [s for s, k, _ in kept if k.startswith(b"r\x00")] == [*range(24, 33), 34]
    assert result.retention_dropped > 0
    assert after.payload_bytes < before.payload_bytes
    # Forgotten by the key index: gone keys read as absent, k2's newest is 33.
    assert store.get(b"q\x00k5") is None
    assert store.get(b"q\x00k0") is None
    k2 = store.get(b"q\x00k2")
    assert k2 is not None
    assert k2.seq == 33
    # Counters: live payload is what the live entries hold.
    live_bytes = sum(len(e.key) + len(e.value or b"") for e in store.scan())
    assert after.payload_bytes - after.superseded_bytes == live_bytes
    path = store.directory
    store.close()
    report = check_store(path)
    assert report.ok, report.problem
    # A later put of a forgotten key starts afresh (no prev), and the store still checks.
    store = open_store(tmp_path / "s")
    store.commit([Put(b"q\x00k5", b"back")])
    entry = store.get(b"q\x00k5")
    assert entry is not None
    assert entry.value == b"back"
    store.close()
    assert check_store(path).ok


def test_same_floor_same_entries_wherever_it_runs(tmp_path: Path) -> None:
    """Two replicas of one history, one compacted with floor 10 and then 22, the other once with
    22: the same entries."""
    one, two = open_store(tmp_path / "one"), open_store(tmp_path / "two")
    write_history(one)
    write_history(two)
    compact(one, {b"q\x00": 10})
    compact(one, {b"q\x00": 22})
    compact(two, {b"q\x00": 22})
    assert live(one) == live(two)
    assert one.header.entry_count == two.header.entry_count
    assert one.header.payload_bytes == two.header.payload_bytes
    for store in (one, two):
        path = store.directory
        store.close()
        assert check_store(path).ok


def test_a_floor_inside_a_batch_keeps_its_commit_boundary(tmp_path: Path) -> None:
    """Floor 34 on q drops q's 33, the first entry of the commit 33-34 (r's x0 at 34 ends it and
    stays); check passes."""
    store = open_store(tmp_path / "s")
    write_history(store)
    compact(store, {b"q\x00": 34})
    assert all(not k.startswith(b"q\x00") for _, k, _ in live(store))
    path = store.directory
    store.close()
    assert check_store(path).ok


def test_no_floors_is_the_old_compaction(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    write_history(store)
    before = live(store)
    result = compact(store)
    assert result.retention_dropped == 0
    assert live(store) == before
    store.close()


def test_a_commit_that_would_eat_the_disk_reserve_fails_clean_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """docs/retention.md, "Disk full": below the reserve a commit is refused before it writes a
    byte; the store stays usable and writes go on once space is there again."""
    store = open_store(tmp_path / "s")
    store.commit([Put(b"q\x00a", b"1")])
    size, header = store.file_bytes(), store.header
    store.options.disk_reserve_bytes = 1 << 62  # more than any disk has free
    with pytest.raises(DiskFullError):
        store.commit([Put(b"q\x00b", b"2")])
    with pytest.raises(DiskFullError):
        compact(store)
    assert store.file_bytes() == size
    assert store.header == header
    store.options.disk_reserve_bytes = 0
    store.commit([Put(b"q\x00b", b"2")])
    assert [e.key for e in store.scan()] == [b"q\x00a", b"q\x00b"]
    path = store.directory
    store.close()
    assert check_store(path).ok


def test_rollback_past_a_version_retention_dropped_leaves_the_key_absent(tmp_path: Path) -> None:
    """A key written below the floor and again in a batch that is then rolled back (an uncommitted
    tail): the version the rollback would restore is gone, so the key has none; the index says
    so and the store checks."""
    store = open_store(tmp_path / "s")
    store.commit([Put(b"q\x00k", b"old")])
    store.commit([Put(b"r\x00x", b"other")])
    store.commit([Put(b"q\x00k", b"new")])
    compact(store, {b"q\x00": 1})
    assert [e.seq for e in store.scan()] == [2, 3]
    store.rollback_to(2)
    assert store.get(b"q\x00k") is None
    assert [e.seq for e in store.scan()] == [2]
    path = store.directory
    store.close()
    report = check_store(path)  # the index names no entry the file lacks
    assert report.ok, report.problem
    store = open_store(tmp_path / "s")
    store.commit([Put(b"q\x00k", b"again")])
    assert store.header.superseded_count == 0
    entry = store.get(b"q\x00k")
    assert entry is not None
    assert entry.value == b"again"
    store.close()
    report = check_store(path)
    assert report.ok, report.problem
