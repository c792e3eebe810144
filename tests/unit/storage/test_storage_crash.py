"""Crash safety and corruption handling of the shard store (docs/storage-format.md, "Commit",
"Recovery (open)", "Derived state").

Goal: a power cut at any byte of a commit, the loss of any unsynced pages, a failed fsync, a full
disk, lost or stale derived state and flipped bits all end in a documented, checked outcome:
exactly the previous committed state or exactly the new one, never a partial batch and never a
lost acknowledged one; corruption is reported with the offset of the damaged chunk.

``FaultyFileOps`` simulates the disk's durability, so these tests use a RAM-backed directory
when there is one: the medium's own fsync adds nothing but time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import CorruptionError, DiskFullError, StorageError, StoreClosedError
from kayos.storage.disk import btree, index
from kayos.storage.disk import format as fmt
from kayos.storage.disk.fileops import OS_FILEOPS, FaultyFileOps, FileOps, SimulatedCrash
from kayos.storage.engine import Delete, Entry, Put, ShardStore, StoreOptions
from tests.support.storage import TEST_STORE_UUID

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

KEYS = [b"alpha", b"beta", b"gamma", b"delta", b"omega"]


@pytest.fixture
def shard_dir(tmp_path: Path) -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    directory = tempfile.mkdtemp(prefix="kayos-crash-", dir=base or str(tmp_path))
    try:
        yield os.path.join(directory, "shard")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def open_store(directory: str, fileops: FileOps = OS_FILEOPS) -> ShardStore:
    return ShardStore.open(
        directory,
        fileops=fileops,
        clock=ManualClock(),
        options=StoreOptions(store_uuid=TEST_STORE_UUID),
    )


def copy_tree(source: str, target: str) -> None:
    """``shutil.copytree`` that keeps holes: lmdb's data file (writemap) is as long as its map,
    a terabyte of address space, and a plain copy would write every byte of it."""
    for root, _, names in os.walk(source):
        target_root = os.path.join(target, os.path.relpath(root, source))
        os.makedirs(target_root, exist_ok=True)
        for name in names:
            copy_file_sparse(os.path.join(root, name), os.path.join(target_root, name))


def copy_file_sparse(source: str, target: str) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                data_start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError:
                break  # only a hole remains
            data_end = os.lseek(src.fileno(), data_start, os.SEEK_HOLE)
            src.seek(data_start)
            dst.seek(data_start)
            remaining = data_end - data_start
            while remaining:
                piece = src.read(min(remaining, 1 << 20))
                dst.write(piece)
                remaining -= len(piece)
            offset = data_end
        dst.truncate(size)


@dataclass(frozen=True, slots=True)
class State:
    """Everything a reader can observe of a store."""

    entries: tuple[Entry, ...]
    latest: tuple[Entry | None, ...]
    meta: dict[str, Any]
    stats: dict[str, Any]


def observe(store: ShardStore) -> State:
    stats = store.stats()
    del stats["compactions"]  # counts this process's compactions, not the store's
    return State(tuple(store.scan()), tuple(store.get(key) for key in KEYS), store.meta, stats)


def committed_store(directory: str, fileops: FileOps = OS_FILEOPS) -> tuple[ShardStore, State]:
    """A store with two committed batches (a superseded version, a delete, metadata)."""
    store = open_store(directory, fileops)
    store.commit([Put(b"alpha", b"1"), Put(b"beta", b"2" * 300)], meta={"hwm": 1})
    store.commit([Put(b"alpha", b"3"), Delete(b"beta"), Put(b"gamma", b"4")])
    return store, observe(store)


NEXT_BATCH: list[Put | Delete] = [Put(b"alpha", b"5" * 40), Put(b"delta", b"6"), Delete(b"gamma")]
NEXT_META = {"hwm": 2}


# --- torn writes ----------------------------------------------------------------------------------


def test_a_write_torn_at_every_byte_leaves_exactly_the_previous_state(shard_dir: str) -> None:
    """A power cut after k bytes of a commit's single write, for every k from 0 to the whole
    write: reopening (with the real file ops, or a fresh faulty twin) yields exactly the state
    before the commit, keeps the cut bytes in ``.tail``, and the store commits on."""
    store, before = committed_store(shard_dir)
    size_before = store.file_bytes()
    store.close()

    # Learn the commit's length: a tear past its end writes all of it, then cuts the power.
    faulty = FaultyFileOps()
    store = open_store(shard_dir, faulty)
    faulty.tear_next_append_at = 1 << 30
    with pytest.raises(SimulatedCrash):
        store.commit(NEXT_BATCH, meta=NEXT_META)
    commit_bytes = store.file_bytes() - size_before
    store.close()
    faulty.crash()
    assert commit_bytes >= fmt.BLOCK, "the commit ends in a header block of its own"

    for torn_at in range(commit_bytes + 1):
        faulty = FaultyFileOps()
        store = open_store(shard_dir, faulty)
        faulty.tear_next_append_at = torn_at
        with pytest.raises(SimulatedCrash):
            store.commit(NEXT_BATCH, meta=NEXT_META)
        store.close()
        faulty.crash()
        store = open_store(shard_dir, OS_FILEOPS if torn_at % 2 else FaultyFileOps())
        try:
            assert observe(store) == before, f"torn at byte {torn_at} of {commit_bytes}"
            assert store.recovery.dropped_bytes == 0, "unsynced pages were lost, not kept"
        finally:
            store.close()
    # The same, with the torn bytes surviving (a process crash rather than a power cut).
    for torn_at in range(0, commit_bytes, 61):
        faulty = FaultyFileOps()
        store = open_store(shard_dir, faulty)
        faulty.tear_next_append_at = torn_at
        with pytest.raises(SimulatedCrash):
            store.commit(NEXT_BATCH, meta=NEXT_META)
        store.close()
        faulty.crash(keep_page_probability=1.0)
        store = open_store(shard_dir)
        try:
            assert observe(store) == before, f"torn at byte {torn_at} of {commit_bytes}"
            assert store.recovery.dropped_bytes == torn_at
            assert store.recovery.dropped_from == (size_before if torn_at else -1)
            if torn_at:
                with open(store.path + ".tail", "rb") as tail:
                    assert len(tail.read()) == torn_at
        finally:
            store.close()
    store = open_store(shard_dir)
    try:
        store.commit(NEXT_BATCH, meta=NEXT_META)
        after = observe(store)
    finally:
        store.close()
    store = open_store(shard_dir)
    try:
        assert observe(store) == after
        assert store.get(b"gamma") is None
        assert store.meta == NEXT_META
    finally:
        store.close()


# --- lost unsynced pages --------------------------------------------------------------------------

LARGE_BATCH: list[Put | Delete] = [
    Put(b"alpha", b"a" * 3000),
    Put(b"delta", b"d" * 3000),
    Put(b"omega", b"o" * 3000),
]


@pytest.mark.parametrize("keep_page_probability", [0.0, 0.5, 1.0])
def test_lost_unsynced_pages_leave_the_old_or_the_new_state(
    shard_dir: str, keep_page_probability: float
) -> None:
    """A commit written in full but never fsynced, then a power cut that keeps each changed
    page with the given probability: the store reopens in exactly the old state or exactly the
    new one (region_crc tells them apart); with no page kept it is the old one, with every page
    kept the new one."""
    store, before = committed_store(shard_dir)
    store.close()
    pristine = shard_dir + ".pristine"
    copy_tree(shard_dir, pristine)
    store = open_store(shard_dir)
    store.commit(LARGE_BATCH, meta=NEXT_META)
    after = observe(store)
    store.close()
    outcomes: list[str] = []
    for seed in range(12):
        shutil.rmtree(shard_dir)
        copy_tree(pristine, shard_dir)
        faulty = FaultyFileOps()
        store = open_store(shard_dir, faulty)
        faulty.tear_next_append_at = 1 << 30  # the whole write lands; the fsync never happens
        with pytest.raises(SimulatedCrash):
            store.commit(LARGE_BATCH, meta=NEXT_META)
        store.close()
        print(f"crash(keep_page_probability={keep_page_probability}, seed={seed})")
        faulty.crash(keep_page_probability=keep_page_probability, seed=seed)
        store = open_store(shard_dir)
        try:
            state = observe(store)
        finally:
            store.close()
        assert state in (before, after), f"seed={seed}"
        outcomes.append("new" if state == after else "old")
    print("outcomes:", outcomes)
    if keep_page_probability == 0.0:
        assert set(outcomes) == {"old"}
    if keep_page_probability == 1.0:
        assert set(outcomes) == {"new"}


# --- derived state --------------------------------------------------------------------------------


def crash_during_next_commit(directory: str, batches: list[list[Put | Delete]]) -> State:
    """Commits ``batches``, then tears the next commit and cuts the power. Returns the state
    that must survive."""
    faulty = FaultyFileOps()
    store = open_store(directory, faulty)
    for batch in batches:
        store.commit(batch)
    state = observe(store)
    faulty.tear_next_append_at = 100
    with pytest.raises(SimulatedCrash):
        store.commit(NEXT_BATCH)
    store.close()
    faulty.crash()
    return state


def supersede_batches() -> list[list[Put | Delete]]:
    return [
        [Put(b"alpha", b"x"), Put(b"omega", b"y")],
        [Put(b"alpha", b"z"), Delete(b"omega"), Put(b"beta", b"b")],
        [Put(b"omega", b"back"), Put(b"alpha", b"last")],
    ]


def test_deleted_derived_state_is_rebuilt_after_a_crash(shard_dir: str) -> None:
    store, _ = committed_store(shard_dir)
    store.close()
    survived = crash_during_next_commit(shard_dir, supersede_batches())
    assert_rebuilt_without_derived_state(shard_dir, survived)


def assert_rebuilt_without_derived_state(shard_dir: str, expected: State) -> None:
    """Deletes the store's derived state and checks that open rebuilds it to ``expected``."""
    shutil.rmtree(os.path.join(shard_dir, "derived"))
    store = open_store(shard_dir)
    try:
        assert store.recovery.rebuilt_index
        assert observe(store) == expected
    finally:
        store.close()


@pytest.mark.parametrize("txn_entries", [1, 3, 1 << 20])
def test_a_rebuild_in_any_transaction_size_gives_the_same_index(
    shard_dir: str, txn_entries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild groups leaves into lmdb transactions of ``index_rebuild_txn_entries``: a key
    superseded in another group than its earlier version, or within one, ends the same either
    way."""
    store = open_store(shard_dir)
    for round_no in range(40):
        store.commit([Put(KEYS[(round_no + i) % len(KEYS)], b"v%d" % round_no) for i in range(3)])
        if round_no % 7 == 0:
            store.commit([Delete(KEYS[round_no % len(KEYS)])])
    expected = observe(store)
    store.close()
    monkeypatch.setattr(limits, "index_rebuild_txn_entries", txn_entries)
    assert_rebuilt_without_derived_state(shard_dir, expected)


def test_stale_derived_state_is_replayed_after_a_crash(shard_dir: str) -> None:
    """Derived state from an earlier clean stop (applied_seq behind the file): open replays the
    commits after it, including which versions they superseded."""
    store, _ = committed_store(shard_dir)
    store.close()
    old_derived = shard_dir + ".derived"
    copy_tree(os.path.join(shard_dir, "derived"), old_derived)
    survived = crash_during_next_commit(shard_dir, supersede_batches())
    shutil.rmtree(os.path.join(shard_dir, "derived"))
    copy_tree(old_derived, os.path.join(shard_dir, "derived"))
    store = open_store(shard_dir)
    try:
        assert store.recovery.replayed_entries == sum(len(b) for b in supersede_batches())
        assert observe(store) == survived
    finally:
        store.close()


def test_derived_state_ahead_of_the_file_is_rebuilt(shard_dir: str) -> None:
    """A data file restored from before the derived state's last commit: the index is reset and
    rebuilt from the file instead of pointing at seqs the file does not have."""
    store, before = committed_store(shard_dir)
    path = store.path
    store.close()
    shutil.copyfile(path, path + ".saved")
    store = open_store(shard_dir)
    for batch in supersede_batches():
        store.commit(batch)
    store.close()
    os.replace(path + ".saved", path)
    store = open_store(shard_dir)
    try:
        assert store.recovery.rebuilt_index
        assert observe(store) == before
    finally:
        store.close()


def test_derived_state_of_another_store_is_rebuilt(shard_dir: str) -> None:
    other = ShardStore.open(shard_dir + ".other", clock=ManualClock())  # a random uuid
    other.commit([Put(b"alpha", b"from another store")])
    other.close()
    store, before = committed_store(shard_dir)
    store.close()
    shutil.rmtree(os.path.join(shard_dir, "derived"))
    copy_tree(os.path.join(shard_dir + ".other", "derived"), os.path.join(shard_dir, "derived"))
    store = open_store(shard_dir)
    try:
        assert store.recovery.rebuilt_index
        assert observe(store) == before
    finally:
        store.close()


def test_unclean_derived_state_from_another_boot_is_rebuilt(
    shard_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that stopped uncleanly (here: poisoned by a failed fsync) may have lost derived
    pages in the power cut that followed; after a reboot it is rebuilt, not trusted."""
    monkeypatch.setattr(index, "boot_id", lambda: "boot-1")
    faulty = FaultyFileOps()
    store = open_store(shard_dir, faulty)
    for batch in supersede_batches():
        store.commit(batch)
    survived = observe(store)
    faulty.fail_next_sync = True
    with pytest.raises(StorageError):
        store.commit(NEXT_BATCH)
    store.close()
    faulty.crash()
    # The lost pages of the successor map come back as garbage.
    with open(os.path.join(shard_dir, "derived", "succ.u64"), "r+b") as succ:
        succ.write(b"\x01" * 4096)
    monkeypatch.setattr(index, "boot_id", lambda: "boot-2")
    store = open_store(shard_dir)
    try:
        assert store.recovery.rebuilt_index
        assert observe(store) == survived
    finally:
        store.close()


# --- bit flips ------------------------------------------------------------------------------------


def flip_bit(path: str, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ (1 << bit)]))


def chunk_span(path: str, pos: int) -> int:
    handle = OS_FILEOPS.open(path)
    try:
        raw = handle.pread(fmt.physical_span(pos, fmt.PREFIX_BYTES), pos)
        length, _ = fmt.parse_chunk_prefix(fmt.strip_block_bytes(pos, raw), path=path, offset=pos)
        return fmt.physical_span(pos, fmt.PREFIX_BYTES + length)
    finally:
        handle.close()


def old_nodes(store: ShardStore) -> list[tuple[int, int]]:
    """(position, height) of every reachable node written before the last commit."""
    header = store.header
    reader = btree.NodeReader(store.current_file().handle)
    found: list[tuple[int, int]] = []

    def walk(pos: int, height: int) -> None:
        if pos < header.region_start:
            found.append((pos, height))
        node = reader.read_node(pos)
        if isinstance(node, fmt.Interior):
            for child in node.children:
                walk(child.pos, height - 1)

    assert header.root is not None
    walk(header.root.pos, header.root.height)
    return found


def assert_reads_fail_at(directory: str, offset: int, key: bytes, damage: int) -> None:
    store = open_store(directory)  # reopened: no node cache hides the damage
    try:
        with pytest.raises(CorruptionError) as caught:
            store.scan()
        assert caught.value.offset == offset, f"damage at {damage}"
        assert f"offset {offset}" in str(caught.value)
        with pytest.raises(CorruptionError) as caught:
            store.get(key)
        assert caught.value.offset == offset, f"damage at {damage}"
    finally:
        store.close()


def test_a_flipped_bit_in_an_old_leaf_is_reported_at_its_offset(shard_dir: str) -> None:
    """Every reachable node outside the last commit is only checked when read: a flipped bit
    anywhere in its chunk (length, CRC, body, and the data type bytes of the blocks it crosses)
    makes scan and get raise CorruptionError naming the chunk's offset."""
    store = open_store(shard_dir)
    store.commit([Put(b"k%d" % n, bytes([n]) * 1500) for n in range(12)])  # more than one leaf
    store.commit([Put(b"last", b"commit")])
    leaves = [pos for pos, height in old_nodes(store) if height == 1]
    path = store.path
    store.close()
    assert leaves, "the first commit finalized at least one leaf"
    leaf = leaves[0]
    span = chunk_span(path, leaf)
    with open(path, "rb") as handle:
        pristine = handle.read()
    type_bytes = [pos for pos in range(leaf, leaf + span) if pos % fmt.BLOCK == 0]
    assert type_bytes, "the leaf crosses a block boundary"
    offsets = sorted({*range(leaf, leaf + 8), *range(leaf, leaf + span, 211), leaf + span - 1})
    for offset in offsets + type_bytes:
        flip_bit(path, offset, offset % 8 if offset not in type_bytes else 0)
        try:
            assert_reads_fail_at(shard_dir, leaf, b"k0", offset)
        finally:
            with open(path, "wb") as handle:
                handle.write(pristine)


def test_a_flipped_bit_in_an_old_interior_node_is_reported_at_its_offset(
    shard_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "leaf_bytes_target", 100)
    monkeypatch.setattr(limits, "interior_children_max", 3)
    store = open_store(shard_dir)
    for n in range(40):
        store.commit([Put(b"k%d" % n, b"v" * 60)])
    interiors = [pos for pos, height in old_nodes(store) if height > 1]
    path = store.path
    store.close()
    assert interiors
    flip_bit(path, interiors[0] + 12, 3)
    assert_reads_fail_at(shard_dir, interiors[0], b"k0", interiors[0] + 12)


def test_a_flipped_bit_in_a_value_chunk_is_reported_at_its_offset(shard_dir: str) -> None:
    store = open_store(shard_dir)
    store.commit([Put(b"large", b"L" * 5000)])
    store.commit([Put(b"last", b"commit")])
    entry = store.get(b"large")
    assert entry is not None
    assert entry.flags & fmt.FLAG_VALUE_OUT_OF_LINE
    found = btree.find_entry(store.current_file().reader, store.header.root, entry.seq)
    assert found is not None
    value_pos = found[0].vals[found[1]]
    path = store.path
    store.close()
    flip_bit(path, value_pos + 4000, 5)
    assert_reads_fail_at(shard_dir, value_pos, b"large", value_pos + 4000)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open descriptors")
def test_an_open_that_meets_corruption_keeps_nothing_open(shard_dir: str) -> None:
    """Regression: an open that failed while rebuilding derived state (a damaged leaf) left the
    data file, the successor map and the lmdb environment open; retries leaked them again."""
    store = open_store(shard_dir)
    store.commit([Put(b"k%d" % n, bytes([n]) * 1500) for n in range(12)])
    store.commit([Put(b"last", b"commit")])
    leaf = next(pos for pos, height in old_nodes(store) if height == 1)
    path = store.path
    store.close()
    flip_bit(path, leaf + 20)
    shutil.rmtree(os.path.join(shard_dir, "derived"))  # open has to read every leaf
    descriptors = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(CorruptionError) as caught:
            open_store(shard_dir)
        assert caught.value.offset == leaf
    assert len(os.listdir("/proc/self/fd")) == descriptors
    flip_bit(path, leaf + 20)  # repaired
    store = open_store(shard_dir)
    try:
        assert store.recovery.rebuilt_index
        assert len(store.scan()) == 13
    finally:
        store.close()


@pytest.mark.parametrize(
    "where",
    ["header type byte", "header chunk", "commit body", "commit padding"],
)
def test_a_flipped_bit_in_the_last_commit_falls_back_to_the_previous_one(
    shard_dir: str, where: str
) -> None:
    """Documented behaviour: a header is only trusted if its chunk CRC and its region's CRC
    check out, so damage anywhere in the last commit (its header, or the bytes its region_crc
    covers) cannot be told from a torn commit. Open steps back to the previous valid header,
    moves the bytes after it to ``.tail`` and reports that in ``store.recovery``: the last
    commit is lost (the only one a single flip can lose), everything before it is intact, and
    the store commits on. Damage to older commits is found when they are read (see above)."""
    store, before = committed_store(shard_dir)
    size_before = store.file_bytes()
    store.commit(NEXT_BATCH, meta=NEXT_META)
    last_header_block = (store.file_bytes() - 1) // fmt.BLOCK * fmt.BLOCK
    assert store.header.region_start == size_before
    path = store.path
    store.close()
    offset = {
        "header type byte": last_header_block,
        "header chunk": last_header_block + 30,
        "commit body": size_before + 10,
        "commit padding": last_header_block - 1,
    }[where]
    flip_bit(path, offset, 6)
    store = open_store(shard_dir)
    try:
        assert observe(store) == before
        assert store.recovery.dropped_from == size_before
        assert store.recovery.dropped_bytes > 0
        assert "header" in store.recovery.reason
        assert os.path.getsize(path + ".tail") == store.recovery.dropped_bytes
        store.commit([Put(b"omega", b"after")])
        assert store.get(b"omega") is not None
    finally:
        store.close()


def test_a_flipped_bit_in_the_metadata_chunk_fails_open_at_its_offset(shard_dir: str) -> None:
    """The current metadata chunk is read at open; if it is damaged (and not part of the last
    commit, which recovery would drop) open fails naming its offset."""
    store, _ = committed_store(shard_dir)  # the first commit wrote the metadata
    meta_pos = store.header.meta
    assert 0 <= meta_pos < store.header.region_start
    path = store.path
    store.close()
    flip_bit(path, meta_pos + 9, 1)
    with pytest.raises(CorruptionError) as caught:
        open_store(shard_dir)
    assert caught.value.offset == meta_pos


def test_a_file_without_any_valid_header_does_not_open(shard_dir: str) -> None:
    store, _ = committed_store(shard_dir)
    path = store.path
    store.close()
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        for block in range(0, size, fmt.BLOCK):
            handle.seek(block)
            if handle.read(1) == b"\x01":
                handle.seek(block + 5)
                handle.write(b"\xff")  # inside the header chunk's CRC field
    with pytest.raises(CorruptionError) as caught:
        open_store(shard_dir)
    assert caught.value.offset >= 0


# --- full disk and failed fsync -------------------------------------------------------------------


@pytest.mark.parametrize("space_left_bytes", [0, 1, 100, 4096, 4500])
def test_a_full_disk_fails_the_commit_cleanly(shard_dir: str, space_left_bytes: int) -> None:
    """ENOSPC partway through a commit's write: DiskFullError, the file is cut back to its old
    length, nothing changed; once space returns commits succeed and all of it survives reopen."""
    faulty = FaultyFileOps()
    store, before = committed_store(shard_dir, faulty)
    size = store.file_bytes()
    faulty.space_left_bytes = space_left_bytes
    for _ in range(2):
        with pytest.raises(DiskFullError):
            store.commit(LARGE_BATCH, meta=NEXT_META)
        assert store.file_bytes() == size
        assert os.path.getsize(store.path) == size
        assert observe(store) == before
    faulty.space_left_bytes = None
    store.commit(LARGE_BATCH, meta=NEXT_META)
    after = observe(store)
    assert after.stats["last_seq"] == before.stats["last_seq"] + len(LARGE_BATCH)
    store.close()
    store = open_store(shard_dir)
    try:
        assert observe(store) == after
        assert store.recovery.dropped_bytes == 0
    finally:
        store.close()


def test_a_failed_fsync_poisons_the_store_until_reopened(shard_dir: str) -> None:
    """fsyncgate: after a failed fsync the page cache's state is unknown. The commit fails with
    StorageError, every later call raises StoreClosedError, and a reopen runs recovery; with
    the unsynced pages lost it finds exactly the previous state."""
    faulty = FaultyFileOps()
    store, before = committed_store(shard_dir, faulty)
    faulty.fail_next_sync = True
    with pytest.raises(StorageError) as caught:
        store.commit(NEXT_BATCH, meta=NEXT_META)
    assert not isinstance(caught.value, (StoreClosedError, DiskFullError))
    with pytest.raises(StoreClosedError):
        store.commit([Put(b"omega", b"1")])
    with pytest.raises(StoreClosedError):
        store.get(b"alpha")
    with pytest.raises(StoreClosedError):
        store.scan()
    with pytest.raises(StoreClosedError):
        store.snapshot()
    with pytest.raises(StoreClosedError):
        store.rollback_to(1)
    store.close()
    faulty.crash()
    store = open_store(shard_dir)
    try:
        assert observe(store) == before
        store.commit(NEXT_BATCH, meta=NEXT_META)
        assert store.meta == NEXT_META
    finally:
        store.close()


def test_a_failed_fsync_may_still_have_reached_the_disk(shard_dir: str) -> None:
    """Without the power cut the unsynced commit may be durable after all: reopen shows either
    the old or the new state, whole."""
    faulty = FaultyFileOps()
    store, before = committed_store(shard_dir, faulty)
    faulty.fail_next_sync = True
    with pytest.raises(StorageError):
        store.commit(NEXT_BATCH, meta=NEXT_META)
    store.close()
    store = open_store(shard_dir)
    try:
        state = observe(store)
        if state != before:
            assert state.meta == NEXT_META
            assert state.stats["last_seq"] == before.stats["last_seq"] + len(NEXT_BATCH)
    finally:
        store.close()


# --- leftovers on open ("A shard store is one directory") ---------------------------------------


def test_open_removes_unfinished_files_and_old_generations(shard_dir: str) -> None:
    store, before = committed_store(shard_dir)
    path = store.path
    store.close()
    newer = os.path.join(shard_dir, "data.2.kys")
    shutil.copyfile(path, newer)
    for leftover in ("data.3.kys.compact", "data.2.kys.init"):
        with open(os.path.join(shard_dir, leftover), "wb") as handle:
            handle.write(b"\x00" * 100)
    store = open_store(shard_dir)
    try:
        assert store.path == newer
        assert observe(store) == before
        assert sorted(n for n in os.listdir(shard_dir) if n.startswith("data.")) == ["data.2.kys"]
    finally:
        store.close()


def test_a_flipped_bit_in_a_leaf_inside_a_read_run_is_reported_at_its_offset(
    shard_dir: str,
) -> None:
    """Scans read sibling leaves in runs, one pread for many; damage to a leaf in the middle
    of a run is still found, and named by that leaf's offset, not the run's."""
    store = open_store(shard_dir)
    store.commit([Put(b"k%d" % n, bytes([n]) * 1500) for n in range(40)])
    store.commit([Put(b"last", b"commit")])
    leaves = [pos for pos, height in old_nodes(store) if height == 1]
    assert len(leaves) >= 3
    middle = leaves[len(leaves) // 2]
    leaf = store.current_file().reader.read_node(middle)
    assert isinstance(leaf, fmt.Leaf)
    path = store.path
    store.close()
    flip_bit(path, middle + 20)
    assert_reads_fail_at(shard_dir, middle, leaf.keys[0], middle + 20)
