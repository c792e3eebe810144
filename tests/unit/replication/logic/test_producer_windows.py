"""The window rules of idempotent producers (kayos/replication/logic/producers.py;
docs/node-api.md, "Idempotent producers"; docs/replication-protocol.md, "Producer windows"): a
call written is found with its seqs, a new one is written, one below a full window is refused;
the metadata a batch carries, byte for byte; the bound on producers; a table read back from a
store's metadata."""

from __future__ import annotations

import msgpack
import pytest

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.replication.logic.producers import (
    ProducerTable,
    check_producer,
    meta_key,
    pack_window,
    unpack_window,
)

pytestmark = pytest.mark.unit

P = bytes(range(16))
Q = bytes(range(16, 32))
R = bytes(range(32, 48))

# docs/replication-protocol.md, "Producer windows": P's calls 5 (seqs 101-102) and 6 (seq 103).
GOLDEN_META = (
    "81 d925 70726f642f 3030303130323033303430353036303730383039306130623063306430653066"
    " c430 0000000000000005 0000000000000065 0000000000000066"
    " 0000000000000006 0000000000000067 0000000000000067"
)


def test_the_meta_a_batch_carries_matches_the_protocol_document() -> None:
    table = ProducerTable()
    table.record(P, 5, 101, 102)
    changes = table.record(P, 6, 103, 103)
    assert list(changes) == ["prod/000102030405060708090a0b0c0d0e0f"]
    assert msgpack.packb(changes, use_bin_type=True).hex() == bytes.fromhex(GOLDEN_META).hex()


def test_a_written_call_is_found_with_its_seqs_and_a_new_one_is_not() -> None:
    table = ProducerTable()
    assert table.lookup(P, 1) is None  # a producer the table does not know: write it
    table.record(P, 1, 10, 12)
    assert table.lookup(P, 1) == (10, 12)
    assert table.lookup(P, 2) is None
    assert table.lookup(Q, 1) is None  # another producer's call 1 is its own


def test_below_a_window_that_is_not_full_a_call_is_new() -> None:
    # Nothing was ever dropped from the window, so a call it lacks was never written.
    table = ProducerTable(window_entries=4)
    table.record(P, 7, 1, 1)
    assert table.lookup(P, 3) is None
    table.record(P, 3, 2, 2)  # calls may arrive out of order
    assert table.window(P) == [(3, 2, 2), (7, 1, 1)]


def test_below_a_full_window_a_call_is_too_old_to_tell() -> None:
    table = ProducerTable(window_entries=3)
    for call in (4, 5, 6):
        table.record(P, call, call * 10, call * 10)
    with pytest.raises(
        InvalidRequest, match=r"producer_seq_too_old: .* call 3 is below .*\(4\.\.6\)"
    ):
        table.lookup(P, 3)
    assert table.lookup(P, 4) == (40, 40)  # the lowest entry is still known
    assert table.lookup(P, 9) is None  # above it: new, gaps allowed


def test_the_window_keeps_the_highest_calls() -> None:
    table = ProducerTable(window_entries=3)
    for call in range(1, 6):
        changes = table.record(P, call, call, call)
    assert table.window(P) == [(3, 3, 3), (4, 4, 4), (5, 5, 5)]
    assert changes == {meta_key(P): pack_window(table.window(P))}
    table.record(P, 7, 8, 8)
    assert table.window(P) == [(4, 4, 4), (5, 5, 5), (7, 8, 8)]
    # A late call between the entries takes its place; the lowest goes.
    changes = table.record(P, 6, 9, 9)
    assert table.window(P) == [(5, 5, 5), (6, 9, 9), (7, 8, 8)]
    assert unpack_window(changes[meta_key(P)]) == table.window(P)


def test_a_full_window_is_as_long_as_the_bound_says() -> None:
    table = ProducerTable()
    for call in range(1, limits.producer_window_entries + 2):
        changes = table.record(P, call, call, call)
    value = changes[meta_key(P)]
    assert isinstance(value, bytes)
    assert len(value) == 24 * limits.producer_window_entries
    assert table.lookup(P, 2) == (2, 2)
    with pytest.raises(InvalidRequest, match="producer_seq_too_old"):
        table.lookup(P, 1)


def test_past_the_bound_the_producer_written_least_recently_is_forgotten() -> None:
    table = ProducerTable(producers_max=2)
    table.record(P, 1, 1, 1)
    table.record(Q, 1, 2, 2)
    table.record(P, 2, 3, 3)  # P is now the most recent
    changes = table.record(R, 1, 4, 4)
    assert changes == {meta_key(Q): None, meta_key(R): pack_window([(1, 4, 4)])}
    assert len(table) == 2
    assert table.window(Q) == []
    assert table.lookup(Q, 1) is None  # forgotten: a resend would be written again
    assert table.lookup(P, 1) == (1, 1)


def test_a_table_read_from_metadata_is_the_one_that_wrote_it() -> None:
    writer = ProducerTable(producers_max=2)
    meta: dict[str, object] = {"hwm/q/g": 7, "retain/q": b"x"}
    for producer, call, seq in ((P, 1, 1), (Q, 1, 2), (P, 2, 3), (Q, 2, 4)):
        for name, value in writer.record(producer, call, seq, seq).items():
            meta[name] = value
    reader = ProducerTable.from_meta(meta, seq_max=4, producers_max=2)
    assert reader.window(P) == writer.window(P) == [(1, 1, 1), (2, 3, 3)]
    assert reader.window(Q) == writer.window(Q)
    # Ordered by the last seq each got: P (3) was written before Q (4), so P goes first.
    assert reader.record(R, 1, 5, 5) == {meta_key(P): None, meta_key(R): pack_window([(1, 5, 5)])}


def test_entries_past_a_rollback_that_kept_the_map_are_left_out() -> None:
    meta = {meta_key(P): pack_window([(1, 1, 1), (2, 2, 3), (3, 4, 4)])}
    table = ProducerTable.from_meta(meta, seq_max=3)
    assert table.window(P) == [(1, 1, 1), (2, 2, 3)]
    assert table.lookup(P, 3) is None  # its seqs were dropped: written again
    assert len(ProducerTable.from_meta(meta, seq_max=0)) == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (meta_key(P), b""),
        (meta_key(P), b"\x00" * 23),
        (meta_key(P), 5),
        (meta_key(P), pack_window([(2, 1, 1), (2, 2, 2)])),  # calls not increasing
        (meta_key(P), pack_window([(1, 0, 0)])),  # seq 0
        (meta_key(P), pack_window([(1, 5, 4)])),  # an empty range
        ("prod/" + "zz" * 16, pack_window([(1, 1, 1)])),
        ("prod/" + P.hex().upper(), pack_window([(1, 1, 1)])),
        ("prod/" + P.hex()[:30], pack_window([(1, 1, 1)])),
        ("prod/" + P.hex()[:30] + " 0", pack_window([(1, 1, 1)])),
    ],
)
def test_a_malformed_window_in_the_metadata_is_ignored(name: str, value: object) -> None:
    table = ProducerTable.from_meta({name: value}, seq_max=100)
    assert len(table) == 0


@pytest.mark.parametrize(
    ("producer_id", "producer_seq", "match"),
    [
        (b"", 1, "producer_id must be 16 bytes, got 0"),
        (bytes(15), 1, "producer_id must be 16 bytes, got 15"),
        (bytes(17), 1, "producer_id must be 16 bytes, got 17"),
        ("0" * 16, 1, "producer_id must be 16 bytes, got str"),
        (P, -1, "producer_seq must be a u64"),
        (P, 2**64, "producer_seq must be a u64"),
    ],
)
def test_a_bad_producer_is_refused(producer_id: bytes, producer_seq: int, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        check_producer(producer_id, producer_seq)
    table = ProducerTable()
    with pytest.raises(InvalidRequest, match=match):  # nothing written, nothing recorded
        _written(table, producer_id, producer_seq)
    assert len(table) == 0


def _written(table: ProducerTable, producer_id: bytes, producer_seq: int) -> None:
    """What the head does with a call: look it up, and record it at seq 1 if it is new."""
    if table.lookup(producer_id, producer_seq) is None:
        table.record(producer_id, producer_seq, 1, 1)
