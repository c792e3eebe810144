"""The checks of ``kayos check`` made on a data file's bytes as they arrive (``StreamCheck``,
docs/replication-protocol.md, "Store snapshots": "Verified as it arrives"): a whole file fed in
any pieces verifies to its end, a changed byte never gets below the verified offset, and a check
resumed at a verified offset goes on to the end."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from kayos.clock import ManualClock
from kayos.errors import CorruptionError
from kayos.storage.engine import Delete, Put, ShardStore
from kayos.storage.maintenance.compact import compact
from kayos.storage.maintenance.streamcheck import StreamCheck

pytestmark = pytest.mark.unit


@pytest.fixture
def rng() -> random.Random:
    value = int(os.environ.get("KAYOS_TEST_SEED") or random.SystemRandom().randrange(2**32))
    print(f"seed={value} (replay with KAYOS_TEST_SEED={value})")
    return random.Random(value)


def _store_bytes(path: Path, *, compacted: bool) -> tuple[bytes, int]:
    """A store's file up to its last header (big values out of line, deletes, metadata, a
    rollback, and a compaction when ``compacted``), and that header's last seq."""
    store = ShardStore.open(str(path), clock=ManualClock())
    try:
        for n in range(25):
            ops: list[Put | Delete] = [
                Put(b"k%04d" % (n * 10 + i), b"v" * (9000 if i == 0 else 300)) for i in range(10)
            ]
            if n % 3 == 2:
                ops.append(Delete(b"k%04d" % (n * 10 - 5)))
            store.commit(ops, meta={"takeover": b"t%d" % n})
        if compacted:
            compact(store)
        for n in range(25, 30):
            store.commit([Put(b"k%04d" % (n * 10 + i), b"w" * 200) for i in range(10)])
        store.rollback_to(store.last_seq - 5)
        store.commit([Put(b"after", b"x")])
        data_file, header, end = store.pin_prefix()
        try:
            return data_file.handle.pread(end, 0), header.last_seq
        finally:
            data_file.release()
    finally:
        store.close()


def _feed(check: StreamCheck, data: bytes, rng: random.Random, start: int = 0) -> None:
    pos = start
    while pos < len(data):
        size = rng.choice([1, 3, 100, 4095, 4097, 70000])
        check.feed(data[pos : pos + size])
        pos += size


@pytest.mark.parametrize("compacted", [False, True])
def test_a_whole_file_fed_in_any_pieces_verifies_to_its_end(
    tmp_path: Path, rng: random.Random, compacted: bool
) -> None:
    data, last_seq = _store_bytes(tmp_path, compacted=compacted)
    check = StreamCheck()
    _feed(check, data, rng)
    assert check.verified == check.received == len(data)
    assert check.header is not None
    assert check.header.last_seq == last_seq


@pytest.mark.parametrize("compacted", [False, True])
def test_a_changed_byte_never_gets_below_the_verified_offset(
    tmp_path: Path, rng: random.Random, compacted: bool
) -> None:
    data, _ = _store_bytes(tmp_path, compacted=compacted)
    for _ in range(60):
        where = rng.randrange(len(data))
        changed = bytearray(data)
        changed[where] ^= 1 << rng.randrange(8)
        check = StreamCheck()
        caught = None
        pos = 0
        while pos < len(changed) and caught is None:
            size = rng.choice([1, 4097, 70000])
            try:
                check.feed(bytes(changed[pos : pos + size]))
            except CorruptionError as exc:
                caught = exc
            assert check.verified <= where
            pos += size
        # Found as it came, or (a header block's type byte changed: that header is missed) the
        # copy's end is never verified.
        assert caught is not None or check.verified < len(data), f"byte {where} changed"
        if caught is not None:
            with pytest.raises(CorruptionError):
                check.feed(b"")  # stays failed


def test_a_check_resumed_at_a_verified_offset_goes_on_to_the_end(
    tmp_path: Path, rng: random.Random
) -> None:
    data, _ = _store_bytes(tmp_path, compacted=False)
    first = StreamCheck()
    first.feed(data[: rng.randrange(len(data) // 4, len(data) // 2)])
    assert 0 < first.verified < len(data)
    assert first.header is not None
    second = StreamCheck()
    second.resume(first.verified, first.header, first.header_block, first.header_crc)
    _feed(second, data, rng, start=first.verified)
    assert second.verified == len(data)


def test_bytes_that_are_no_store_fail_at_once() -> None:
    with pytest.raises(CorruptionError, match="block type byte"):
        StreamCheck().feed(b"\x07" + bytes(100))
    with pytest.raises(CorruptionError, match="impossible chunk length"):
        StreamCheck().feed(bytes(4096))
