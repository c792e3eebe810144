"""Consume pages: a consumer snapshot read out of a replica's store, and a group's lag.

``Node.consume`` and ``Node.group_info`` decide who may read and wait for the commit point; the
functions here only read, a store snapshot at a time, in a worker thread: ``read_page`` cuts one
page of ``(after, boundary]`` into columns, ``count_unread`` counts a group's unread entries and
``lag_seconds`` ages the oldest of them. They are apart from ``kayos.node.runtime`` because they
hold no node state: a replica in, a ``Page`` or a count out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import and_, itemgetter
from typing import Any, NamedTuple

from kayos import limits
from kayos.replication.shard.replica import ShardReplica, queue_prefix
from kayos.storage import Entry
from kayos.storage.disk.format import FLAG_DELETE

# Column positions in the store's ``Entry`` tuples (read_page transposes pages of them).
_SEQ, _KEY, _VALUE, _EXPIRY, _HEADERS, _FLAGS = (
    Entry._fields.index(name) for name in ("seq", "key", "value", "expiry_ms", "headers", "flags")
)


@dataclass(frozen=True, slots=True)
class Message:
    seq: int
    key: bytes
    value: bytes | None
    expiry_ms: int
    headers: dict[str, bytes] | None
    deleted: bool


@dataclass(frozen=True, slots=True)
class Page:
    """One consume page, column by column: ``seqs[i]``, ``keys[i]`` (without the queue prefix),
    ``values[i]`` (None for a delete) describe message i. The optional columns are None when no
    message of the page has one: ``expiries_ms`` (all 0), ``headers`` (all None), ``deleted``
    (no tombstone). ``times`` is None unless the consumer asked for the time-index samples
    (``TimeIndex.covering``; docs/node-api.md, "Append times")."""

    shard: int
    group: str
    hwm: int
    boundary: int
    seqs: list[int]
    keys: list[bytes]
    values: list[bytes | None]
    expiries_ms: list[int] | None
    headers: list[dict[str, bytes] | None] | None
    deleted: list[bool] | None
    next: int
    end: bool
    times: list[tuple[int, int | None]] | None = None

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def messages(self) -> list[Message]:
        """The page as one ``Message`` per entry (the JSON reply's shape)."""
        count = len(self.seqs)
        return list(
            map(
                Message,
                self.seqs,
                self.keys,
                self.values,
                self.expiries_ms if self.expiries_ms is not None else repeat(0, count),
                self.headers if self.headers is not None else repeat(None, count),
                self.deleted if self.deleted is not None else repeat(False, count),
            )
        )


class Unread(NamedTuple):
    """A group's unread entries as ``scan_unread`` found them: ``lag`` entries of the queue in
    ``(hwm, boundary]`` among those looked at, ``complete`` False when it stopped early (then
    ``through`` is the last seq looked at, and the seqs of ``(through, boundary]`` are unread
    but not looked at), ``oldest`` the seq of the first of them (None: none found), ``scanned``
    the entries of every queue looked at."""

    boundary: int
    lag: int
    complete: bool
    oldest: int | None
    through: int
    scanned: int


def scan_unread(replica: ShardReplica, queue: str, hwm: int, scan_max: int) -> Unread:
    """The entries of ``queue`` in ``(hwm, boundary]`` as of the boundary (the member's commit
    point), as ``read_page`` would return them, looking at about ``scan_max`` entries at most
    (whole store pages: it stops after the page that reaches it)."""
    prefix = queue_prefix(queue)
    lag = scanned = 0
    oldest: int | None = None
    with replica.store.snapshot() as snap:
        boundary = min(snap.boundary, replica.commit_point)
        if hwm >= boundary:
            return Unread(boundary, 0, True, None, boundary, 0)
        for entries in snap.pages(hwm, boundary, as_of=boundary):
            scanned += len(entries)
            mine: Iterator[bool] = map(
                bytes.startswith, map(itemgetter(_KEY), entries), repeat(prefix)
            )
            if oldest is None:
                flags = list(mine)
                with contextlib.suppress(ValueError):
                    oldest = entries[flags.index(True)].seq
                mine = iter(flags)
            lag += sum(mine)
            if scanned >= scan_max and entries and entries[-1].seq < boundary:
                return Unread(boundary, lag, False, oldest, entries[-1].seq, scanned)
    return Unread(boundary, lag, True, oldest, boundary, scanned)


def count_unread(replica: ShardReplica, queue: str, hwm: int) -> tuple[int, int, bool, int | None]:
    """``(boundary, lag, complete, oldest)`` of ``scan_unread``, looking at no more than
    ``limits.group_lag_scan_entries_max`` entries (``complete`` is False when it stopped
    there)."""
    found = scan_unread(replica, queue, hwm, limits.group_lag_scan_entries_max)
    return found.boundary, found.lag, found.complete, found.oldest


def lag_seconds(replica: ShardReplica, oldest: int | None, now_s: float) -> float | None:
    """The age in seconds of the entry ``oldest`` (the oldest unread one) by ``replica``'s time
    index: 0.0 when there is none, None when its time is unknown here."""
    if oldest is None:
        return 0.0
    accepted_ms = replica.time_index.time_of(oldest)
    if accepted_ms is None:
        return None
    return round(max(0.0, now_s - accepted_ms / 1000), 3)


def read_page(
    replica: ShardReplica,
    queue: str,
    group: str,
    hwm: int,
    after: int,
    upto: int | None,
    limit: int,
) -> Page:
    """One page of a consumer snapshot ``(after, boundary]``, read as of the boundary.

    The columns are cut from the store's entry tuples a store page at a time (``zip`` and ``map``
    run in C), with no object per message: entries of the shard's other queues are dropped with
    ``compress`` only in the store pages that hold any."""
    prefix = queue_prefix(queue)
    seqs: list[int] = []
    keys: list[bytes] = []
    values: list[bytes | None] = []
    expiries: list[int] = []
    headers: list[dict[str, bytes] | None] = []
    flags: list[int] = []
    with replica.store.snapshot() as snap:
        # Up to the commit point only: what this tail holds past it is not yet on every member.
        visible = min(snap.boundary, replica.commit_point)
        boundary = visible if upto is None else min(upto, visible)
        last_seen = boundary
        for entries in snap.pages(after, boundary, as_of=boundary):
            if not entries:
                continue
            columns: list[Sequence[Any]] = list(zip(*entries, strict=True))
            ours = list(map(bytes.startswith, columns[_KEY], repeat(prefix)))
            if False in ours:  # entries of the shard's other queues
                columns = [tuple(compress(column, ours)) for column in columns]
            room = limit - len(seqs)
            full = len(columns[_SEQ]) >= room
            if full:
                columns = [column[:room] for column in columns]
                last_seen = columns[_SEQ][-1]
            seqs += columns[_SEQ]
            keys += columns[_KEY]
            values += columns[_VALUE]
            expiries += columns[_EXPIRY]
            headers += columns[_HEADERS]
            flags += columns[_FLAGS]
            if full:
                break
    if after > boundary:
        # The group's mark can run ahead of this replica (metadata may arrive a moment before the
        # seqs it names): an empty snapshot that ends where the group is, so that committing its
        # boundary never moves the mark back.
        boundary = last_seen = after
    end = last_seen >= boundary
    deletes = list(map(and_, flags, repeat(FLAG_DELETE)))
    return Page(
        replica.shard_id,
        group,
        hwm,
        boundary,
        seqs,
        list(map(itemgetter(slice(len(prefix), None)), keys)),
        values,
        expiries if any(expiries) else None,
        None if headers.count(None) == len(headers) else headers,
        list(map(bool, deletes)) if any(deletes) else None,
        last_seen,
        end,
    )
