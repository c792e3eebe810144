"""A simulated shard store: what survives a crash, and the writes a crash loses."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.sim.producers import Window, record
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
    # The idempotent producer's id (hex) and producer seq of the call that wrote it ("": none).
    producer: str = ""
    pseq: int = 0


Batch = tuple[Entry, ...]


class Store:
    """What survives a crash: synced batches, the takeover table, the persisted commit point and
    the node's record of the shard's chain and of the catch-up followers it counts in its
    commit (recorded as they change, like the chain). ``pending`` is written but not synced.
    ``producers`` is each producer's window over the log written so far (chaos/sim/producers.py),
    rebuilt from the log whenever writes are lost."""

    def __init__(self, window_entries: int = 64) -> None:
        self.batches: list[Batch] = []
        self.pending: list[Batch] = []
        self.window_entries = window_entries
        self.producers: dict[str, Window] = {}
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
        self.drop_pending(0)

    def add_pending(self, batch: Batch) -> None:
        """A write (not yet synced)."""
        self.pending.append(batch)
        self._index(batch)

    def drop_pending(self, kept: int) -> None:
        """Loses the writes not yet synced past the first ``kept``."""
        if len(self.pending) > kept:
            del self.pending[kept:]
            self._reindex()

    def _index(self, batch: Batch) -> None:
        for entry in batch:
            if entry.producer:
                window = self.producers.setdefault(entry.producer, {})
                record(window, entry.pseq, entry.seq, self.window_entries)

    def log(self) -> list[tuple[int, str, int]]:
        """(seq, producer id, producer seq) of every entry written, in order."""
        return [(e.seq, e.producer, e.pseq) for b in self.batches + self.pending for e in b]

    def _reindex(self) -> None:
        self.producers = {}
        for batch in self.batches + self.pending:
            self._index(batch)

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
        self._reindex()

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
