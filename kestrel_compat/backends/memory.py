"""The in-process backend: every item in this process's memory (``MemoryBackend``).

The default backend of ``kayos kestrel`` without ``--cluster``, and the deterministic tests'. It
implements ``kestrel_compat.core.persistence.Backend`` and completes every call at once.
"""

from __future__ import annotations

from collections import deque

from kestrel_compat import limits
from kestrel_compat.core.persistence import BackendError, Entry, GroupState, NewEntry


class MemoryBackend:
    """Everything in this process's memory: the default, and the deterministic tests' backend.

    Seqs come from one counter shared by every log, as a Kayos shard shares one seq space among
    its queues, so the front never relies on seqs being dense. ``fail_next`` makes the next
    call raise ``BackendError`` (tests).
    """

    # Every call finishes without waiting: the front may call it outside a task.
    completes_at_once = True

    def __init__(self) -> None:
        self._seq = 0
        self._logs: dict[str, deque[Entry]] = {}
        self._last_seq: dict[str, int] = {}
        self._groups: dict[str, dict[str, GroupState]] = {}
        self.fail_next = False
        self.closed = False

    def _check(self) -> None:
        if self.closed:
            raise BackendError("backend is closed")
        if self.fail_next:
            self.fail_next = False
            raise BackendError("injected failure")

    async def append(self, log: str, entries: list[NewEntry]) -> list[int]:
        self._check()
        stored = self._logs.get(log)
        if stored is None:
            stored = self._logs[log] = deque()
        seqs = []
        for new in entries:
            self._seq += 1
            stored.append(Entry(self._seq, new.value, new.add_ms, new.expiry_ms, new.groups))
            seqs.append(self._seq)
        if seqs:
            self._last_seq[log] = seqs[-1]
        return seqs

    async def read(self, log: str, after_seq: int, limit: int) -> list[Entry]:
        self._check()
        assert limit > 0
        return [entry for entry in self._logs.get(log, ()) if entry.seq > after_seq][:limit]

    async def commit_group(self, log: str, group: str, state: GroupState) -> None:
        self._check()
        assert len(state.blob) <= limits.group_blob_bytes_max
        groups = self._groups.setdefault(log, {})
        groups[group] = state
        stored = self._logs.get(log)
        if stored is None:
            stored = self._logs[log] = deque()
        # Entries every group has passed are garbage, as Kayos compaction would find them. The
        # log is in seq order: drop its head, one entry at a time, never copying the rest.
        if stored:
            floor = state.hwm if len(groups) == 1 else min(item.hwm for item in groups.values())
            while stored and stored[0].seq <= floor:
                stored.popleft()

    async def load_group(self, log: str, group: str) -> GroupState | None:
        self._check()
        return self._groups.get(log, {}).get(group)

    async def list_logs(self) -> list[str]:
        self._check()
        return sorted(self._logs)

    async def list_groups(self, log: str) -> list[str]:
        self._check()
        return sorted(self._groups.get(log, {}))

    async def delete_group(self, log: str, group: str) -> None:
        self._check()
        self._groups.get(log, {}).pop(group, None)

    async def delete_log(self, log: str) -> None:
        self._check()
        self._logs.pop(log, None)
        self._groups.pop(log, None)

    async def last_seq(self, log: str) -> int:
        self._check()
        return self._last_seq.get(log, 0)

    async def close(self) -> None:
        self.closed = True

    def reopen(self) -> None:
        """Tests: simulate a restart that keeps what was stored (the process's memory)."""
        self.closed = False
