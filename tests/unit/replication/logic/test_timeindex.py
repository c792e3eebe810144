"""The replica's sampled time index (kayos/replication/logic/timeindex.py) with a manual clock:
sampling, the size bound, the floor lookup, the file round trip and what a bad file reads as."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kayos.clock import ManualClock
from kayos.replication.logic import timeindex
from kayos.replication.logic.timeindex import TIME_INDEX_FILE, TimeIndex

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from pathlib import Path


def ms(clock: ManualClock) -> int:
    return int(clock.now_s() * 1000)


def test_one_sample_per_interval_and_floor_lookup() -> None:
    clock = ManualClock()
    index = TimeIndex(interval_ms=1000, samples_max=16)
    start = ms(clock)
    index.note(1, 10, clock.now_s())  # a sample: the first batch
    clock.advance(0.4)
    index.note(11, 20, clock.now_s())  # same interval: no sample
    clock.advance(0.7)
    index.note(21, 21, clock.now_s())  # 1.1 s after the sample: a new one
    assert index.samples() == [(1, start), (21, start + 1100)]
    assert index.time_of(1) == start
    assert index.time_of(15) == start  # at most one interval early (accepted at +400 ms)
    assert index.time_of(21) == start + 1100
    assert index.time_of(22) is None, "past what was noted: unknown"
    assert index.time_of(0) is None, "older than the index: unknown"


def test_unknown_marker_covers_until_the_next_note() -> None:
    clock = ManualClock()
    index = TimeIndex(interval_ms=1000, samples_max=16)
    index.note(1, 5, clock.now_s())
    index.unknown_from(6, 8)  # a catch-up: these seqs are old
    index.unknown_from(9, 11)  # still unknown: no second marker
    clock.advance(0.1)
    index.note(12, 12, clock.now_s())  # live again: sampled at once, whatever the interval
    assert index.samples() == [(1, ms(clock) - 100), (6, None), (12, ms(clock))]
    assert index.time_of(5) == ms(clock) - 100
    assert index.time_of(8) is None
    assert index.time_of(11) is None
    assert index.time_of(12) == ms(clock)


def test_size_bound_drops_the_oldest_quarter() -> None:
    clock = ManualClock()
    index = TimeIndex(interval_ms=10, samples_max=8)
    for seq in range(1, 10):
        index.note(seq, seq, clock.now_s())
        clock.advance(0.01)
    assert len(index) == 7, "at 8 samples the oldest 2 went, then the 9th came"
    assert [seq for seq, _ in index.samples()] == [3, 4, 5, 6, 7, 8, 9]
    assert index.time_of(2) is None, "older than the index now"
    assert index.time_of(3) is not None


def test_truncate_and_reused_seqs() -> None:
    clock = ManualClock()
    index = TimeIndex(interval_ms=10, samples_max=16)
    for seq in (1, 5, 9):
        index.note(seq, seq + 3, clock.now_s())
        clock.advance(0.02)
    index.truncate_after(6)  # a rollback to 6
    assert [seq for seq, _ in index.samples()] == [1, 5]
    assert index.through == 6
    assert index.time_of(7) is None
    index.note(7, 7, clock.now_s())  # the new history's 7
    assert index.time_of(7) == ms(clock)
    index.note(3, 3, clock.now_s() + 1)  # a seq that goes back drops what came after it
    assert [seq for seq, _ in index.samples()] == [1, 3]
    assert index.through == 3


def test_file_round_trip(tmp_path: Path) -> None:
    clock = ManualClock()
    index = TimeIndex()
    for seq in range(1, 200, 10):
        index.note(seq, seq + 9, clock.now_s())
        clock.advance(1.5)
    index.unknown_from(200, 200)
    assert index.dirty
    timeindex.write(str(tmp_path), index.encode())
    assert not index.dirty
    loaded = timeindex.load(str(tmp_path), last_seq=200)
    assert loaded.samples() == index.samples()
    assert loaded.through == 200
    assert not loaded.dirty


def test_load_fits_the_index_to_the_store(tmp_path: Path) -> None:
    clock = ManualClock()
    index = TimeIndex(interval_ms=1000)
    index.note(1, 10, clock.now_s())
    timeindex.write(str(tmp_path), index.encode())
    # The store went on past the file (a crash before the next write): those seqs are unknown.
    ahead = timeindex.load(str(tmp_path), last_seq=15)
    assert ahead.time_of(10) == ms(clock)
    assert ahead.time_of(11) is None
    assert ahead.time_of(15) is None
    assert ahead.through == 15
    # The store holds less than the file (rolled back): the samples past it go.
    behind = timeindex.load(str(tmp_path), last_seq=0)
    assert len(behind) == 0
    assert behind.time_of(1) is None


@pytest.mark.parametrize(
    "damage",
    ["missing", "empty", "torn", "flipped", "foreign", "count_lies"],
)
def test_a_bad_file_reads_as_an_empty_index(tmp_path: Path, damage: str) -> None:
    clock = ManualClock()
    index = TimeIndex()
    for seq in range(1, 50, 7):
        index.note(seq, seq + 6, clock.now_s())
        clock.advance(2)
    raw = index.encode()
    path = tmp_path / TIME_INDEX_FILE
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "torn":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        path.write_bytes(raw[:20] + bytes([raw[20] ^ 1]) + raw[21:])
    elif damage == "foreign":
        path.write_bytes(b"not a time index at all" * 4)
    elif damage == "count_lies":
        path.write_bytes(raw + raw[-16:])
    loaded = timeindex.load(str(tmp_path), last_seq=55)
    assert len(loaded) == 0
    assert loaded.time_of(1) is None
    assert loaded.time_of(55) is None
    # It goes on as an empty index: the next batch is sampled.
    loaded.note(56, 56, clock.now_s())
    assert loaded.time_of(56) == ms(clock)
    assert loaded.time_of(55) is None


def test_golden_bytes_of_the_file() -> None:
    """The layout docs/storage-format.md ("Beside the store") gives, byte for byte."""
    index = TimeIndex(interval_ms=1000)
    index.note(1, 3, 1.0)  # seqs 1..3 at 1000 ms
    index.unknown_from(4, 5)  # 4..5 caught up on: unknown
    golden = bytes.fromhex(
        "4b595449"
        "01"
        "000000"  # magic "KYTI", version 1, pad
        "0500000000000000"
        "02000000"  # through_seq 5, count 2
        "0100000000000000"
        "e803000000000000"  # (1, 1000 ms)
        "0400000000000000"
        "ffffffffffffffff"  # (4, -1: unknown)
        "77e72d9c"  # crc32 of the above
    )
    assert index.encode() == golden
    assert TimeIndex.decode(golden).samples() == [(1, 1000), (4, None)]
