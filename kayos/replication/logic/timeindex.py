"""A replica's sampled time index: when this member took in its entries, roughly.

The store keeps no arrival time per entry. Instead each replica notes, for the first batch it
accepts in each ``limits.time_index_interval_ms``, ``(first seq, wall-clock ms)``. Every seq
between two samples was accepted within one interval after the earlier sample, so the floor
lookup ``time_of(seq)`` is at most one interval early: an age computed from it is at most one
interval too old, never too young. Seqs whose time this member does not know (taken in during a
catch-up, lost with an unwritten file, older than the oldest sample kept) look up as None.

Derived state, never replicated and never part of the store format: it lives in its own file
beside the store (docs/storage-format.md, "Time index file"), written whole now and then; a
missing, torn or foreign file is read as an empty index, never as an error.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import pairwise

from kayos import limits
from kayos.replication.logic import durablemark

TIME_INDEX_FILE = "time-index"
_MAGIC = b"KYTI"
_VERSION = 1
# magic, version, 3 pad bytes, the last seq the samples cover, the sample count.
_HEADER = struct.Struct("<4sB3xQI")
_CRC = struct.Struct("<I")
# A sample's time for "unknown from this seq on".
UNKNOWN_MS = -1


class TimeIndex:
    """Sampled ``seq -> wall-clock ms`` of one replica. Not thread-safe: the event loop owns it
    (``encode`` copies it out for a writer thread)."""

    def __init__(
        self,
        *,
        interval_ms: int = limits.time_index_interval_ms,
        samples_max: int = limits.time_index_samples_max,
    ) -> None:
        assert interval_ms > 0
        assert samples_max >= 4
        self.interval_ms = interval_ms
        self.samples_max = samples_max
        self._seqs = array("q")
        self._times = array("q")
        # The highest seq noted: what a written file says its samples cover.
        self.through = 0
        # Whether anything changed since the last ``encode``.
        self.dirty = False

    def __len__(self) -> int:
        return len(self._seqs)

    def samples(self) -> list[tuple[int, int | None]]:
        return [
            (s, None if t == UNKNOWN_MS else t)
            for s, t in zip(self._seqs, self._times, strict=True)
        ]

    def note(self, first_seq: int, last_seq: int, now_s: float) -> None:
        """A batch ``first_seq..last_seq`` was accepted now. The produce path's only cost: one
        compare unless a new interval began."""
        times = self._times
        if not times or times[-1] == UNKNOWN_MS or now_s * 1000 - times[-1] >= self.interval_ms:
            self._append(first_seq, int(now_s * 1000))
        self.through = last_seq

    def unknown_from(self, first_seq: int, last_seq: int) -> None:
        """A batch ``first_seq..last_seq`` of unknown time was accepted: seqs from ``first_seq``
        on have no known time (until the next ``note``)."""
        if not self._times or self._times[-1] != UNKNOWN_MS:
            self._append(first_seq, UNKNOWN_MS)
        self.through = last_seq

    def _append(self, seq: int, ms: int) -> None:
        if self._seqs and seq <= self._seqs[-1]:
            # Seqs only grow on a live replica; anything else means its history was rewritten
            # and ``truncate_after`` was missed. Forget what came after rather than lie.
            self.truncate_after(seq - 1)
        if len(self._seqs) >= self.samples_max:
            # Drop the oldest quarter at once (amortised): those seqs become "older than the
            # index" and look up as unknown.
            drop = self.samples_max // 4
            del self._seqs[:drop]
            del self._times[:drop]
        self._seqs.append(seq)
        self._times.append(ms)
        self.dirty = True

    def time_of(self, seq: int) -> int | None:
        """Wall-clock ms at or before which ``seq`` was accepted here (within one interval),
        or None when unknown."""
        seqs = self._seqs
        at = bisect_right(seqs, seq) - 1
        if at < 0 or seq > self.through:
            return None
        ms = self._times[at]
        return None if ms == UNKNOWN_MS else ms

    def covering(self, seqs: Sequence[int]) -> list[tuple[int, int | None]]:
        """The samples the floor lookups of ``seqs`` (ascending) land on, in seq order, each
        once, so that a reader applying the floor rule to them gets ``time_of`` of every seq
        (docs/node-api.md, "Append times"): every sample of their range when those are no more
        than ``len(seqs)``, else only the ones some seq lands on; plus ``(through + 1, None)``
        when some seq is past what the index covers. At most ``len(seqs) + 1`` samples."""
        if not seqs:
            return []
        index = self._seqs
        last = min(seqs[-1], self.through)
        start = max(0, bisect_right(index, seqs[0]) - 1)
        stop = bisect_right(index, last)
        if stop - start <= len(seqs):
            picks: Iterable[int] = range(start, stop)
        else:
            floors = {bisect_right(index, seq, start, stop) - 1 for seq in seqs if seq <= last}
            picks = sorted(floors - {-1})
        times = self._times
        found = [(index[at], None if times[at] == UNKNOWN_MS else times[at]) for at in picks]
        if seqs[-1] > self.through:
            found.append((self.through + 1, None))
        return found

    def truncate_after(self, seq: int) -> None:
        """Seqs above ``seq`` were dropped (rollback, discard): their samples go too."""
        at = bisect_right(self._seqs, seq)
        if at < len(self._seqs):
            del self._seqs[at:]
            del self._times[at:]
            self.dirty = True
        if self.through > seq:
            self.through = seq
            self.dirty = True

    def clear(self) -> None:
        self._seqs = array("q")
        self._times = array("q")
        self.through = 0
        self.dirty = True

    def settle_with(self, last_seq: int) -> None:
        """Fits a loaded index to the store it describes (``last_seq``): samples past the store
        go, and seqs the file never covered (written before a crash) become unknown."""
        if self.through > last_seq:
            self.truncate_after(last_seq)
        elif self.through < last_seq:
            self.unknown_from(self.through + 1, last_seq)
        self.dirty = False

    # --- the file ------------------------------------------------------------------------------

    def encode(self) -> bytes:
        seqs, times = self._seqs, self._times
        if sys.byteorder != "little":  # the file is little-endian everywhere
            seqs, times = array("q", seqs), array("q", times)
            seqs.byteswap()
            times.byteswap()
        pairs = array("q", [0]) * (2 * len(seqs))
        pairs[0::2] = seqs
        pairs[1::2] = times
        body = _HEADER.pack(_MAGIC, _VERSION, self.through, len(seqs)) + pairs.tobytes()
        self.dirty = False
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, raw: bytes, **options: int) -> TimeIndex:
        """The index ``raw`` holds, or an empty one when ``raw`` is not a whole, valid file."""
        index = cls(**options)
        if len(raw) < _HEADER.size + _CRC.size:
            return index
        body, (crc,) = raw[: -_CRC.size], _CRC.unpack(raw[-_CRC.size :])
        magic, version, through, count = _HEADER.unpack_from(body)
        if (
            magic != _MAGIC
            or version != _VERSION
            or zlib.crc32(body) != crc
            or len(body) != _HEADER.size + 16 * count
        ):
            return index
        pairs = array("q")
        pairs.frombytes(body[_HEADER.size :])
        if sys.byteorder != "little":
            pairs.byteswap()
        seqs, times = pairs[0::2], pairs[1::2]
        if any(b <= a for a, b in pairwise(seqs)) or (seqs and seqs[-1] > through):
            return index
        keep = min(count, index.samples_max)
        index._seqs, index._times = seqs[count - keep :], times[count - keep :]
        index.through = through
        return index


def load(directory: str, last_seq: int) -> TimeIndex:
    """The index written in ``directory``, fitted to a store whose last seq is ``last_seq``;
    empty (every older seq unknown) when the file is missing, torn or unreadable."""
    try:
        with open(os.path.join(directory, TIME_INDEX_FILE), "rb") as handle:
            raw = handle.read(_HEADER.size + 16 * limits.time_index_samples_max + _CRC.size + 1)
    except OSError:
        raw = b""
    index = TimeIndex.decode(raw)
    if not len(index):
        index.through = last_seq
    index.settle_with(last_seq)
    return index


def write(directory: str, raw: bytes) -> None:
    """Writes an encoded index whole (temporary file, fsync, rename): a crash leaves the old
    file or the new one, and a torn one is read as empty anyway."""
    durablemark.write_whole(os.path.join(directory, TIME_INDEX_FILE), raw)
