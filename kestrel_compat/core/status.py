"""The server status of spec §7: the statuses a client may read or set, and how they take effect.

``ServerStatus`` is the vocabulary every protocol reads and sets (each codec parses its own words
into it); ``StatusKeeper`` is Kestrel's ServerStatus object: a stricter status is enforced after a
grace period, a looser one at once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from kayos.clock import Clock
from kestrel_compat.core.now import now_ms


class ServerStatus(enum.Enum):
    """The statuses a client may read or set (spec §7); the value is the word STATUS replies."""

    UP = "UP"
    READONLY = "READONLY"
    QUIESCENT = "QUIESCENT"
    WRITEAVOID = "WRITEAVOID"


_STRICTNESS = {
    ServerStatus.UP: 1,
    ServerStatus.WRITEAVOID: 2,
    ServerStatus.READONLY: 3,
    ServerStatus.QUIESCENT: 4,
}
_BLOCKS_READS = {ServerStatus.QUIESCENT}
_BLOCKS_WRITES = {ServerStatus.READONLY, ServerStatus.QUIESCENT}


class StatusKeeper:
    """Kestrel's ServerStatus (spec §7): a stricter status is enforced after the grace period, a
    looser one at once; while a stricter change is pending, another stricter one is refused."""

    def __init__(
        self,
        clock: Clock,
        *,
        initial: ServerStatus,
        grace_period_ms: int,
        store: Callable[[ServerStatus], None] | None = None,
    ) -> None:
        self._clock = clock
        self._grace_period_ms = grace_period_ms
        self._store = store
        self.current = initial
        self._enforced = initial
        self._pending_since_ms: int | None = None

    def _operation_status(self) -> ServerStatus:
        pending_since_ms = self._pending_since_ms
        if pending_since_ms is not None and (
            now_ms(self._clock) >= pending_since_ms + self._grace_period_ms
        ):
            self._enforced = self.current
            self._pending_since_ms = None
        return self._enforced

    @property
    def blocks_reads(self) -> bool:
        return self._operation_status() in _BLOCKS_READS

    @property
    def blocks_writes(self) -> bool:
        return self._operation_status() in _BLOCKS_WRITES

    def set(self, status: ServerStatus) -> None:
        self._operation_status()
        old = self.current
        stricter = _STRICTNESS[status] > _STRICTNESS[old]
        if stricter and self._pending_since_ms is not None:
            return  # Kestrel rejects (and only logs) a stricter change while one is pending.
        self.current = status
        if stricter and self._grace_period_ms > 0:
            self._pending_since_ms = now_ms(self._clock)
        else:
            self._pending_since_ms = None
            self._enforced = status
        if self._store is not None:
            self._store(status)
