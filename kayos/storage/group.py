"""One group commit laid out before it touches the file: the queued batch, the group's build,
and the helpers that turn batches into leaf columns and fill in what each entry supersedes.

Pure data work, no store state: the group commit (kayos.storage.commit) queues ``Pending``
batches, builds a ``GroupBuild`` with these helpers, and writes it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

from kayos import limits
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kayos.storage.batch import BatchColumns
    from kayos.storage.records import CommitResult


@dataclass(slots=True)
class Pending:
    """One batch waiting in the commit queue; the leader of its group commit fills in ``result``
    or ``error`` and sets ``done``."""

    columns: BatchColumns
    meta: dict[str, Any] | None
    seqs: Sequence[int] | None
    last_seq: int | None = None
    claim_seq: bool = False
    result: CommitResult | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass(slots=True)
class GroupBuild:
    """Everything one group commit computed before it touches the file."""

    out: btree.Appender
    cols: fmt.Leaf
    live: int = 0  # batches of the group still in it (not failed by a seq check)
    supersede: list[tuple[int, int]] = field(default_factory=list)  # (old seq, new seq)
    superseded_bytes: int = 0
    payload_bytes: int = 0
    meta: dict[str, Any] | None = None
    last_seq: int = 0


def seq_problem(pending: Pending, next_seq: int) -> str | None:
    """Why a batch's explicit seqs or last_seq no longer fit above ``next_seq - 1``, if so."""
    if pending.seqs and pending.seqs[0] < next_seq:
        return f"explicit seq {pending.seqs[0]} is not above last seq {next_seq - 1}"
    if pending.last_seq is not None and pending.last_seq < next_seq:
        return f"last_seq {pending.last_seq} is not above last seq {next_seq - 1}"
    return None


def add_stored_values(out: btree.Appender, values: Sequence[bytes | None], cols: fmt.Leaf) -> None:
    """Appends a batch's values and flags to the leaf columns as stored: a delete as None, a
    large value as the position of the value chunk written for it."""
    inline_max = limits.value_inline_bytes_max
    for value in values:
        if value is None:
            cols.vals.append(None)
            cols.flags.append(fmt.FLAG_DELETE)
        elif len(value) > inline_max:
            cols.vals.append(out.add_chunk(fmt.frame_chunk(fmt.CHUNK_VALUE, value)))
            cols.flags.append(fmt.FLAG_VALUE_OUT_OF_LINE)
        else:
            cols.vals.append(value)
            cols.flags.append(0)


def extend_column(
    column: list[Any] | None, part: Sequence[Any] | None, start: int, count: int, fill: Any
) -> list[Any] | None:
    """An optional leaf column (None: all ``start`` entries so far hold ``fill``) with a batch's
    ``count`` entries appended (``part`` None: all ``fill``)."""
    if part is None:
        if column is not None:
            column += repeat(fill, count)
        return column
    if column is None:
        column = [fill] * start
    column += part
    return column


def fill_supersessions(
    build: GroupBuild, existing: dict[bytes, tuple[int, int]], *, unique: bool
) -> None:
    """Fills the leaf's prevs and the supersessions: each entry supersedes the newest earlier
    version of its key, in the group or (``existing``) in the store. When no key repeats within
    the group only the keys found in the store are visited."""
    cols = build.cols
    count = len(cols.keys)
    prevs = [0] * count
    supersede = build.supersede
    superseded_bytes = 0
    if unique:
        if existing:
            found = list(map(existing.get, cols.keys))
            seqs = cols.seqs
            for index in itertools.compress(range(count), found):
                prev_seq, prev_size = found[index]  # type: ignore[misc]
                prevs[index] = prev_seq
                supersede.append((prev_seq, seqs[index]))
                superseded_bytes += prev_size
    else:
        running: dict[bytes, tuple[int, int]] = {}
        for index, (key, seq, size) in enumerate(
            zip(cols.keys, cols.seqs, cols.sizes, strict=True)
        ):
            previous = running.get(key) or existing.get(key)
            if previous is not None:
                prevs[index] = previous[0]
                supersede.append((previous[0], seq))
                superseded_bytes += previous[1]
            running[key] = (seq, size)
    cols.prevs = prevs
    build.superseded_bytes = superseded_bytes
