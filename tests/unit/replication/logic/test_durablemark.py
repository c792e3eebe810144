"""The durable mark beside a store (docs/storage-format.md, "Beside the store (`durable-mark`)"):
its bytes, its reading of damaged files, and the decision made on open."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from kayos.replication.logic import durablemark

pytestmark = pytest.mark.unit

GOLDEN_BODY = bytes.fromhex("4b59444d01000000c052010000000000")


def test_golden_bytes() -> None:
    raw = durablemark.encode(86720)
    assert raw == GOLDEN_BODY + zlib.crc32(GOLDEN_BODY).to_bytes(4, "little")
    assert durablemark.decode(raw) == 86720


@pytest.mark.parametrize(
    "mangle",
    [
        lambda raw: raw[:-1],
        lambda raw: raw + b"\x00",
        lambda raw: b"KYDN" + raw[4:],
        lambda raw: raw[:4] + b"\x02" + raw[5:],
        lambda raw: raw[:10] + bytes([raw[10] ^ 1]) + raw[11:],
        lambda raw: b"",
    ],
)
def test_a_damaged_mark_reads_as_nothing_known(mangle: object) -> None:
    assert callable(mangle)
    assert durablemark.decode(mangle(durablemark.encode(86720))) == 0


def test_recovered_below_the_mark_is_cut_short() -> None:
    problem = durablemark.cut_short(86720, 59126)
    assert problem is not None
    assert "59126" in problem
    assert "below its durable mark 86720" in problem
    assert "27594 entries lost" in problem
    assert durablemark.cut_short(86720, 86720) is None
    assert durablemark.cut_short(86720, 90000) is None
    assert durablemark.cut_short(0, 0) is None


def test_write_then_read(tmp_path: Path) -> None:
    assert durablemark.read(str(tmp_path)) == 0
    durablemark.write(str(tmp_path), 5)
    durablemark.write(str(tmp_path), 700)
    assert durablemark.read(str(tmp_path)) == 700
    assert sorted(os.listdir(tmp_path)) == [durablemark.DURABLE_MARK_FILE]


def test_a_store_that_ran_alone_knows_all_it_holds_committed() -> None:
    """A chain of one acknowledged every seq once durable: the open raises the mark to the last
    seq even where the commit point (0 at a re-made head) says less; otherwise it is what the
    store holds of the commit point."""
    assert durablemark.known_on_open(0, 120, ran_alone=True) == 120
    assert durablemark.known_on_open(0, 120, ran_alone=False) == 0
    assert durablemark.known_on_open(150, 120, ran_alone=False) == 120
    assert durablemark.known_on_open(100, 120, ran_alone=False) == 100
