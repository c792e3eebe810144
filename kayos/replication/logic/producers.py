"""The windows of idempotent producers (docs/node-api.md, "Idempotent producers";
docs/replication-protocol.md, "Producer windows"): which calls a shard's head wrote, what a
resend is answered, and the replicated metadata that carries them.

A producer names each call ``(producer_id, producer_seq)``. Per producer the head keeps a window:
the ``limits.producer_window_entries`` highest producer_seqs it wrote, each with the seqs its items
got; at most ``limits.producers_per_shard_max`` producers, the least recently written forgotten.
``ProducerTable.lookup`` says whether a call was written (its seqs), is new, or is too old to
tell; ``ProducerTable.record`` adds a written call and gives the metadata changes that carry the
new window down the chain in the call's own batch (``prod/<hex id>``: 24 bytes per entry).

Pure: no I/O, no clock. The head (``kayos.replication.shard.head_writes``) looks a call up and
records it in the same step of its event loop as it gives out the call's seqs, and builds its
table from its store's metadata (``ProducerTable.from_meta``) when it starts to lead.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Mapping
from typing import Final

from kayos import limits
from kayos.errors import InvalidRequest

# The replicated metadata key of a producer's window: this prefix and its id in lowercase hex.
PRODUCER_META_PREFIX: Final = "prod/"
PRODUCER_ID_BYTES: Final = 16
# One window entry: producer_seq, first_seq, last_seq, each a big-endian u64.
_ENTRY: Final = struct.Struct(">QQQ")
ENTRY_BYTES: Final = _ENTRY.size

Entry = tuple[int, int, int]


def meta_key(producer_id: bytes) -> str:
    """The metadata key of ``producer_id``'s window."""
    return PRODUCER_META_PREFIX + producer_id.hex()


def pack_window(entries: Iterable[Entry]) -> bytes:
    """A window's metadata value: its entries, increasing producer_seq first."""
    return b"".join(_ENTRY.pack(*entry) for entry in entries)


def unpack_window(value: object) -> list[Entry] | None:
    """The entries of a window's metadata value; None for a value that is not one (no entry, a
    length that is not a multiple of 24, producer_seqs not increasing, an empty seq range)."""
    if type(value) is not bytes or not value or len(value) % ENTRY_BYTES:
        return None
    entries = list(_ENTRY.iter_unpack(value))
    previous = -1
    for producer_seq, first_seq, last_seq in entries:
        if producer_seq <= previous or not 1 <= first_seq <= last_seq:
            return None
        previous = producer_seq
    return entries


def check_producer(producer_id: bytes, producer_seq: int) -> None:
    """Refuses a producer id that is not 16 bytes or a producer_seq outside u64."""
    if type(producer_id) is not bytes or len(producer_id) != PRODUCER_ID_BYTES:
        size = len(producer_id) if isinstance(producer_id, bytes) else type(producer_id).__name__
        raise InvalidRequest(f"producer_id must be {PRODUCER_ID_BYTES} bytes, got {size}")
    if type(producer_seq) is not int or not 0 <= producer_seq <= limits.u64_max:
        raise InvalidRequest(f"producer_seq must be a u64, got {producer_seq!r}")


class _Window:
    """One producer's window: its producer_seqs in increasing order, their seq ranges, and the
    metadata value packed from them (kept up to date, so a write in order costs one pack)."""

    __slots__ = ("key", "packed", "ranges", "seqs")

    def __init__(self, key: str) -> None:
        self.key = key
        self.seqs: list[int] = []
        self.ranges: dict[int, tuple[int, int]] = {}
        self.packed = b""

    def add(self, producer_seq: int, first_seq: int, last_seq: int, entries_max: int) -> None:
        seqs = self.seqs
        self.ranges[producer_seq] = (first_seq, last_seq)
        if not seqs or producer_seq > seqs[-1]:  # the usual case: calls arrive in order
            seqs.append(producer_seq)
            entry = _ENTRY.pack(producer_seq, first_seq, last_seq)
            if len(seqs) > entries_max:
                del self.ranges[seqs.pop(0)]
                self.packed = self.packed[ENTRY_BYTES:] + entry
            else:
                self.packed += entry
            return
        bisect.insort(seqs, producer_seq)
        while len(seqs) > entries_max:
            del self.ranges[seqs.pop(0)]
        self.packed = pack_window((seq, *self.ranges[seq]) for seq in seqs)


class ProducerTable:
    """A shard head's producer windows, least recently written producer first."""

    __slots__ = ("_entries_max", "_producers_max", "_windows")

    def __init__(
        self,
        *,
        window_entries: int = limits.producer_window_entries,
        producers_max: int = limits.producers_per_shard_max,
    ) -> None:
        assert window_entries >= 1
        assert producers_max >= 1
        self._entries_max = window_entries
        self._producers_max = producers_max
        self._windows: dict[bytes, _Window] = {}

    @classmethod
    def from_meta(
        cls,
        meta: Mapping[str, object],
        *,
        seq_max: int,
        window_entries: int = limits.producer_window_entries,
        producers_max: int = limits.producers_per_shard_max,
    ) -> ProducerTable:
        """The table a store's metadata holds: every ``prod/`` key whose value is a window,
        without the entries whose seqs pass ``seq_max`` (a replica whose rollback kept a newer
        map: those seqs were dropped). Producers are ordered by the last seq they got, so the
        one written least recently is forgotten first, as on the head that wrote them."""
        found: list[tuple[int, bytes, list[Entry]]] = []
        for name, value in meta.items():
            if not name.startswith(PRODUCER_META_PREFIX):
                continue
            producer_id = _producer_id(name)
            entries = unpack_window(value)
            if producer_id is None or entries is None:
                continue
            entries = [entry for entry in entries if entry[2] <= seq_max][-window_entries:]
            if entries:
                found.append((max(entry[2] for entry in entries), producer_id, entries))
        table = cls(window_entries=window_entries, producers_max=producers_max)
        for _last, producer_id, entries in sorted(found):
            window = _Window(meta_key(producer_id))
            window.seqs = [entry[0] for entry in entries]
            window.ranges = {seq: (first, last) for seq, first, last in entries}
            window.packed = pack_window(entries)
            table._windows[producer_id] = window
        return table

    def __len__(self) -> int:
        return len(self._windows)

    def window(self, producer_id: bytes) -> list[Entry]:
        """``producer_id``'s window, increasing producer_seq (empty: not known)."""
        window = self._windows.get(producer_id)
        if window is None:
            return []
        return [(seq, *window.ranges[seq]) for seq in window.seqs]

    def lookup(self, producer_id: bytes, producer_seq: int) -> tuple[int, int] | None:
        """The seqs call ``producer_seq`` got, if it was written; None if it was not (write it).
        ``InvalidRequest`` (``producer_seq_too_old``) when the window is full and the call is
        below its lowest entry: it may have been written and dropped from the window since."""
        window = self._windows.get(producer_id)
        if window is None:
            if len(producer_id) != PRODUCER_ID_BYTES:
                check_producer(producer_id, producer_seq)
            return None
        found = window.ranges.get(producer_seq)
        if found is not None:
            return found
        seqs = window.seqs
        if len(seqs) >= self._entries_max and producer_seq < seqs[0]:
            raise InvalidRequest(
                f"producer_seq_too_old: producer {producer_id.hex()} call {producer_seq} is below "
                f"the {len(seqs)} calls this head remembers ({seqs[0]}..{seqs[-1]}); it may or "
                "may not have been written, and that can no longer be told"
            )
        return None

    def record(
        self, producer_id: bytes, producer_seq: int, first_seq: int, last_seq: int
    ) -> dict[str, int | bytes | None]:
        """Adds call ``producer_seq`` (which ``lookup`` found new) with its seqs; returns the
        metadata changes its batch carries: the producer's new window, and a delete for each
        producer forgotten to make room."""
        windows = self._windows
        changes: dict[str, int | bytes | None] = {}
        window = windows.pop(producer_id, None)
        if window is None:
            check_producer(producer_id, producer_seq)
            window = _Window(meta_key(producer_id))
            while len(windows) >= self._producers_max:
                changes[windows.pop(next(iter(windows))).key] = None
        assert producer_seq not in window.ranges, "recorded twice"
        windows[producer_id] = window  # now the most recently written
        window.add(producer_seq, first_seq, last_seq, self._entries_max)
        changes[window.key] = window.packed
        return changes


def _producer_id(name: str) -> bytes | None:
    text = name[len(PRODUCER_META_PREFIX) :]
    if len(text) != 2 * PRODUCER_ID_BYTES or text != text.lower():
        return None
    try:
        producer_id = bytes.fromhex(text)
    except ValueError:
        return None
    return producer_id if len(producer_id) == PRODUCER_ID_BYTES else None
