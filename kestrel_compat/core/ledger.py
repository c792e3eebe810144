"""A queue's durable position in its log, as the backend keeps it: ``GroupLedger``.

Each Kestrel queue is a group on its master queue's log (``kestrel_compat.core.persistence``). What
the backend stores for it is a high-water mark and the seqs above it removed out of order; the
ledger tracks the live seqs (queued items and open reads) and derives that state from them.
"""

from __future__ import annotations

import heapq

from kestrel_compat.core.persistence import GroupState, encode_removed


class GroupLedger:
    """A queue's durable position: hwm plus the seqs above it removed out of order.

    Live seqs are those of queued items and open reads. Every assigned seq of this group that is
    not live is removed, so the hwm is just below the lowest live seq, or the log's tail when
    nothing is live; removed seqs above the hwm go into the blob.
    """

    def __init__(self, hwm: int, removed: set[int] | None = None) -> None:
        self.hwm = hwm
        self._removed: set[int] = set(removed or ())
        self._live: set[int] = set()
        self._heap: list[int] = []
        self.commit_queued = False
        # The state the backend last took, so an unchanged one is not sent again (a `set` to a
        # queue that already holds items changes nothing the backend keeps).
        self.committed: GroupState | None = None
        # Read-behind: every seq above this one named for the group is behind (live, in the log
        # only); None while the queue is not behind or its first behind entry has no seq yet.
        self.behind_after: int | None = None

    def live(self, seq: int) -> None:
        assert seq > self.hwm, "a live seq is above the hwm"
        self._live.add(seq)
        heapq.heappush(self._heap, seq)

    def gone(self, seq: int) -> None:
        self._live.discard(seq)
        if seq > self.hwm:
            self._removed.add(seq)

    def is_removed(self, seq: int) -> bool:
        return seq <= self.hwm or seq in self._removed

    def state(self, tail_seq: int) -> GroupState:
        heap, live = self._heap, self._live
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        hwm = heap[0] - 1 if heap else tail_seq
        if self.behind_after is not None:
            hwm = min(hwm, self.behind_after)
        if hwm > self.hwm:
            self.hwm = hwm
            if self._removed:
                self._removed = {seq for seq in self._removed if seq > hwm}
        # Every removed seq is above the hwm: `gone` keeps only those, and a rising hwm drops the
        # rest above.
        hwm = self.hwm
        return GroupState(hwm=hwm, blob=encode_removed(hwm, sorted(self._removed)))
