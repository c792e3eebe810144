"""Reading a log range back in pieces that end at commit boundaries.

A replication link that is behind its upstream's memory reads the range it still owes from the
store, one ``BATCH`` frame at a time. Each piece is the store's state as of the piece's last seq:
every entry of the piece that no entry of the piece supersedes. A piece ends only at a commit
boundary (docs/storage-format.md, "Commit boundaries"), so a downstream applying the pieces one
commit at a time never holds part of an all-or-nothing write: the boundaries are read off every
version in the range, superseded entries and compaction's commit-end markers included, so a
superseded entry that ended a commit still ends it here.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from kayos.storage import format as fmt

if TYPE_CHECKING:
    from kayos.storage.engine import Entry, Snapshot

_MARKER = fmt.FLAG_COMMIT_MARKER
_ENDS_COMMIT = fmt.FLAG_BATCH_END


def read_back(
    snap: Snapshot, after: int, upto: int, *, entries_max: int, bytes_max: int
) -> tuple[list[Entry], int]:
    """The state as of the longest piece of ``(after, upto]`` that ends at a commit boundary and
    holds at most ``entries_max`` entries of at most ``bytes_max`` payload bytes (leaf sizes: key,
    value and packed headers). Returns its entries and the last seq it covers: ``upto`` when the
    whole range fits. Only when not even the range's first commit fits (a version 1 store whose
    compaction dropped that boundary: one commit never exceeds these bounds) is the piece cut at
    the bound instead."""
    # Every version walked, in seq order (markers hold no entry): (seq, prev, leaf, index).
    walked: list[tuple[int, int, fmt.Leaf, int]] = []
    alive: dict[int, int] = {}  # seq -> size: the state as of the last seq walked
    size = 0
    boundary = 0  # the last commit boundary walked; 0 while there is none
    for leaf in snap.leaves(after, upto):
        seqs = leaf.seqs
        lo = bisect.bisect_right(seqs, after)
        hi = bisect.bisect_right(seqs, upto)
        for index in range(lo, hi):
            flag = leaf.flags[index]
            seq = seqs[index]
            if not flag & _MARKER:
                entry_size = leaf.sizes[index]
                if alive and (len(alive) >= entries_max or size + entry_size > bytes_max):
                    # Every boundary walked fit when it was reached: the state only grows by
                    # the entry walked, which the check above let in.
                    end = boundary or walked[-1][0]
                    snap.check()
                    return _state_as_of(snap, walked, end), end
                prev = leaf.prevs[index]
                walked.append((seq, prev, leaf, index))
                alive[seq] = entry_size
                size += entry_size
                if prev > after:
                    superseded = alive.pop(prev, None)
                    if superseded is not None:
                        size -= superseded
            if flag & _ENDS_COMMIT:
                boundary = seq
    entries = _state_as_of(snap, walked, upto)
    snap.check()
    return entries, upto


def _state_as_of(
    snap: Snapshot, walked: list[tuple[int, int, fmt.Leaf, int]], end: int
) -> list[Entry]:
    """The walked entries at or below ``end`` that no walked entry at or below ``end``
    supersedes, their values read."""
    count = bisect.bisect_right(walked, end, key=_seq_of)
    superseded = {prev for _, prev, _, _ in walked[:count] if prev}
    return [
        snap.entry_at(leaf, index)
        for seq, _, leaf, index in walked[:count]
        if seq not in superseded
    ]


def _seq_of(row: tuple[int, int, fmt.Leaf, int]) -> int:
    return row[0]
