"""``KayosBackend.read`` below a queue's retention floor (docs/kestrel-compat.md §10): it goes on
from the floor, as a Kestrel reader gets the next live item and never an error for items that are
gone. The client is a fake that answers as a node does (docs/retention.md, "Below the floor"):
``RetentionGapError`` with the floor for a start below it, else the live entries after the start;
so nothing here depends on when a node's retention tick runs."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from kayos import AsyncClient
from kayos.client.types import Message, Page
from kayos.errors import RetentionGapError
from kestrel_compat.backends.kayos_backend import KayosBackend, entry_headers, queue_for
from kestrel_compat.core.persistence import BackendError, NewEntry

pytestmark = pytest.mark.unit


class _Topology:
    def shards_for(self, queue: str) -> list[int]:
        return [0]


class FloorClient:
    """One shard holding ``entries`` (seq -> value) above the retention floor ``floor``."""

    def __init__(self, entries: dict[int, bytes], floor: int, *, reported_floor: int | None = None):
        self.entries = entries
        self.floor = floor
        self.reported_floor = floor if reported_floor is None else reported_floor
        self.topology = _Topology()
        self.reads: list[int] = []

    async def read(self, queue: str, *, after: int, limit: int, shard: int) -> Page:
        assert (queue, shard) == (queue_for("jobs"), 0)
        self.reads.append(after)
        if after < self.floor:
            raise RetentionGapError(
                f"position {after} is below {self.floor}", floor=self.reported_floor
            )
        seqs = sorted(seq for seq in self.entries if seq > after)[:limit]
        boundary = max(self.entries, default=0)
        headers = entry_headers(NewEntry(b"", 1000, None, ("jobs",)))
        messages = [Message(seq, b"k%d" % seq, self.entries[seq], 0, headers) for seq in seqs]
        last = seqs[-1] if seqs else boundary
        return Page(0, "_read", after, boundary, messages, last, last >= boundary)


def read(client: FloorClient, after: int, limit: int = 10) -> list[tuple[int, bytes]]:
    backend = KayosBackend(cast(AsyncClient, client))
    return [(entry.seq, entry.value) for entry in asyncio.run(backend.read("jobs", after, limit))]


def test_a_read_below_the_floor_goes_on_from_the_next_live_entry() -> None:
    # CI's interleaving: group "jobs" confirmed seq 2 while it was the only group, the head's
    # tick raised the floor to 2, and "jobs+audit" registered at 0 afterwards.
    client = FloorClient({3: b"two"}, floor=2)
    assert read(client, 0) == [(3, b"two")]
    assert client.reads == [0, 2]
    # At or above the floor nothing changes.
    client.reads.clear()
    assert read(client, 2) == [(3, b"two")]
    assert client.reads == [2]


def test_a_floor_at_the_end_of_the_log_reads_nothing() -> None:
    assert read(FloorClient({}, floor=7), 0) == []


def test_a_gap_without_a_floor_above_the_start_is_still_an_error() -> None:
    # A node that names no usable floor gives the reader nowhere to go on from: it must not loop.
    client = FloorClient({3: b"two"}, floor=2, reported_floor=0)
    with pytest.raises(BackendError, match="below"):
        read(client, 0)
    assert client.reads == [0]
