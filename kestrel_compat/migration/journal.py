"""Kestrel 2.x journals, read without I/O: file names in, replay order out; bytes in, queue out.

docs/migrating-from-kestrel.md sections 1-3 are the contract: the record format, Kestrel's replay
rules (reads open at the end return to the head) and how a queue directory is read (rotation,
``.pack`` files, ``~~`` temporaries). ``JournalReplay`` takes each file's bytes in chunks of any
size (``feed``), then ``end_file``; a record cut off by the end of its file is a torn tail
(reported, skipped), a record that cannot be one is ``JournalCorrupt`` naming the file and offset.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
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
STATE_DUMP = 8

OPCODE_NAMES = {
    ADD: "ADD",
    REMOVE: "REMOVE",
    ADDX: "ADDX",
    REMOVE_TENTATIVE: "REMOVE_TENTATIVE",
    SAVE_XID: "SAVE_XID",
    UNREMOVE: "UNREMOVE",
    CONFIRM_REMOVE: "CONFIRM_REMOVE",
    ADD_XID: "ADD_XID",
    STATE_DUMP: "STATE_DUMP",
}

_I32 = struct.Struct("<i")
_I32_I32 = struct.Struct("<ii")
_ADD_HEAD = struct.Struct("<ii")  # size, expiry seconds
_ADDX_HEAD = struct.Struct("<iqq")  # size, add ms, expiry ms
_ADD_XID_HEAD = struct.Struct("<iiqq")  # xid, size, add ms, expiry ms

# Bytes after the opcode that must be present before a record's size is known.
_FIXED_AFTER_OPCODE = {
    ADD: 4,
    REMOVE: 0,
    ADDX: 4,
    REMOVE_TENTATIVE: 4,
    SAVE_XID: 4,
    UNREMOVE: 4,
    CONFIRM_REMOVE: 4,
    ADD_XID: 8,
    STATE_DUMP: 8,
}
_ADD_SIZE_MIN = 4
_ADDX_SIZE_MIN = 16


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
    ``finish()`` returns the queue as Kestrel would hold it after a restart."""

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
        used = self._apply(self._buffer)
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
        """The queue after replay: reads still open go back to the head, lowest xid first."""
        assert not self._buffer, "end_file() was not called"
        if not self._finished:
            for xid in sorted(self.open, reverse=True):
                self.items.appendleft(self.open.pop(xid))
            self._finished = True
        return list(self.items)

    # --- records ----------------------------------------------------------------------------

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

    def _apply(self, buffer: bytearray) -> int:
        """Applies whole records from the start of ``buffer``; returns the bytes used."""
        view = memoryview(buffer)
        end = len(buffer)
        position = 0
        items = self.items
        try:
            while position < end:
                opcode = buffer[position]
                fixed = _FIXED_AFTER_OPCODE.get(opcode)
                if fixed is None:
                    raise self._corrupt(position, f"unknown opcode {opcode}")
                if position + 1 + fixed > end:
                    break
                body = position + 1
                if opcode == ADDX:
                    size = _I32.unpack_from(buffer, body)[0]
                    self._check_size(position, opcode, size, _ADDX_SIZE_MIN)
                    record_end = body + 4 + size
                    if record_end > end:
                        break
                    _, add_ms, expiry_ms = _ADDX_HEAD.unpack_from(buffer, body)
                    data = bytes(view[body + 20 : record_end])
                    items.append(JournalItem(data, add_ms, expiry_ms or None))
                elif opcode == REMOVE:
                    record_end = body
                    if items:
                        items.popleft()
                elif opcode == REMOVE_TENTATIVE:
                    record_end = body + 4
                    xid = _I32.unpack_from(buffer, body)[0]
                    if items:
                        self.open[xid] = items.popleft()
                    self.xid = xid
                elif opcode == CONFIRM_REMOVE:
                    record_end = body + 4
                    xid = _I32.unpack_from(buffer, body)[0]
                    if self.open.pop(xid, None) is None:
                        self._unknown_xid(position, opcode, xid)
                elif opcode == UNREMOVE:
                    record_end = body + 4
                    xid = _I32.unpack_from(buffer, body)[0]
                    item = self.open.pop(xid, None)
                    if item is None:
                        self._unknown_xid(position, opcode, xid)
                    else:
                        items.appendleft(item)
                elif opcode == ADD:
                    size = _I32.unpack_from(buffer, body)[0]
                    self._check_size(position, opcode, size, _ADD_SIZE_MIN)
                    record_end = body + 4 + size
                    if record_end > end:
                        break
                    expiry_s = _I32.unpack_from(buffer, body + 4)[0]
                    data = bytes(view[body + 8 : record_end])
                    items.append(JournalItem(data, None, expiry_s * 1000 if expiry_s else None))
                elif opcode == SAVE_XID:
                    record_end = body + 4
                    self.xid = _I32.unpack_from(buffer, body)[0]
                elif opcode == ADD_XID:
                    _, size = _I32_I32.unpack_from(buffer, body)
                    self._check_size(position, opcode, size, _ADDX_SIZE_MIN)
                    record_end = body + 8 + size
                    if record_end > end:
                        break
                    _, _, add_ms, expiry_ms = _ADD_XID_HEAD.unpack_from(buffer, body)
                    data = bytes(view[body + 24 : record_end])
                    items.append(JournalItem(data, add_ms, expiry_ms or None))
                else:  # STATE_DUMP
                    record_end = body + 8
                    self.xid = _I32_I32.unpack_from(buffer, body)[0]
                position = record_end
                self.records += 1
        finally:
            view.release()
        return position

    def _unknown_xid(self, offset: int, opcode: int, xid: int) -> None:
        self.warnings.append(
            f"{self._file} at offset {self._buffer_offset + offset}: "
            f"{OPCODE_NAMES[opcode]} of unknown xid {xid}, ignored"
        )


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


def remove_tentative(xid: int) -> bytes:
    return bytes([REMOVE_TENTATIVE]) + _I32.pack(xid)


def save_xid(xid: int) -> bytes:
    return bytes([SAVE_XID]) + _I32.pack(xid)


def unremove(xid: int) -> bytes:
    return bytes([UNREMOVE]) + _I32.pack(xid)


def confirm_remove(xid: int) -> bytes:
    return bytes([CONFIRM_REMOVE]) + _I32.pack(xid)


def add_xid(xid: int, data: bytes, add_ms: int, expiry_ms: int = 0) -> bytes:
    return bytes([ADD_XID]) + _ADD_XID_HEAD.pack(xid, len(data) + 16, add_ms, expiry_ms) + data


def state_dump(xid: int, open_count: int) -> bytes:
    return bytes([STATE_DUMP]) + _I32_I32.pack(xid, open_count)
