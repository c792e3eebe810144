"""Recently accepted batches of a replica, kept as ready ``BATCH`` frames for its links.

A link forwards these instead of reading their entries back from the store. Bounded (by
``limits.replica_recent_batches_max`` batches and ``limits.replica_recent_bytes_max`` bytes); a
miss falls back to the store, so what is kept here is an optimisation, never the truth.
"""

from __future__ import annotations

from collections import deque

from kayos import limits
from kayos.replication.wire import frames as fr


class RecentBatches:
    """Accepted batches by first seq, oldest dropped first."""

    def __init__(self) -> None:
        self._batches: dict[int, tuple[fr.Batch, int]] = {}
        self._order: deque[tuple[int, int]] = deque()
        self._bytes = 0

    def remember(self, batch: fr.Batch, size_bytes: int) -> None:
        self._batches[batch.first_seq] = (batch, size_bytes)
        self._order.append((batch.first_seq, size_bytes))
        self._bytes += size_bytes
        while self._order and (
            len(self._order) > limits.replica_recent_batches_max
            or self._bytes > limits.replica_recent_bytes_max
        ):
            first, size = self._order.popleft()
            self._batches.pop(first, None)
            self._bytes -= size

    def batch(self, first_seq: int) -> fr.Batch | None:
        found = self._batches.get(first_seq)
        return found[0] if found is not None else None

    def run(self, first_seq: int) -> list[fr.Batch]:
        """Remembered batches from ``first_seq`` on, consecutive, as many as one ``BATCH`` frame
        holds (at least one, if ``first_seq`` is remembered at all)."""
        run: list[fr.Batch] = []
        entries = size = meta_entries = 0
        while (found := self._batches.get(first_seq)) is not None:
            batch, batch_size = found
            batch_meta = len(batch.meta) if batch.meta else 0
            if run and (
                entries + len(batch.seqs) > limits.batch_entries_max
                or size + batch_size > limits.batch_bytes_max
                or meta_entries + batch_meta > limits.frame_meta_entries_max
            ):
                break
            run.append(batch)
            entries += len(batch.seqs)
            size += batch_size
            meta_entries += batch_meta
            first_seq = batch.last_seq + 1
        return run

    def clear(self) -> None:
        self._batches.clear()
        self._order.clear()
        self._bytes = 0
