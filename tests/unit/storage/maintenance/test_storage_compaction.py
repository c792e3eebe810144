"""Pauseless compaction (docs/storage-format.md, "Compaction", "Rollback").

Goal: compaction never loses an acknowledged commit, never changes what a pinned snapshot
returns, keeps what a rollback inside the window needs (and refuses rollbacks below it), shrinks
the file, and fails cleanly (full disk, crash, a rollback meanwhile) without touching the store.

Interleavings are forced with file-operation hooks, not with sleeps: a hook runs in the
compaction thread at a known point (the new file's creation, its rename, the old file's unlink)
and waits, with a bound, for other threads to reach theirs.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import TYPE_CHECKING

import pytest

from kayos.clock import ManualClock
from kayos.errors import (
    DiskFullError,
    RollbackTooFarError,
    StorageError,
    StoreClosedError,
)
from kayos.storage.disk.fileops import (
    OS_FILEOPS,
    FaultyFileOps,
    FileHandle,
    FileOps,
    SimulatedCrash,
)
from kayos.storage.engine import (
    CommitResult,
    DataFile,
    Delete,
    Entry,
    Put,
    ShardStore,
    StoreOptions,
)
from kayos.storage.maintenance import compact as compact_module
from kayos.storage.maintenance.compact import compact
from tests.support.storage import TEST_STORE_UUID

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

WAIT_S = 30.0
JOIN_TIMEOUT_S = 60.0


class HookedFileOps:
    """Delegates every call; ``hooks[name](path)`` runs first for truncate, append, rename and
    unlink, in the calling thread."""

    def __init__(self, inner: FileOps = OS_FILEOPS) -> None:
        self.inner = inner
        self.hooks: dict[str, Callable[[str], None]] = {}

    def fire(self, name: str, path: str) -> None:
        hook = self.hooks.get(name)
        if hook is not None:
            hook(path)

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        return HookedHandle(self, self.inner.open(path, create=create))

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def rename(self, source: str, target: str) -> None:
        self.fire("rename", source)
        self.inner.rename(source, target)

    def unlink(self, path: str) -> None:
        self.fire("unlink", path)
        self.inner.unlink(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def sync_dir(self, path: str) -> None:
        self.inner.sync_dir(path)


class HookedHandle:
    def __init__(self, ops: HookedFileOps, inner: FileHandle) -> None:
        self.ops = ops
        self.inner = inner
        self.path = inner.path

    def pread(self, size: int, offset: int) -> bytes:
        return self.inner.pread(size, offset)

    def append(self, data: bytes) -> None:
        self.ops.fire("append", self.path)
        self.inner.append(data)

    def size(self) -> int:
        return self.inner.size()

    def truncate(self, size: int) -> None:
        self.ops.fire("truncate", self.path)
        self.inner.truncate(size)

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


def open_store(directory: str, fileops: FileOps = OS_FILEOPS, window: int = 10) -> ShardStore:
    return ShardStore.open(
        directory,
        fileops=fileops,
        clock=ManualClock(),
        options=StoreOptions(rollback_window_seqs=window, store_uuid=TEST_STORE_UUID),
    )


def overwrite_batch(index: int, keys: int = 20) -> list[Put | Delete]:
    """Batch ``index``: overwrites of a small key set (garbage for compaction), a delete now and
    then, and a large value (stored out of line) now and then."""
    batch: list[Put | Delete] = []
    for n in range(4):
        key = b"key-%d" % ((index * 4 + n) % keys)
        if (index + n) % 9 == 0:
            batch.append(Delete(key))
        elif (index + n) % 13 == 0:
            batch.append(Put(key, bytes([index % 251]) * 3000))
        else:
            batch.append(Put(key, b"value-%d-%d" % (index, n) * 8))
    return batch


def newest(acknowledged: list[tuple[CommitResult, list[Put | Delete]]]) -> dict[bytes, Entry]:
    """The model: the newest version of each key over every acknowledged batch."""
    state: dict[bytes, Entry] = {}
    for result, batch in sorted(acknowledged, key=lambda item: item[0].first_seq):
        for seq, op in enumerate(batch, start=result.first_seq):
            value = op.value if isinstance(op, Put) else None
            state[op.key] = Entry(seq, op.key, value, 0, None, 0, 0)
    return state


def assert_store_matches(store: ShardStore, model: dict[bytes, Entry]) -> None:
    expected = sorted(model.values(), key=lambda entry: entry.seq)
    got = store.scan()
    assert [(e.seq, e.key, e.value) for e in got] == [(e.seq, e.key, e.value) for e in expected]
    for key, entry in model.items():
        found = store.get(key)
        if entry.value is None:
            assert found is None, key
        else:
            assert found is not None, key
            assert (found.seq, found.value) == (entry.seq, entry.value)


class Gate:
    """A counter other threads can wait on, with a bound."""

    def __init__(self) -> None:
        self._count = 0
        self._condition = threading.Condition()

    def add(self) -> None:
        with self._condition:
            self._count += 1
            self._condition.notify_all()

    @property
    def count(self) -> int:
        with self._condition:
            return self._count

    def wait_for(self, count: int) -> None:
        with self._condition:
            reached = self._condition.wait_for(lambda: self._count >= count, timeout=WAIT_S)
        assert reached, f"waited {WAIT_S} s for {count}, got {self._count}"


# --- compaction under load ----------------------------------------------------------------------


def test_compaction_under_continuous_commits_loses_nothing(tmp_path: Path) -> None:
    """One thread commits without pause, another scans a snapshot pinned before compaction, and
    the compaction (this thread) copies, catches up and swaps. Hooks make sure commits land
    after the compaction's snapshot and that the pinned snapshot is scanned while the new file
    is being built, after it is renamed into place, and after the swap."""
    hooks = HookedFileOps()
    store = open_store(str(tmp_path / "shard"), hooks)
    acknowledged: list[tuple[CommitResult, list[Put | Delete]]] = []
    for index in range(120):
        batch = overwrite_batch(index)
        acknowledged.append((store.commit(batch), batch))
    pinned = store.snapshot()
    pinned_entries = list(pinned.scan())
    commits, scans = Gate(), Gate()
    compaction_done = threading.Event()
    errors: list[BaseException] = []
    commits_after_compaction = 25
    commits_max = 20_000  # a bound on the loop should compaction never finish

    def committer() -> None:
        try:
            index = 120
            after = 0
            while after < commits_after_compaction and index < commits_max:
                batch = overwrite_batch(index)
                acknowledged.append((store.commit(batch), batch))
                commits.add()
                index += 1
                if compaction_done.is_set():
                    after += 1
        except BaseException as exc:
            errors.append(exc)

    def pinned_reader() -> None:
        try:
            while not compaction_done.is_set():
                assert list(pinned.scan()) == pinned_entries
                live = store.scan()
                assert len({e.key for e in live}) == len(live), "one version per key"
                scans.add()
        except BaseException as exc:
            errors.append(exc)

    def while_building(path: str) -> None:
        if path.endswith(".compact"):
            start = commits.count
            commits.wait_for(start + 30)  # these land after the compaction's snapshot
            scans.wait_for(scans.count + 2)  # ... and so do scans of the pinned snapshot

    def before_swap(path: str) -> None:
        if path.endswith(".compact"):
            assert list(pinned.scan()) == pinned_entries

    hooks.hooks["truncate"] = while_building
    hooks.hooks["rename"] = before_swap
    threads = [threading.Thread(target=committer), threading.Thread(target=pinned_reader)]
    for thread in threads:
        thread.start()
    try:
        result = compact(store)
    finally:
        compaction_done.set()
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    assert errors == []
    hooks.hooks.clear()
    try:
        assert result.generation == 2
        assert result.catchup_rounds >= 1, "commits landed after the compaction's snapshot"
        assert store.header.generation == 2
        assert result.entries_dropped > 0
        assert result.bytes_after < result.bytes_before
        assert store.header.min_rollback_seq == result.min_rollback_seq
        assert list(pinned.scan()) == pinned_entries, "after the swap"
        pinned.release()
        model = newest(acknowledged)
        assert_store_matches(store, model)
        assert store.last_seq == max(ack.last_seq for ack, _ in acknowledged)
        assert sorted(os.listdir(store.directory)) == ["data.2.kys", "derived"]
    finally:
        store.close()
    store = open_store(str(tmp_path / "shard"))
    try:
        assert_store_matches(store, model)
        assert store.header.min_rollback_seq == result.min_rollback_seq
        store.commit(overwrite_batch(0))
    finally:
        store.close()


def test_readers_racing_the_swap_never_see_a_closed_file(
    tmp_store: ShardStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: get() and snapshot() read the current file, then pinned it; a compaction
    finishing in between closed that file and the reader failed with StoreClosedError."""
    for index in range(30):
        tmp_store.commit(overwrite_batch(index))
    expected = tmp_store.scan()
    original_acquire = DataFile.acquire
    armed = [False]

    def acquire_after_a_swap(self: DataFile) -> DataFile:
        if armed[0]:
            armed[0] = False
            compact(tmp_store)  # the swap lands between reading the current file and pinning it
        return original_acquire(self)

    monkeypatch.setattr(DataFile, "acquire", acquire_after_a_swap)
    armed[0] = True
    entry = tmp_store.get(expected[-1].key)
    assert entry == expected[-1]
    armed[0] = True
    with tmp_store.snapshot() as snapshot:
        assert list(snapshot.scan()) == expected
    armed[0] = True
    assert tmp_store.scan() == expected
    assert tmp_store.header.generation == 4


# --- what compaction keeps ----------------------------------------------------------------------


def test_rollback_window_survives_compaction_and_below_it_is_refused(tmp_path: Path) -> None:
    """Versions superseded above the floor F = C - rollback_window_seqs stay, so rollback_to(F)
    restores them; below F the versions are gone and rollback raises RollbackTooFarError without
    changing anything, also after reopen."""
    store = open_store(str(tmp_path / "shard"), window=5)
    for seq in range(1, 31):
        store.commit([Put(b"counter", b"%d" % seq)])
    store.commit([Put(b"other", b"x")])  # seq 31
    before = store.stats()
    result = compact(store)
    assert result.min_rollback_seq == 31 - 5
    # Versions 1..25 were superseded at or below the floor (26); 26..31 are kept.
    assert result.entries_dropped == 25
    assert store.stats()["entry_count"] == before["entry_count"] - 25
    assert store.stats()["superseded_count"] == before["superseded_count"] - 25
    assert result.bytes_after < result.bytes_before
    store.close()
    store = open_store(str(tmp_path / "shard"), window=5)
    try:
        assert store.header.min_rollback_seq == 26
        size, stats = store.file_bytes(), store.stats()
        with pytest.raises(RollbackTooFarError):
            store.rollback_to(25)
        assert (store.file_bytes(), store.stats()) == (size, stats)
        store.rollback_to(26)
        counter = store.get(b"counter")
        assert counter is not None
        assert (counter.seq, counter.value) == (26, b"26")
        assert store.get(b"other") is None
        assert [e.seq for e in store.scan()] == [26]
    finally:
        store.close()


def test_a_second_compaction_keeps_the_first_floor(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "shard"), window=100)
    try:
        for seq in range(1, 41):
            store.commit([Put(b"k%d" % (seq % 3), b"%d" % seq)])
        store.rollback_to(30)
        assert compact(store).min_rollback_seq == 0
        store.options.rollback_window_seqs = 10
        assert compact(store).min_rollback_seq == 20
        store.options.rollback_window_seqs = 100
        assert compact(store).min_rollback_seq == 20, "a floor never moves down"
        with pytest.raises(RollbackTooFarError):
            store.rollback_to(19)
        assert store.header.generation == 4
    finally:
        store.close()


def test_large_values_and_metadata_move_to_the_new_file(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "shard"), window=0)
    try:
        store.commit([Put(b"big", b"B" * 10_000), Put(b"small", b"s")], meta={"hwm": 7})
        store.commit([Put(b"big", b"C" * 9_000)])
        with store.snapshot() as snapshot:
            compact(store)
            assert [e.value for e in snapshot.scan()] == [b"s", b"C" * 9_000]
        big = store.get(b"big")
        assert big is not None
        assert big.value == b"C" * 9_000
        assert store.meta == {"hwm": 7}
        assert store.stats()["entry_count"] == 2
    finally:
        store.close()
    store = open_store(str(tmp_path / "shard"))
    try:
        assert store.meta == {"hwm": 7}
        assert [e.value for e in store.scan()] == [b"s", b"C" * 9_000]
    finally:
        store.close()


def test_expired_newest_versions_survive_compaction(tmp_path: Path) -> None:
    """Compaction drops superseded versions only ("Compaction", step 2): an expired entry that is
    still the newest version of its key stays in the file, because retention belongs to the
    queue layer. Reads keep filtering it by expiry; a replica's export still carries it."""
    store = open_store(str(tmp_path / "shard"), window=0)
    try:
        store.commit([Put(b"expired", b"1", expiry_ms=1_000), Put(b"live", b"2")])
        store.commit([Put(b"old", b"x")])
        store.commit([Put(b"old", b"y")])
        result = compact(store)
        assert result.entries_dropped == 1, "only the superseded version of b'old'"
        assert store.stats()["entry_count"] == 3
        with store.snapshot() as snapshot:
            assert [e.key for e in snapshot.scan(now_ms=2_000)] == [b"live", b"old"]
            kept = [e.key for page in snapshot.pages(include_expired=True) for e in page]
            assert kept == [b"expired", b"live", b"old"]
        assert store.get(b"expired", now_ms=2_000) is None
        before_expiry = store.get(b"expired", now_ms=500)
        assert before_expiry is not None
        assert before_expiry.value == b"1"
        assert [e.key for page in store.export(0) for e in page] == kept
    finally:
        store.close()


def test_the_compaction_lock_table_lets_stores_go(tmp_path: Path) -> None:
    """Regression: the per-store compaction locks were kept in a dict keyed by id(store) that
    never shrank (and a new store could inherit a dead one's entry); an entry now goes with its
    store."""
    gc.collect()  # stores earlier tests dropped go now, not in the middle of this count
    before = len(compact_module.compaction_locks)
    store = open_store(str(tmp_path / "shard"))
    store.commit(overwrite_batch(0))
    compact(store)
    assert len(compact_module.compaction_locks) == before + 1
    store.close()
    gone = weakref.ref(store)
    del store
    gc.collect()
    assert gone() is None, "the lock table keeps no store alive"
    assert len(compact_module.compaction_locks) == before


def test_compacting_an_empty_store(tmp_store: ShardStore) -> None:
    result = compact(tmp_store)
    assert (result.entries_copied, result.entries_dropped) == (0, 0)
    assert tmp_store.scan() == []
    tmp_store.commit([Put(b"a", b"1")])
    assert [e.key for e in tmp_store.scan()] == [b"a"]


def test_bytes_after_is_the_compacted_file_not_later_commits(tmp_path: Path) -> None:
    """Regression: bytes_after was read after the commit lock was released, so commits landing
    right after the swap were counted as compaction output."""
    hooks = HookedFileOps()
    store = open_store(str(tmp_path / "shard"), hooks)
    try:
        for index in range(40):
            store.commit(overwrite_batch(index))
        sizes: list[int] = []

        def commit_right_after_the_swap(path: str) -> None:
            if path.endswith("data.1.kys"):
                sizes.append(store.file_bytes())
                store.commit([Put(b"late", b"x" * 500)])

        hooks.hooks["unlink"] = commit_right_after_the_swap
        result = compact(store)
        assert sizes, "the old file was unlinked"
        assert result.bytes_after == sizes[0]
        assert store.file_bytes() > result.bytes_after
    finally:
        store.close()


# --- failures -----------------------------------------------------------------------------------


def test_one_compaction_at_a_time(tmp_path: Path) -> None:
    hooks = HookedFileOps()
    store = open_store(str(tmp_path / "shard"), hooks)
    try:
        store.commit(overwrite_batch(0))
        refused: list[BaseException] = []

        def compact_again(path: str) -> None:
            try:
                compact(store)
            except StorageError as exc:
                refused.append(exc)

        hooks.hooks["rename"] = compact_again
        compact(store)
        assert len(refused) == 1
        assert "already running" in str(refused[0])
    finally:
        store.close()


def test_a_rollback_during_compaction_abandons_it(tmp_path: Path) -> None:
    hooks = HookedFileOps()
    store = open_store(str(tmp_path / "shard"), hooks)
    try:
        for index in range(20):
            store.commit(overwrite_batch(index))

        def roll_back(path: str) -> None:
            if path.endswith(".compact"):
                store.rollback_to(40)

        hooks.hooks["truncate"] = roll_back
        with pytest.raises(StorageError, match="abandoned"):
            compact(store)
        hooks.hooks.clear()
        assert store.header.generation == 1
        assert store.last_seq == 40
        assert sorted(os.listdir(store.directory)) == ["data.1.kys", "derived"]
        result = compact(store)
        assert result.generation == 2
        assert store.last_seq == 40
    finally:
        store.close()


def test_a_full_disk_fails_compaction_cleanly(tmp_path: Path) -> None:
    faulty = FaultyFileOps()
    store = open_store(str(tmp_path / "shard"), faulty)
    try:
        for index in range(60):
            store.commit(overwrite_batch(index))
        expected = store.scan()
        faulty.space_left_bytes = 1000  # the live data alone needs more
        with pytest.raises(DiskFullError):
            compact(store)
        faulty.space_left_bytes = None
        assert store.header.generation == 1
        assert store.scan() == expected
        assert sorted(os.listdir(store.directory)) == ["data.1.kys", "derived"]
        store.commit([Put(b"after", b"1")])
        assert compact(store).generation == 2
        assert store.scan() == [*expected, *store.scan(expected[-1].seq)]
    finally:
        store.close()


def test_a_crash_while_writing_the_new_file_keeps_the_old_one(tmp_path: Path) -> None:
    faulty = FaultyFileOps()
    directory = str(tmp_path / "shard")
    store = open_store(directory, faulty)
    for index in range(60):
        store.commit(overwrite_batch(index))
    expected = store.scan()
    faulty.tear_next_append_at = 5000  # the compaction's first write
    with pytest.raises(SimulatedCrash):
        compact(store)
    store.close()
    faulty.crash()
    store = open_store(directory)
    try:
        assert store.header.generation == 1
        assert store.scan() == expected
        assert sorted(os.listdir(directory)) == ["data.1.kys", "derived"]
    finally:
        store.close()


def test_a_crash_between_rename_and_unlink_opens_the_new_generation(tmp_path: Path) -> None:
    hooks = HookedFileOps()
    directory = str(tmp_path / "shard")
    store = open_store(directory, hooks)
    for index in range(60):
        store.commit(overwrite_batch(index))
    expected = store.scan()

    def die(path: str) -> None:
        raise SimulatedCrash(f"power cut before unlinking {path}")

    hooks.hooks["unlink"] = die
    with pytest.raises(SimulatedCrash):
        compact(store)
    hooks.hooks.clear()
    store.close()
    assert sorted(os.listdir(directory)) == ["data.1.kys", "data.2.kys", "derived"]
    store = open_store(directory)
    try:
        assert store.header.generation == 2
        assert store.scan() == expected
        assert sorted(os.listdir(directory)) == ["data.2.kys", "derived"]
    finally:
        store.close()


def test_compaction_of_a_closed_store_is_refused(tmp_store: ShardStore) -> None:
    tmp_store.close()
    with pytest.raises(StoreClosedError):
        compact(tmp_store)
