"""Kestrel journals replayed by ``kestrel_compat.migration.journal``: journals built byte by byte
from the format in docs/migrating-from-kestrel.md section 1, one case per replay rule of sections
2-3."""

from __future__ import annotations

import struct

import pytest

from kestrel_compat.migration import journal
from kestrel_compat.migration.journal import (
    JournalCorrupt,
    JournalItem,
    plan_directory,
    replay_files,
)

pytestmark = pytest.mark.unit


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


# The golden records of the docs, byte for byte.
ADDX_HI = h("02 12000000 e803000000000000 0000000000000000 6869")
ADD_A = h("00 05000000 00000000 61")
REMOVE_TENTATIVE_7 = h("03 07000000")
CONFIRM_REMOVE_7 = h("06 07000000")
STATE_DUMP_9_1 = h("08 09000000 01000000")


def addx(data: bytes, add_ms: int = 1000, expiry_ms: int = 0) -> bytes:
    """An ADDX record written by hand from the format (not with the module's writer)."""
    return (
        b"\x02" + struct.pack("<i", 16 + len(data)) + struct.pack("<qq", add_ms, expiry_ms) + data
    )


def op_xid(opcode: int, xid: int) -> bytes:
    return bytes([opcode]) + struct.pack("<i", xid)


def values(items: list[JournalItem]) -> list[bytes]:
    return [item.data for item in items]


def test_writers_give_the_golden_bytes_of_the_docs() -> None:
    assert journal.addx(b"hi", 1000) == ADDX_HI
    assert journal.add(b"a") == ADD_A
    assert journal.remove_tentative(7) == REMOVE_TENTATIVE_7
    assert journal.confirm_remove(7) == CONFIRM_REMOVE_7
    assert journal.state_dump(9, 1) == STATE_DUMP_9_1
    assert journal.remove() == b"\x01"
    assert journal.save_xid(3) == h("04 03000000")
    assert journal.unremove(3) == h("05 03000000")
    assert journal.add_xid(2, b"z", 5, 6) == h(
        "07 02000000 11000000 0500000000000000 0600000000000000 7a"
    )


def test_add_and_addx_carry_times_and_expiry() -> None:
    replay = replay_files(
        "q",
        [("q", ADDX_HI + h("00 06000000 10270000 6263") + addx(b"x", 7, 9_000) + ADD_A)],
    )
    assert replay.finish() == [
        JournalItem(b"hi", 1000, None),
        JournalItem(b"bc", None, 10_000_000),  # ADD: expiry 0x2710 = 10000 s, no add time
        JournalItem(b"x", 7, 9_000),
        JournalItem(b"a", None, None),
    ]
    assert replay.records == 4
    assert replay.warnings == []


def test_remove_takes_the_head_and_does_nothing_on_an_empty_queue() -> None:
    data = b"\x01" + addx(b"1") + addx(b"2") + b"\x01" + addx(b"3")
    assert values(replay_files("q", [("q", data)]).finish()) == [b"2", b"3"]


def test_open_confirm_and_abort() -> None:
    data = (
        addx(b"1")
        + addx(b"2")
        + addx(b"3")
        + op_xid(3, 1)  # open 1 -> xid 1
        + op_xid(3, 2)  # open 2 -> xid 2
        + op_xid(6, 1)  # confirm xid 1: "1" is gone
        + op_xid(5, 2)  # abort xid 2: "2" back at the head
    )
    replay = replay_files("q", [("q", data)])
    assert values(replay.finish()) == [b"2", b"3"]
    assert replay.xid == 2
    assert replay.open == {}


def test_reads_open_at_shutdown_return_to_the_head_lowest_xid_first() -> None:
    data = addx(b"1") + addx(b"2") + addx(b"3") + addx(b"4") + op_xid(3, 10) + op_xid(3, 11)
    data += op_xid(3, 12) + op_xid(6, 11)  # "2" confirmed; "1" and "3" stay open
    assert values(replay_files("q", [("q", data)]).finish()) == [b"1", b"3", b"4"]


def test_unknown_xids_are_ignored_with_a_warning() -> None:
    replay = replay_files("q", [("q", addx(b"1") + op_xid(6, 99) + op_xid(5, 98))])
    assert values(replay.finish()) == [b"1"]
    assert [w.split(": ", 1)[1] for w in replay.warnings] == [
        "CONFIRM_REMOVE of unknown xid 99, ignored",
        "UNREMOVE of unknown xid 98, ignored",
    ]
    assert replay.warnings[0].startswith("q at offset 22")


def test_a_rewritten_file_save_xid_state_dump_add_xid() -> None:
    # What Kestrel writes when it rewrites or packs: the xid, the open reads, the queue.
    data = (
        op_xid(4, 40)
        + STATE_DUMP_9_1
        + journal_add_xid(41, b"open-a")
        + op_xid(3, 41)
        + addx(b"queued")
        + op_xid(6, 41)  # the open read is confirmed after the rewrite
        + addx(b"later")
    )
    replay = replay_files("q", [("q", data)])
    assert values(replay.finish()) == [b"queued", b"later"]
    assert replay.xid == 41
    assert replay.records == 7


def journal_add_xid(xid: int, data: bytes, add_ms: int = 1, expiry_ms: int = 0) -> bytes:
    return (
        b"\x07"
        + struct.pack("<ii", xid, 16 + len(data))
        + struct.pack("<qq", add_ms, expiry_ms)
        + data
    )


def test_add_xid_open_at_shutdown_goes_back_to_the_head() -> None:
    data = addx(b"queued") + journal_add_xid(5, b"was-open") + op_xid(3, 5)
    # REMOVE_TENTATIVE takes the head ("queued"), as Kestrel's replay does: a rewritten file
    # always writes the open reads first, on an empty queue.
    replay = replay_files(
        "q",
        [("q", op_xid(4, 4) + journal_add_xid(5, b"was-open") + op_xid(3, 5) + addx(b"queued"))],
    )
    assert values(replay.finish()) == [b"was-open", b"queued"]
    assert values(replay_files("q", [("q", data)]).finish()) == [b"queued", b"was-open"]


def test_rotation_order_packs_and_temporary_files() -> None:
    names = [
        "cars",
        "cars.950",
        "cars.904",
        "cars.1000",
        "cars.950.pack",
        "cars.900.pack",
        "cars~~tmp",
        "cars.951~~",
        "vans.17",
        "vans",
        "bikes.3",
        "cars+red",
        "junk.abc",
        "trucks.5.gz",
    ]
    plan = plan_directory(names)
    assert plan.queues["cars"].files == ("cars.950.pack", "cars.1000", "cars")
    assert set(plan.queues["cars"].superseded) == {"cars.900.pack", "cars.904", "cars.950"}
    assert plan.queues["vans"].files == ("vans.17", "vans")
    assert plan.queues["bikes"].files == ("bikes.3",)
    assert plan.queues["cars+red"].files == ("cars+red",)
    assert sorted(plan.queues) == ["bikes", "cars", "cars+red", "vans"]
    assert sorted(plan.warnings) == [
        "junk.abc: not a journal file name, ignored",
        "trucks.5.gz: not a journal file name, ignored",
    ]


def test_timestamps_order_numerically_not_by_name() -> None:
    assert plan_directory(["q.10", "q.9", "q"]).queues["q"].files == ("q.9", "q.10", "q")


def test_files_replay_as_one_contiguous_journal() -> None:
    replay = replay_files(
        "q",
        [
            ("q.1", addx(b"1") + addx(b"2") + op_xid(3, 1)),
            ("q.2", addx(b"3") + op_xid(6, 1) + b"\x01"),
            ("q", addx(b"4")),
        ],
    )
    assert values(replay.finish()) == [b"3", b"4"]


def test_a_torn_tail_is_reported_and_skipped() -> None:
    torn = addx(b"never-finished")[:-3]
    replay = replay_files("q", [("q.5", addx(b"1") + torn), ("q", addx(b"2") + torn[:2])])
    assert values(replay.finish()) == [b"1", b"2"]
    assert replay.warnings == [
        "q.5 at offset 22: torn tail (ADDX record cut off after 32 bytes), skipped",
        "q at offset 22: torn tail (ADDX record cut off after 2 bytes), skipped",
    ]


def test_a_corrupt_record_in_the_middle_names_file_and_offset() -> None:
    with pytest.raises(JournalCorrupt) as error:
        replay_files("q", [("q.1", addx(b"ok")), ("q", addx(b"1") + b"\x2a" + addx(b"2"))])
    assert error.value.path == "q"
    assert error.value.offset == 22
    assert "unknown opcode 42" in str(error.value)
    assert error.value.code == "kestrel_journal_corrupt"


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (h("02 0f000000") + bytes(15), "ADDX with size 15"),
        (h("00 03000000 000000"), "ADD with size 3"),
        (h("07 01000000 ffffffff"), "ADD_XID with size -1"),
        (h("02 ffffff7f"), "ADDX with size 2147483647"),
    ],
)
def test_impossible_sizes_are_corrupt(record: bytes, message: str) -> None:
    with pytest.raises(JournalCorrupt, match=message) as error:
        replay_files("q", [("q", addx(b"1") + record + addx(b"2"))])
    assert error.value.offset == 22


def test_chunking_does_not_change_the_result() -> None:
    data = op_xid(4, 1) + ADD_A + ADDX_HI + op_xid(3, 2) + addx(b"z" * 300) + op_xid(5, 2)
    data += STATE_DUMP_9_1 + journal_add_xid(3, b"x") + op_xid(3, 3) + b"\x01"
    whole = replay_files("q", [("q", data)])
    for step in (1, 2, 3, 7, 64):
        replay = journal.JournalReplay("q")
        replay.begin_file("q")
        for start in range(0, len(data), step):
            replay.feed(data[start : start + step])
        replay.end_file()
        assert replay.finish() == whole.finish(), step
        assert replay.records == whole.records
        assert replay.warnings == []


def test_an_empty_file_and_an_empty_queue() -> None:
    replay = replay_files("q", [("q", b"")])
    assert replay.finish() == []
    assert replay.warnings == []
