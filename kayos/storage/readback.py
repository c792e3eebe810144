"""Reading a log range back in pieces that end at commit boundaries.

A replication link that is behind its upstream's memory of recent batches reads the range it
still owes from the store, one ``BATCH`` frame at a time. Each piece holds every entry of its
range except the versions superseded at or below a **floor**: the link passes its upstream's
window floor (``last_seq - rollback_window_seqs``, docs/replication-protocol.md, "BATCH"), so
the downstream's store keeps every version the rollback window keeps, as compaction does. A
piece that left out every version superseded within it (the state as of its last seq, as pieces
were until the campaign's seed 20261124 finding) lacks versions that a consumer snapshot as of an
earlier commit point, or a rollback into the piece, needs. A piece ends only at a commit boundary
(docs/storage-format.md, "Commit boundaries"), so a downstream applying the pieces one commit at a
time never holds part of an all-or-nothing write: the boundaries are read off every version in
the range, superseded entries and compaction's commit-end markers included, so a superseded
entry that ended a commit still ends it here.

Two passes, so that memory follows the piece and not the range (a link far behind on a shard
that overwrites a few keys walks millions of versions for a piece of a few entries below the
floor): the first walks every version and keeps only integers (the seq and size of each entry
the piece would hold as of the walk, the last boundary) to find the cut; the second reads the
piece through the snapshot's pages, which leave out every version superseded at or below the
floor (and the cut).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from kayos.storage.disk import format as fmt

if TYPE_CHECKING:
    from kayos.storage.engine import Entry, Snapshot

_MARKER = fmt.FLAG_COMMIT_MARKER
_ENDS_COMMIT = fmt.FLAG_BATCH_END


def read_back(
    snap: Snapshot, after: int, upto: int, *, floor: int, entries_max: int, bytes_max: int
) -> tuple[list[Entry], int]:
    """The longest piece of ``(after, upto]`` that ends at a commit boundary and holds at most
    ``entries_max`` entries of at most ``bytes_max`` payload bytes (leaf sizes: key, value and
    packed headers): every version in it except those superseded at or below ``floor`` (and the
    piece's end; a ``floor`` at or past it gives the state as of the end). Returns its entries and
    the last seq it covers: ``upto`` when the whole range fits. Only when not even the range's
    first commit fits (a version 1 store whose compaction dropped that boundary: one commit never
    exceeds these bounds) is the piece cut at the bound instead."""
    end = _cut(snap, after, upto, floor=floor, entries_max=entries_max, bytes_max=bytes_max)
    entries: list[Entry] = []
    # Expired entries too: retention belongs to the receiving queue layer, as on the write path.
    for page in snap.pages(
        after,
        end,
        page_entries=max(entries_max, 1),
        include_expired=True,
        as_of=end,
        superseded_floor=floor,
    ):
        entries.extend(page)
    return entries, end


def _cut(
    snap: Snapshot, after: int, upto: int, *, floor: int, entries_max: int, bytes_max: int
) -> int:
    """The last seq of the piece: pass 1, integers only."""
    alive: dict[int, int] = {}  # seq -> size: what the piece holds as of the last seq walked
    size = 0
    boundary = 0  # the last commit boundary walked; 0 while there is none
    last = 0  # the last entry walked (markers hold no entry)
    for leaf in snap.leaves(after, upto):
        seqs = leaf.seqs
        lo = bisect.bisect_right(seqs, after)
        hi = bisect.bisect_right(seqs, upto)
        flags = leaf.flags
        for index in range(lo, hi):
            flag = flags[index]
            seq = seqs[index]
            if not flag & _MARKER:
                entry_size = leaf.sizes[index]
                if alive and (len(alive) >= entries_max or size + entry_size > bytes_max):
                    # Every boundary walked fit when it was reached: the state only grows by
                    # the entry walked, which the check above let in.
                    snap.check()
                    return boundary or last
                last = seq
                alive[seq] = entry_size
                size += entry_size
                prev = leaf.prevs[index]
                if prev > after and seq <= floor:
                    superseded = alive.pop(prev, None)
                    if superseded is not None:
                        size -= superseded
            if flag & _ENDS_COMMIT:
                boundary = seq
    snap.check()
    return upto
