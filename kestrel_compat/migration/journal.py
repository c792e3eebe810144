"""Kestrel journals, read without I/O: file names in, replay order out; bytes in, queue out.

docs/migrating-from-kestrel.md sections 1-3 are the contract: the record format (every opcode
Kestrel reads, including the ones only versions before 2.1 wrote), the replay rules (each record
replayed as the Kestrel that wrote it replays it: reads opened, confirmed and aborted by xid, an
opcode-3 read numbered by the xid counter; reads open at the end return to the head) and how a
queue directory is read (rotation, ``.pack`` files, ``~~`` temporaries). ``JournalReplay`` takes
each file's bytes in chunks of any size (``feed``), then ``end_file``; a record cut off by the end
of its file is a torn tail (reported, skipped), a record that cannot be one is ``JournalCorrupt``
naming the file and offset.
Records are read through one table, ``_READERS``: a reader per opcode.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kayos.errors import CorruptionError
from kestrel_compat import limits

ADD = 0
REMOVE = 1
ADDX = 2
REMOVE_TENTATIVE = 3
SAVE_XID = 4
UNREMOVE = 5
CONFIRM_REMOVE = 6
ADD_XID = 7
CONTINUE = 8
REMOVE_TENTATIVE_XID = 9

OPCODE_NAMES = {
    ADD: "ADD",
    REMOVE: "REMOVE",
    ADDX: "ADDX",
    REMOVE_TENTATIVE: "REMOVE_TENTATIVE",
    SAVE_XID: "SAVE_XID",
    UNREMOVE: "UNREMOVE",
    CONFIRM_REMOVE: "CONFIRM_REMOVE",
    ADD_XID: "ADD_XID",
    CONTINUE: "CONTINUE",
    REMOVE_TENTATIVE_XID: "REMOVE_TENTATIVE_XID",
}

_I32 = struct.Struct("<i")
_TIMES = struct.Struct("<qq")  # add ms, expiry ms
_ADD_HEAD = struct.Struct("<ii")  # size, expiry seconds
_ADDX_HEAD = struct.Struct("<iqq")  # size, add ms, expiry ms
_XID_SIZE = struct.Struct("<ii")  # xid, size
_ADD_XID_HEAD = struct.Struct("<iiqq")  # xid, size, add ms, expiry ms
_ADD_SIZE_MIN = 4  # the expiry
_BLOCK_SIZE_MIN = 16  # the two times of ADDX, ADD_XID and CONTINUE


class JournalCorrupt(CorruptionError):
    """A journal record that cannot be one (unknown opcode, impossible size): the queue stops."""

    code = "kestrel_journal_corrupt"


@dataclass(frozen=True, slots=True)
class JournalItem:
    """One queued item. ``add_ms`` is None for an old-style ADD (no add time in the record);
    ``expiry_ms`` absolute Unix ms, None: never."""

    data: bytes
    add_ms: int | None
    expiry_ms: int | None


@dataclass(frozen=True, slots=True)
class QueueFiles:
    """A queue's journal files in replay order, and the files of that queue left out."""

    queue: str
    files: tuple[str, ...]
    superseded: tuple[str, ...] = ()


@dataclass(slots=True)
class DirectoryPlan:
    queues: dict[str, QueueFiles] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def plan_directory(names: Iterable[str]) -> DirectoryPlan:
    """Which files make up which queue, in Kestrel's replay order (docs section 3).

    ``names`` are the plain file names of a Kestrel queue directory (no subdirectories)."""
    plan = DirectoryPlan()
    current: set[str] = set()
    rotated: dict[str, list[tuple[int, str]]] = {}
    packed: dict[str, list[tuple[int, str]]] = {}
    for name in sorted(names):
        if "~~" in name:
            continue  # a temporary file of an interrupted rewrite
        queue, dot, rest = name.partition(".")
        if not queue:
            plan.warnings.append(f"{name}: not a journal file name, ignored")
            continue
        if not dot:
            current.add(queue)
            continue
        stamp, dot2, suffix = rest.partition(".")
        if not stamp.isdigit() or (dot2 and suffix != "pack"):
            plan.warnings.append(f"{name}: not a journal file name, ignored")
            continue
        (packed if dot2 else rotated).setdefault(queue, []).append((int(stamp), name))
    for queue in sorted(current | set(rotated) | set(packed)):
        files: list[str] = []
        superseded: list[str] = []
        floor = -1
        packs = sorted(packed.get(queue, []))
        if packs:
            floor, newest = packs[-1]
            files.append(newest)
            superseded += [name for _, name in packs[:-1]]
        for when, name in sorted(rotated.get(queue, [])):
            (files if when > floor else superseded).append(name)
        if queue in current:
            files.append(queue)
        plan.queues[queue] = QueueFiles(queue, tuple(files), tuple(superseded))
    return plan


class JournalReplay:
    """Replays one queue's journal files, in the order ``plan_directory`` gives, into its items.

    Sans-IO: ``begin_file(name)``, ``feed(chunk)`` any number of times, ``end_file()``; then
    ``finish()`` returns the queue as Kestrel would hold it after a restart. ``open`` holds the
    reads open so far by xid; ``xid`` is the xid counter, which numbers the reads opened by a
    REMOVE_TENTATIVE (opcode 3) record (docs section 2)."""

    def __init__(self, queue: str, *, item_bytes_max: int = limits.value_bytes_max) -> None:
        self.queue = queue
        self.item_bytes_max = item_bytes_max
        self.items: deque[JournalItem] = deque()
        self.open: dict[int, JournalItem] = {}
        self.xid = 0
        self.records = 0
        self.warnings: list[str] = []
        self._file = ""
        self._buffer = bytearray()
        self._buffer_offset = 0  # file offset of self._buffer[0]
        self._finished = False

    # --- the sans-IO surface ----------------------------------------------------------------

    def begin_file(self, name: str) -> None:
        assert not self._buffer, "end_file() was not called"
        self._file = name
        self._buffer_offset = 0

    def feed(self, chunk: bytes) -> None:
        """Applies every whole record now in the buffer; keeps a partial one for the next chunk.
        Raises ``JournalCorrupt`` at the first impossible record."""
        self._buffer += chunk
        view = memoryview(self._buffer)
        try:
            used = self._apply(view)
        finally:
            view.release()
        if used:
            del self._buffer[:used]
            self._buffer_offset += used

    def end_file(self) -> None:
        """The file ended: a partial record left over is a torn tail, reported and dropped."""
        if self._buffer:
            opcode = self._buffer[0]
            self.warnings.append(
                f"{self._file} at offset {self._buffer_offset}: torn tail "
                f"({OPCODE_NAMES.get(opcode, '?')} record cut off after "
                f"{len(self._buffer)} bytes), skipped"
            )
            self._buffer_offset += len(self._buffer)
            self._buffer.clear()

    def finish(self) -> list[JournalItem]:
        """The queue after replay: reads still open go back to the head, lowest xid first (Kestrel
        aborts them from the highest xid down, each to the head)."""
        assert not self._buffer, "end_file() was not called"
        if not self._finished:
            for xid in sorted(self.open, reverse=True):
                self.items.appendleft(self.open.pop(xid))
            self._finished = True
        return list(self.items)

    # --- records ----------------------------------------------------------------------------

    def _apply(self, view: memoryview) -> int:
        """Applies whole records from the start of ``view``; returns the bytes used."""
        end = len(view)
        position = 0
        while position < end:
            opcode = view[position]
            reader = _READERS.get(opcode)
            if reader is None:
                raise self._corrupt(position, f"unknown opcode {opcode}")
            record_end = reader(self, view, position, end)
            if record_end < 0:
                break  # the record goes on in the next chunk (or is a torn tail)
            position = record_end
            self.records += 1
        return position

    # Each reader gets the buffer, the offset of its record's opcode and the end of the buffer;
    # it applies the record and returns the offset just past it, or -1 when the buffer ends first.

    def _read_add(self, view: memoryview, start: int, end: int) -> int:
        if start + 5 > end:
            return -1
        size: int = _I32.unpack_from(view, start + 1)[0]
        self._check_size(start, ADD, size, _ADD_SIZE_MIN)
        record_end = start + 5 + size
        if record_end > end:
            return -1
        expiry_s = _I32.unpack_from(view, start + 5)[0]
        data = bytes(view[start + 9 : record_end])
        self.items.append(JournalItem(data, None, expiry_s * 1000 if expiry_s else None))
        return record_end

    def _read_remove(self, view: memoryview, start: int, end: int) -> int:
        if self.items:
            self.items.popleft()
        return start + 1

    def _read_addx(self, view: memoryview, start: int, end: int) -> int:
        # The common record, read with one unpack whenever its head is in the buffer.
        if start + 21 <= end:
            size, add_ms, expiry_ms = _ADDX_HEAD.unpack_from(view, start + 1)
        elif start + 5 <= end:
            size, add_ms, expiry_ms = _I32.unpack_from(view, start + 1)[0], 0, 0
        else:
            return -1
        if size < _BLOCK_SIZE_MIN or size - _BLOCK_SIZE_MIN > self.item_bytes_max:
            self._check_size(start, ADDX, size, _BLOCK_SIZE_MIN)
        record_end: int = start + 5 + size
        if record_end > end:
            return -1
        self.items.append(
            JournalItem(bytes(view[start + 21 : record_end]), add_ms, expiry_ms or None)
        )
        return record_end

    def _read_remove_tentative(self, view: memoryview, start: int, end: int) -> int:
        # The opcode alone, as Kestrel before 2.1 wrote an /open, replayed as that Kestrel replays
        # it (docs section 2): the head is held under the counter's next xid, which becomes the
        # counter; an empty queue holds nothing and draws nothing.
        if self.items:
            self.xid = self._next_xid()
            self.open[self.xid] = self.items.popleft()
        return start + 1

    def _next_xid(self) -> int:
        """Kestrel's ``nextXid``: the counter plus one, wrapping around as a 32-bit signed int
        does, skipping 0 and every xid still open."""
        xid = self.xid
        while True:
            xid = (xid + 1 + 2**31) % 2**32 - 2**31
            if xid != 0 and xid not in self.open:
                return xid

    def _read_remove_tentative_xid(self, view: memoryview, start: int, end: int) -> int:
        if start + 5 > end:
            return -1
        # The head, if any, is held as the record's xid (replacing a read already held as that
        # xid, whose item is dropped, as Kestrel's table of open reads does); the counter becomes
        # the xid either way.
        xid: int = _I32.unpack_from(view, start + 1)[0]
        if self.items:
            if xid in self.open:
                self._warn(
                    start,
                    f"REMOVE_TENTATIVE_XID of xid {xid} already open: "
                    "the earlier read's item is dropped, as Kestrel drops it",
                )
            self.open[xid] = self.items.popleft()
        self.xid = xid
        return start + 5

    def _read_save_xid(self, view: memoryview, start: int, end: int) -> int:
        if start + 5 > end:
            return -1
        self.xid = _I32.unpack_from(view, start + 1)[0]
        return start + 5

    def _read_unremove(self, view: memoryview, start: int, end: int) -> int:
        if start + 5 > end:
            return -1
        xid = _I32.unpack_from(view, start + 1)[0]
        item = self.open.pop(xid, None)
        if item is None:
            self._warn(start, f"UNREMOVE of unknown xid {xid}, ignored")
        else:
            self.items.appendleft(item)
        return start + 5

    def _read_confirm_remove(self, view: memoryview, start: int, end: int) -> int:
        if start + 5 > end:
            return -1
        xid = _I32.unpack_from(view, start + 1)[0]
        if self.open.pop(xid, None) is None:
            self._warn(start, f"CONFIRM_REMOVE of unknown xid {xid}, ignored")
        return start + 5

    def _read_add_xid(self, view: memoryview, start: int, end: int) -> int:
        found = self._xid_block(view, start, end)
        if found is None:
            return -1
        _, item, record_end = found  # no Kestrel makes use of the xid (docs section 2)
        self.items.append(item)
        return record_end

    def _read_continue(self, view: memoryview, start: int, end: int) -> int:
        found = self._xid_block(view, start, end)
        if found is None:
            return -1
        xid, item, record_end = found
        if self.open.pop(xid, None) is None:
            self._warn(start, f"CONTINUE of unknown xid {xid}, its item added")
        self.items.append(item)
        return record_end

    def _xid_block(
        self, view: memoryview, start: int, end: int
    ) -> tuple[int, JournalItem, int] | None:
        """An ``i32 xid`` then an ADDX block (ADD_XID, CONTINUE): the xid, the item and the
        record's end; None when the buffer ends first."""
        if start + 9 > end:
            return None
        xid, size = _XID_SIZE.unpack_from(view, start + 1)
        self._check_size(start, view[start], size, _BLOCK_SIZE_MIN)
        record_end = start + 9 + size
        if record_end > end:
            return None
        add_ms, expiry_ms = _TIMES.unpack_from(view, start + 9)
        data = bytes(view[start + 25 : record_end])
        return xid, JournalItem(data, add_ms, expiry_ms or None), record_end

    # --- helpers ----------------------------------------------------------------------------

    def _corrupt(self, offset: int, message: str) -> JournalCorrupt:
        return JournalCorrupt(
            f"queue {self.queue!r}: {message}", path=self._file, offset=self._buffer_offset + offset
        )

    def _check_size(self, offset: int, opcode: int, size: int, size_min: int) -> None:
        if size < size_min or size - size_min > self.item_bytes_max:
            raise self._corrupt(
                offset,
                f"{OPCODE_NAMES[opcode]} with size {size} "
                f"(must be {size_min} .. {size_min + self.item_bytes_max})",
            )

    def _warn(self, offset: int, message: str) -> None:
        self.warnings.append(f"{self._file} at offset {self._buffer_offset + offset}: {message}")


_Reader = Callable[[JournalReplay, memoryview, int, int], int]

_READERS: dict[int, _Reader] = {
    ADD: JournalReplay._read_add,
    REMOVE: JournalReplay._read_remove,
    ADDX: JournalReplay._read_addx,
    REMOVE_TENTATIVE: JournalReplay._read_remove_tentative,
    SAVE_XID: JournalReplay._read_save_xid,
    UNREMOVE: JournalReplay._read_unremove,
    CONFIRM_REMOVE: JournalReplay._read_confirm_remove,
    ADD_XID: JournalReplay._read_add_xid,
    CONTINUE: JournalReplay._read_continue,
    REMOVE_TENTATIVE_XID: JournalReplay._read_remove_tentative_xid,
}
assert set(_READERS) == set(OPCODE_NAMES)


def replay_files(queue: str, files: Iterable[tuple[str, bytes]]) -> JournalReplay:
    """Replays whole files given as ``(name, bytes)``: the tests' and small callers' shortcut."""
    replay = JournalReplay(queue)
    for name, data in files:
        replay.begin_file(name)
        replay.feed(data)
        replay.end_file()
    replay.finish()
    return replay


# --- writing records: the golden bytes of docs/migrating-from-kestrel.md section 1 ---------------


def add(data: bytes, expiry_s: int = 0) -> bytes:
    return bytes([ADD]) + _ADD_HEAD.pack(len(data) + 4, expiry_s) + data


def remove() -> bytes:
    return bytes([REMOVE])


def addx(data: bytes, add_ms: int, expiry_ms: int = 0) -> bytes:
    return bytes([ADDX]) + _ADDX_HEAD.pack(len(data) + 16, add_ms, expiry_ms) + data


def remove_tentative() -> bytes:
    """The opcode alone, as Kestrel before 2.1 wrote an open read (no xid in the record)."""
    return bytes([REMOVE_TENTATIVE])


def save_xid(xid: int) -> bytes:
    return bytes([SAVE_XID]) + _I32.pack(xid)


def unremove(xid: int) -> bytes:
    return bytes([UNREMOVE]) + _I32.pack(xid)


def confirm_remove(xid: int) -> bytes:
    return bytes([CONFIRM_REMOVE]) + _I32.pack(xid)


def add_xid(xid: int, data: bytes, add_ms: int, expiry_ms: int = 0) -> bytes:
    return bytes([ADD_XID]) + _ADD_XID_HEAD.pack(xid, len(data) + 16, add_ms, expiry_ms) + data


def continue_item(xid: int, data: bytes, add_ms: int, expiry_ms: int = 0) -> bytes:
    """CONTINUE: confirm ``xid`` and add ``data`` to the tail, in one record."""
    return bytes([CONTINUE]) + _ADD_XID_HEAD.pack(xid, len(data) + 16, add_ms, expiry_ms) + data


def remove_tentative_xid(xid: int) -> bytes:
    """An open read as Kestrel 2.1 and later write it: the opcode and the read's xid."""
    return bytes([REMOVE_TENTATIVE_XID]) + _I32.pack(xid)
