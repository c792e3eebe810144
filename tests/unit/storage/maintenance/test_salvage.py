"""Salvage of a damaged shard store (docs/storage-format.md, "Salvage"): a bit flip in the middle
of the file, a truncated tail, a lost header, damage before the first header. After it the store
passes ``kayos check``, opens, and holds exactly a prefix of what was committed (never a wrong
value)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from kayos.storage import ShardStore
from kayos.storage.disk import format as fmt
from kayos.storage.disk.fileops import OS_FILEOPS
from kayos.storage.engine import find_last_header
from kayos.storage.maintenance.check import check_store, data_file_of
from kayos.storage.maintenance.salvage import DAMAGED_SUFFIX, salvage

pytestmark = pytest.mark.unit

COMMITS = 300


def _fill(path: Path) -> dict[int, bytes]:
    """COMMITS commits of 3 entries each; returns seq -> value."""
    written: dict[int, bytes] = {}
    with ShardStore.open(str(path)) as store:
        for commit in range(COMMITS):
            keys = [f"q\x00k{commit}-{i}".encode() for i in range(3)]
            values = [os.urandom(200) for _ in range(3)]
            result = store.commit_columns(keys, values, None, None)
            for offset, value in enumerate(values):
                written[result.first_seq + offset] = value
    return written


def _assert_prefix(path: Path, written: dict[int, bytes]) -> int:
    assert check_store(str(path)).ok, check_store(str(path)).problem
    with ShardStore.open(str(path)) as store:
        last = store.last_seq
        entries = store.scan(0, last)
    assert [e.seq for e in entries] == list(range(1, last + 1))
    for entry in entries:
        assert entry.value == written[entry.seq]
    return last


def _flip(path: Path, offset: int) -> None:
    data_path = data_file_of(str(path))
    with open(data_path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x10]))


def test_verified_store_is_left_alone(tmp_path: Path) -> None:
    written = _fill(tmp_path)
    assert salvage(str(tmp_path)) is None
    assert _assert_prefix(tmp_path, written) == len(written)


def test_bit_flip_mid_file_keeps_the_prefix_before_it(tmp_path: Path) -> None:
    written = _fill(tmp_path)
    data_path = data_file_of(str(tmp_path))
    size = os.path.getsize(data_path)
    # A data byte (not a block's type byte) in the middle of the file.
    offset = size // 2 // fmt.BLOCK * fmt.BLOCK + 100
    _flip(tmp_path, offset)
    assert not check_store(str(tmp_path)).ok
    report = salvage(str(tmp_path))
    assert report is not None
    assert not report.reset
    assert 0 < report.kept_seq < len(written)
    assert report.lost_from_offset >= 0
    assert _assert_prefix(tmp_path, written) == report.kept_seq
    assert os.path.getsize(data_path) <= offset
    assert os.path.getsize(data_path + DAMAGED_SUFFIX) == size - os.path.getsize(data_path)


def test_truncated_tail_is_cut_to_the_last_whole_commit(tmp_path: Path) -> None:
    written = _fill(tmp_path)
    data_path = data_file_of(str(tmp_path))
    os.truncate(data_path, os.path.getsize(data_path) - 3 * fmt.BLOCK - 17)
    salvage(str(tmp_path))  # the engine alone would cut the torn tail; either way a prefix
    kept = _assert_prefix(tmp_path, written)
    assert 0 < kept < len(written)


def test_lost_last_header_falls_back_to_the_one_before(tmp_path: Path) -> None:
    written = _fill(tmp_path)
    handle = OS_FILEOPS.open(data_file_of(str(tmp_path)))
    try:
        block, _ = find_last_header(handle)
    finally:
        handle.close()
    with open(data_file_of(str(tmp_path)), "r+b") as raw:
        raw.seek(block)
        raw.write(b"\x00" * 64)
    salvage(str(tmp_path))
    kept = _assert_prefix(tmp_path, written)
    assert kept == len(written) - 3


def test_damage_before_the_first_header_starts_empty(tmp_path: Path) -> None:
    _fill(tmp_path)
    _flip(tmp_path, 0)  # the first header block's type byte
    report = salvage(str(tmp_path))
    assert report is not None
    assert report.reset
    with ShardStore.open(str(tmp_path)) as store:
        assert store.last_seq == 0
    assert check_store(str(tmp_path)).ok


@pytest.mark.parametrize("seed", [random.randrange(2**32) for _ in range(3)])
def test_random_flips_never_leave_a_wrong_value(tmp_path: Path, seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    written = _fill(tmp_path)
    size = os.path.getsize(data_file_of(str(tmp_path)))
    for _ in range(3):
        _flip(tmp_path, rng.randrange(size))
    salvage(str(tmp_path))
    _assert_prefix(tmp_path, written)


def test_a_broken_derived_index_is_rebuilt_not_salvaged(tmp_path: Path) -> None:
    written = _fill(tmp_path)
    index = tmp_path / "derived" / "index.lmdb"
    for name in os.listdir(index):
        (index / name).write_bytes(b"not lmdb at all")
    report = salvage(str(tmp_path))
    assert report is not None
    assert not report.reset
    assert report.cut_bytes == 0
    assert report.kept_seq == len(written)
    assert _assert_prefix(tmp_path, written) == len(written)
