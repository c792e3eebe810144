"""Time, injected. Logic takes a ``Clock``; only drivers use the system clock."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Wall time in seconds since the epoch (for expiry, stats)."""

    def monotonic_s(self) -> float:
        """Monotonic seconds (for timeouts and durations)."""


class SystemClock:
    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told. Thread-safe."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now_s = start_s
        self._monotonic_s = 0.0

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def monotonic_s(self) -> float:
        with self._lock:
            return self._monotonic_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "time does not run backwards"
        with self._lock:
            self._now_s += seconds
            self._monotonic_s += seconds


SYSTEM_CLOCK = SystemClock()
