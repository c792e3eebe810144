"""A simulated shard store: what survives a crash, and the writes a crash loses."""

from __future__ import annotations

from dataclasses import dataclass

from kayos.replication.logic.chain import TakeoverTable


@dataclass(frozen=True, slots=True)
class Entry:
    """One seq of a shard's log: a version of ``key``, or (``group`` set) a consumer group's
    high-water mark committed as ``hwm``."""

    seq: int
    key: str
    value: str | None
    group: str = ""
    hwm: int = 0


Batch = tuple[Entry, ...]


class Store:
    """What survives a crash: synced batches, the takeover table, the persisted commit point and
    the node's record of the shard's chain and of the catch-up followers it counts in its
    commit (recorded as they change, like the chain). ``pending`` is written but not synced."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.pending: list[Batch] = []
        self.table: TakeoverTable = []
        self.commit_point = 0
        self.chain: tuple[str, ...] = ()
        self.epoch = 0
        self.counted: frozenset[str] = frozenset()
        # The groups' marks as the real store's metadata holds them (one map, not kept per seq):
        # set as mark entries become durable, kept through a truncation, replaced from the log
        # when the first batch of a link lands. Read only by the plant ``mark_past_point``.
        self.marks: dict[str, int] = {}

    def durable_last(self) -> int:
        return self.batches[-1][-1].seq if self.batches else 0

    def last(self) -> int:
        return self.pending[-1][-1].seq if self.pending else self.durable_last()

    def crash(self) -> None:
        self.pending = []

    def batches_from(self, seq: int) -> list[Batch]:
        """Every batch holding seqs from ``seq`` on, the first cut to start at ``seq``."""
        out: list[Batch] = []
        for batch in reversed(self.batches + self.pending):
            if batch[-1].seq < seq:
                break
            out.append(tuple(e for e in batch if e.seq >= seq) if batch[0].seq < seq else batch)
        out.reverse()
        return out

    def truncate(self, seq: int) -> None:
        kept: list[Batch] = []
        for batch in self.batches:
            if batch[-1].seq <= seq:
                kept.append(batch)
            elif batch[0].seq <= seq:
                kept.append(tuple(e for e in batch if e.seq <= seq))
        self.batches = kept
        if seq == 0:
            self.table = []
            self.marks = {}

    def marks_upto(self, seq: int) -> dict[str, int]:
        """Each group's last mark in the log through ``seq``."""
        return {e.group: e.hwm for e in self.entries_upto(seq) if e.group}

    def entries_upto(self, seq: int) -> list[Entry]:
        out: list[Entry] = []
        for batch in self.batches + self.pending:
            for entry in batch:
                if entry.seq > seq:
                    return out
                out.append(entry)
        return out
