"""Kestrel journals replayed by ``kestrel_compat.migration.journal``: one case per opcode, against
the record bytes as Kestrel lays them out (docs/migrating-from-kestrel.md section 1, spelt out in
hex here), then the replay rules of section 2 and the queue directories of section 3."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kestrel_compat.migration import journal
from kestrel_compat.migration.journal import (
    JournalCorrupt,
    JournalItem,
    plan_directory,
    replay_files,
)
from kestrel_compat.migration.plan import plan, replay_queue

pytestmark = pytest.mark.unit


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


# The golden records of the docs, one per opcode, byte for byte.
ADD_A = h("00 05000000 00000000 61")
REMOVE = h("01")
ADDX_HI = h("02 12000000 e803000000000000 0000000000000000 6869")
ADDX_X_EXPIRING = h("02 11000000 e803000000000000 d007000000000000 78")
REMOVE_TENTATIVE = h("03")
SAVE_XID_7 = h("04 07000000")
UNREMOVE_7 = h("05 07000000")
CONFIRM_REMOVE_7 = h("06 07000000")
ADD_XID_7_HI = h("07 07000000 12000000 e803000000000000 0000000000000000 6869")
CONTINUE_7_HI = h("08 07000000 12000000 e803000000000000 0000000000000000 6869")
REMOVE_TENTATIVE_XID_7 = h("09 07000000")

HI = JournalItem(b"hi", 1000, None)


def addx(data: bytes, add_ms: int = 1000, expiry_ms: int = 0) -> bytes:
    """An ADDX record written by hand from the format (not with the module's writer)."""
    return (
        b"\x02" + struct.pack("<i", 16 + len(data)) + struct.pack("<qq", add_ms, expiry_ms) + data
    )


def xid_record(opcode: int, xid: int) -> bytes:
    return bytes([opcode]) + struct.pack("<i", xid)


def open_read(xid: int) -> bytes:
    """An ``/open`` as Kestrel 2.1 and later journal it: REMOVE_TENTATIVE_XID."""
    return xid_record(9, xid)


def confirm(xid: int) -> bytes:
    return xid_record(6, xid)


def abort(xid: int) -> bytes:
    return xid_record(5, xid)


def values(items: list[JournalItem]) -> list[bytes]:
    return [item.data for item in items]


def replay_one(data: bytes) -> journal.JournalReplay:
    """Replays ``data`` as the file ``q``, without ``finish()``: the state at the journal's end."""
    replay = journal.JournalReplay("q")
    replay.begin_file("q")
    replay.feed(data)
    replay.end_file()
    return replay


def test_writers_give_the_golden_bytes_of_the_docs() -> None:
    assert journal.add(b"a") == ADD_A
    assert journal.remove() == REMOVE
    assert journal.addx(b"hi", 1000) == ADDX_HI
    assert journal.addx(b"x", 1000, 2000) == ADDX_X_EXPIRING
    assert journal.remove_tentative() == REMOVE_TENTATIVE
    assert journal.save_xid(7) == SAVE_XID_7
    assert journal.unremove(7) == UNREMOVE_7
    assert journal.confirm_remove(7) == CONFIRM_REMOVE_7
    assert journal.add_xid(7, b"hi", 1000) == ADD_XID_7_HI
    assert journal.continue_item(7, b"hi", 1000) == CONTINUE_7_HI
    assert journal.remove_tentative_xid(7) == REMOVE_TENTATIVE_XID_7


# --- one opcode at a time ---------------------------------------------------------------------


def test_op0_add_has_an_expiry_in_seconds_and_no_add_time() -> None:
    replay = replay_files("q", [("q", ADD_A + h("00 06000000 10270000 6263"))])
    assert replay.finish() == [
        JournalItem(b"a", None, None),
        JournalItem(b"bc", None, 10_000_000),  # expiry 0x2710 = 10000 s
    ]
    assert (replay.records, replay.warnings) == (2, [])


def test_op1_remove_is_one_byte_takes_the_head_and_does_nothing_on_an_empty_queue() -> None:
    replay = replay_files("q", [("q", REMOVE + addx(b"1") + addx(b"2") + REMOVE + addx(b"3"))])
    assert values(replay.finish()) == [b"2", b"3"]
    assert replay.records == 5


def test_op2_addx_has_an_add_time_and_an_expiry_in_ms() -> None:
    replay = replay_files("q", [("q", ADDX_HI + ADDX_X_EXPIRING)])
    assert replay.finish() == [HI, JournalItem(b"x", 1000, 2000)]


def test_op3_remove_tentative_is_the_opcode_alone_and_holds_the_head_as_the_next_xid() -> None:
    # The byte after 03 starts the next record: read as an xid, 02 11 00 00 would swallow the
    # head of the ADDX and the replay would hit opcode 0xe8.
    replay = replay_one(SAVE_XID_7 + ADDX_HI + REMOVE_TENTATIVE + ADDX_X_EXPIRING)
    assert replay.open == {8: HI}, "Kestrel before 2.1 draws the xid: the counter plus one"
    assert replay.xid == 8, "and the counter becomes the xid drawn"
    assert replay.records == 4
    assert replay.warnings == []
    assert replay.finish() == [HI, JournalItem(b"x", 1000, 2000)]


def test_op3_draws_from_a_counter_that_starts_at_0() -> None:
    replay = replay_one(addx(b"a") + REMOVE_TENTATIVE)
    assert (replay.open, replay.xid) == ({1: JournalItem(b"a", 1000, None)}, 1)


def test_op3_on_an_empty_queue_holds_nothing_and_leaves_the_counter() -> None:
    replay = replay_one(SAVE_XID_7 + REMOVE_TENTATIVE)
    assert (replay.open, replay.xid) == ({}, 7)
    replay = replay_one(SAVE_XID_7 + REMOVE_TENTATIVE + addx(b"a") + REMOVE_TENTATIVE)
    assert list(replay.open) == [8], "the read on the empty queue drew no xid"


def test_op3_skips_the_xids_still_open() -> None:
    # Read 5 (opened with its xid) is still open when the counter is set back to 4.
    data = addx(b"a") + addx(b"b") + open_read(5) + xid_record(4, 4) + REMOVE_TENTATIVE
    replay = replay_one(data)
    assert values(list(replay.open.values())) == [b"a", b"b"]
    assert (sorted(replay.open), replay.xid) == ([5, 6], 6)
    assert replay.warnings == []
    data = addx(b"a") + addx(b"b") + addx(b"c") + open_read(5) + open_read(6)
    replay = replay_one(data + xid_record(4, 4) + REMOVE_TENTATIVE)
    assert (sorted(replay.open), replay.xid) == ([5, 6, 7], 7)


@pytest.mark.parametrize(
    ("counter", "already_open", "drawn"),
    [
        (2_147_483_647, [], -2_147_483_648),  # a JVM Int wraps around to its lowest value
        (-2, [], -1),
        (-1, [], 1),  # 0 is never drawn
        (-1, [1, 2], 3),
        (0, [], 1),
    ],
)
def test_op3_wraps_around_as_a_32_bit_int_and_never_draws_0(
    counter: int, already_open: list[int], drawn: int
) -> None:
    data = b"".join(addx(b"open") + open_read(xid) for xid in already_open)
    data += addx(b"z") + xid_record(4, counter) + REMOVE_TENTATIVE
    replay = replay_one(data)
    assert replay.open[drawn] == JournalItem(b"z", 1000, None)
    assert (sorted(replay.open), replay.xid) == (sorted([*already_open, drawn]), drawn)


def test_op3_twice_opens_two_distinct_reads_and_drops_no_item() -> None:
    replay = replay_one(addx(b"a") + addx(b"b") + addx(b"c") + REMOVE_TENTATIVE + REMOVE_TENTATIVE)
    assert replay.open == {1: JournalItem(b"a", 1000, None), 2: JournalItem(b"b", 1000, None)}
    assert replay.warnings == []
    assert values(replay.finish()) == [b"a", b"b", b"c"], "both come back, lowest xid first"


def test_op3_reads_are_confirmed_and_aborted_by_the_xids_drawn() -> None:
    # A session as Kestrel 2.0 journals it: two /open (03 alone; it numbered them 1 and 2), the
    # first confirmed with /close, the second aborted.
    data = addx(b"a") + addx(b"b") + REMOVE_TENTATIVE + REMOVE_TENTATIVE + confirm(1) + abort(2)
    replay = replay_files("q", [("q", data)])
    assert values(replay.finish()) == [b"b"]
    assert (replay.warnings, replay.xid) == ([], 2)


def test_op4_save_xid_sets_the_counter_and_moves_no_item() -> None:
    replay = replay_one(addx(b"a") + SAVE_XID_7)
    assert (replay.xid, values(list(replay.items)), replay.open) == (7, [b"a"], {})
    assert replay_one(h("04 ffffffff")).xid == -1, "a signed 32-bit xid"


def test_op5_unremove_puts_the_read_back_at_the_head() -> None:
    data = addx(b"a") + addx(b"b") + addx(b"c") + REMOVE_TENTATIVE_XID_7 + open_read(8)
    replay = replay_one(data + UNREMOVE_7)
    assert values(list(replay.items)) == [b"a", b"c"]
    assert list(replay.open) == [8]
    assert values(replay.finish()) == [b"b", b"a", b"c"], "read 8, open at the end, comes back"


def test_op6_confirm_remove_forgets_the_read() -> None:
    replay = replay_one(addx(b"a") + addx(b"b") + REMOVE_TENTATIVE_XID_7 + CONFIRM_REMOVE_7)
    assert replay.open == {}
    assert values(replay.finish()) == [b"b"]


def test_op7_add_xid_appends_its_item_and_its_xid_decides_nothing() -> None:
    # A rewrite by Kestrel before 2.1 of a read open as 7, confirmed afterwards. Replaying it,
    # that Kestrel holds the item under the counter's next xid, 1 (not 7, and not the 0 of a 2.1
    # reader), so the confirm of 7 misses it and it comes back, as it did in that Kestrel.
    rewritten = ADD_XID_7_HI + REMOVE_TENTATIVE + journal.save_xid(9) + addx(b"q")
    assert (replay_one(rewritten).open, replay_one(rewritten).xid) == ({1: HI}, 9)
    replay = replay_files("q", [("q", rewritten + CONFIRM_REMOVE_7)])
    assert replay.finish() == [HI, JournalItem(b"q", 1000, None)]
    assert [warning.split(": ", 1)[1] for warning in replay.warnings] == [
        "CONFIRM_REMOVE of unknown xid 7, ignored"
    ]
    # Opened with its xid, the same item is confirmed.
    replay = replay_files("q", [("q", ADD_XID_7_HI + REMOVE_TENTATIVE_XID_7 + CONFIRM_REMOVE_7)])
    assert (replay.finish(), replay.warnings) == ([], [])


def test_op8_continue_confirms_a_read_and_appends_its_item() -> None:
    replay = replay_one(addx(b"a") + addx(b"b") + REMOVE_TENTATIVE_XID_7 + CONTINUE_7_HI)
    assert replay.open == {}
    assert values(replay.finish()) == [b"b", b"hi"]
    assert replay.records == 4
    unknown = replay_files("q", [("q", CONTINUE_7_HI)])
    assert unknown.finish() == [HI]
    assert unknown.warnings == ["q at offset 0: CONTINUE of unknown xid 7, its item added"]


def test_op8_laid_out_as_the_documented_state_dump_is_corrupt() -> None:
    # Kestrel's journal_format.md: STATE_DUMP xid 9, 1 open. Kestrel reads opcode 8 as CONTINUE,
    # whose block size (here the "count", 1) cannot be below 16.
    with pytest.raises(JournalCorrupt, match="CONTINUE with size 1 ") as error:
        replay_files("q", [("q", addx(b"1") + h("08 09000000 01000000") + addx(b"2"))])
    assert error.value.offset == 22


def test_op9_remove_tentative_xid_holds_the_head_as_its_xid_and_sets_the_counter() -> None:
    replay = replay_one(addx(b"a") + addx(b"b") + REMOVE_TENTATIVE_XID_7)
    assert replay.open == {7: JournalItem(b"a", 1000, None)}
    assert (replay.xid, values(list(replay.items)), replay.records) == (7, [b"b"], 3)
    empty = replay_one(h("09 14000000"))
    assert (empty.open, empty.xid) == ({}, 20), "no item, but the counter still moves"


@pytest.mark.parametrize("opcode", [10, 42, 255])
def test_opcodes_from_10_up_are_corrupt(opcode: int) -> None:
    with pytest.raises(JournalCorrupt, match=f"unknown opcode {opcode}"):
        replay_files("q", [("q", addx(b"1") + bytes([opcode]) + bytes(8))])


# --- replay across files ------------------------------------------------------------------------

# Reliable reads on a Kestrel 2.1+ queue, in three stretches (each a rotated file in some layouts):
# a confirmed, b aborted then reopened and confirmed, c aborted and reopened, d open at shutdown,
# e removed by a plain get, f confirmed, g never read.
PART_1 = (
    addx(b"a") + addx(b"b") + addx(b"c") + addx(b"d") + addx(b"e")
    + open_read(1) + confirm(1) + open_read(2) + abort(2) + open_read(3) + open_read(4)
)  # fmt: skip
PART_2 = confirm(3) + addx(b"f") + open_read(5) + REMOVE + abort(4)
PART_3 = open_read(6) + addx(b"g") + open_read(7) + confirm(7)
# Reads 5 (d) and 6 (c) are open at shutdown: Kestrel aborts 6 then 5, each to the head.
SERVED_AFTER_RESTART = [b"d", b"c", b"g"]
# What Kestrel 2.1+ packs PART_1 into: the reads open at the checkpoint (highest xid first, each an
# ADDX then its REMOVE_TENTATIVE_XID), then the queue.
PACK_OF_PART_1 = addx(b"c") + open_read(4) + addx(b"b") + open_read(3) + addx(b"d") + addx(b"e")
DEAD = addx(b"dead") + open_read(99)  # a superseded file: replaying it would show

LAYOUTS = {
    "one file": {"q": PART_1 + PART_2 + PART_3},
    "rotated files": {"q.1700000000100": PART_1, "q.1700000000200": PART_2, "q": PART_3},
    "rotated, timestamps of unequal length": {"q.999": PART_1, "q.1000": PART_2, "q": PART_3},
    "a pack left by an interrupted clean-up": {
        "q.1700000000050": DEAD,
        "q.1700000000100": PART_1,
        "q.1700000000100.pack": PACK_OF_PART_1,
        "q.1700000000200": PART_2,
        "q": PART_3,
        "q~~1700000000300": DEAD,
    },
    "a pack renamed by Kestrel": {
        "q.1700000000100": PACK_OF_PART_1,
        "q.1700000000200": PART_2,
        "q": PART_3,
    },
    "only rotated files": {"q.1": PART_1 + PART_2, "q.2": PART_3},
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_reliable_reads_confirmed_aborted_and_open_at_shutdown_replay_as_kestrel_restarts(
    tmp_path: Path, layout: str
) -> None:
    for name, data in LAYOUTS[layout].items():
        (tmp_path / name).write_bytes(data)
    (files,), warnings = plan(tmp_path)
    replay = replay_queue(tmp_path, files)
    assert values(list(replay.items)) == SERVED_AFTER_RESTART
    assert (replay.warnings, warnings) == ([], [])
    assert replay.xid == 7
    assert not set(files.files) & {"q.1700000000050", "q~~1700000000300"}


def test_the_pack_replays_to_the_state_of_the_files_it_replaces() -> None:
    whole = replay_one(PART_1)
    packed = replay_one(PACK_OF_PART_1)
    assert packed.open == whole.open
    assert list(packed.items) == list(whole.items)


def test_a_directory_written_by_kestrel_2_0_replays_as_kestrel_2_0_restarts() -> None:
    # Kestrel 2.0 journals each /open as 03 alone and numbers it on replay from its counter, as
    # it did when serving. q.1 starts with a rewrite made while b (read 43) and a (read 41) were
    # open: each an ADD_XID then 03, then the counter, then the queue. Replaying it, 2.0 numbers
    # them 1 and 2, so the confirm of 41 misses and a comes back, in 2.0 as here. Then c is opened
    # (44), aborted, opened again (45) and confirmed.
    rewrite = journal.add_xid(43, b"b", 1000) + REMOVE_TENTATIVE
    rewrite += journal.add_xid(41, b"a", 1000) + REMOVE_TENTATIVE
    rewrite += journal.save_xid(43) + addx(b"c") + addx(b"d")
    served = confirm(41) + REMOVE_TENTATIVE + abort(44) + REMOVE_TENTATIVE + confirm(45)
    # 2.0 restarted on q.1: it aborted its open reads 2 (a) and 1 (b), each to the head, and went
    # on from its counter: b opened as 46, a as 47 and confirmed, e added; b open at shutdown.
    after_restart = abort(2) + abort(1) + REMOVE_TENTATIVE + REMOVE_TENTATIVE + confirm(47)
    after_restart += addx(b"e")
    replay = replay_files("q", [("q.1", rewrite + served), ("q", after_restart)])
    assert values(replay.finish()) == [b"b", b"d", b"e"]
    assert replay.xid == 47
    assert [warning.split(": ", 1)[1] for warning in replay.warnings] == [
        "CONFIRM_REMOVE of unknown xid 41, ignored"
    ]


def upgraded_directory(open_read_2_0: bytes) -> list[tuple[str, bytes]]:
    """q.1 written by Kestrel 2.0, its /open records given; q written by 2.1 after it started."""
    # 2.0: a opened (read 1), b opened (read 2) and confirmed; 2.0 stopped with a open.
    written_by_2_0 = addx(b"a") + addx(b"b") + addx(b"c") + open_read_2_0 + open_read_2_0
    written_by_2_0 += confirm(2)
    # 2.1 read both 03 as read 0 (b replacing a) and missed the confirm of 2; at its start it
    # aborted read 0 (b back at its head), then opened b as 1 and confirmed it, and d was added.
    written_by_2_1 = abort(0) + open_read(1) + confirm(1) + addx(b"d")
    return [("q.1", written_by_2_0), ("q", written_by_2_1)]


def test_a_2_0_directory_later_run_under_2_1_replays_2_0_reads_by_the_counter() -> None:
    replay = replay_files("q", upgraded_directory(REMOVE_TENTATIVE))
    # The known difference (docs section 2): the reads 2.0 left open are not the ones 2.1 aborted
    # at its start, so 2.1's records act on other items. Kayos serves d alone; a, open at 2.0's
    # stop, is replaced by 2.1's read 1, and c is the item that read confirms.
    assert values(replay.finish()) == [b"d"]
    assert [warning.split(": ", 1)[1] for warning in replay.warnings] == [
        "UNREMOVE of unknown xid 0, ignored",
        "REMOVE_TENTATIVE_XID of xid 1 already open: the earlier read's item is dropped, "
        "as Kestrel drops it",
    ]
    # What that 2.1 Kestrel serves after a restart: it reads each 03 as an open of read 0.
    as_2_1_reads_it = replay_files("q", upgraded_directory(open_read(0)))
    assert values(as_2_1_reads_it.finish()) == [b"c", b"d"]
    # And what 2.0 would have served had it restarted instead: a (open at its stop), then c.
    only_2_0 = replay_files("q", upgraded_directory(REMOVE_TENTATIVE)[:1])
    assert values(only_2_0.finish()) == [b"a", b"c"]


# --- unknown xids, damage, chunks ---------------------------------------------------------------


def test_unknown_xids_are_ignored_with_a_warning() -> None:
    replay = replay_files("q", [("q", addx(b"1") + confirm(99) + abort(98))])
    assert values(replay.finish()) == [b"1"]
    assert [w.split(": ", 1)[1] for w in replay.warnings] == [
        "CONFIRM_REMOVE of unknown xid 99, ignored",
        "UNREMOVE of unknown xid 98, ignored",
    ]
    assert replay.warnings[0].startswith("q at offset 22")


def test_a_torn_tail_is_reported_and_skipped() -> None:
    torn = addx(b"never-finished")[:-3]
    replay = replay_files("q", [("q.5", addx(b"1") + torn), ("q", addx(b"2") + open_read(3)[:3])])
    assert values(replay.finish()) == [b"1", b"2"]
    assert replay.warnings == [
        "q.5 at offset 22: torn tail (ADDX record cut off after 32 bytes), skipped",
        "q at offset 22: torn tail (REMOVE_TENTATIVE_XID record cut off after 3 bytes), skipped",
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
        (h("08 01000000 0f000000") + bytes(15), "CONTINUE with size 15"),
        (h("02 ffffff7f"), "ADDX with size 2147483647"),
    ],
)
def test_impossible_sizes_are_corrupt(record: bytes, message: str) -> None:
    with pytest.raises(JournalCorrupt, match=message) as error:
        replay_files("q", [("q", addx(b"1") + record + addx(b"2"))])
    assert error.value.offset == 22


def test_chunking_does_not_change_the_result() -> None:
    data = SAVE_XID_7 + ADD_A + ADDX_HI + open_read(2) + addx(b"z" * 300) + abort(2)
    data += ADD_XID_7_HI + REMOVE_TENTATIVE + CONTINUE_7_HI + open_read(8) + REMOVE
    data += PART_1 + PART_2 + PART_3
    whole = replay_files("q", [("q", data)])
    for step in (1, 2, 3, 4, 5, 7, 64):
        replay = journal.JournalReplay("q")
        replay.begin_file("q")
        for start in range(0, len(data), step):
            replay.feed(data[start : start + step])
        replay.end_file()
        assert replay.finish() == whole.finish(), step
        assert replay.records == whole.records
        assert replay.warnings == whole.warnings


def test_an_empty_file_and_an_empty_queue() -> None:
    replay = replay_files("q", [("q", b"")])
    assert replay.finish() == []
    assert replay.warnings == []


# --- the queue directory ------------------------------------------------------------------------


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


def test_two_packs_leave_what_kestrel_clean_up_leaves() -> None:
    # Kestrel finishes interrupted packs oldest first: 900 deletes q.850 and becomes q.900, then
    # 950 deletes q.900 and q.920 and becomes q.950. The newest pack and what follows it remain.
    names = ["q.850", "q.900.pack", "q.920", "q.950.pack", "q.960", "q"]
    files = plan_directory(names).queues["q"]
    assert files.files == ("q.950.pack", "q.960", "q")
    assert sorted(files.superseded) == ["q.850", "q.900.pack", "q.920"]
