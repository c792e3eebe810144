"""Round-trip and acknowledgement delays to a chain neighbour over a sliding window
(docs/node-api.md, "Status": ``latency``). The cluster manager removes a neighbour whose p99 stays
above its bound (issue 11, slow nodes).

Pure: the caller passes the time (``clock.monotonic_s``) with every call.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kayos import limits


@dataclass(slots=True)
class LatencyWindow:
    """Samples in milliseconds of the last ``limits.latency_window_ms``, at most
    ``limits.latency_samples_max`` of them (the oldest dropped first)."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, now_s: float, sample_ms: float) -> None:
        self.samples.append((now_s, max(0.0, sample_ms)))
        if len(self.samples) > limits.latency_samples_max:
            self.samples.popleft()
        self._expire(now_s)

    def _expire(self, now_s: float) -> None:
        horizon = now_s - limits.latency_window_ms / 1000
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()

    def current(self, now_s: float) -> list[float]:
        self._expire(now_s)
        return [sample for _, sample in self.samples]


def p99(samples: list[float]) -> float:
    """The 99th percentile (nearest rank) of ``samples``; 0.0 when there is none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summary(windows: Iterable[LatencyWindow], now_s: float) -> dict[str, Any]:
    """``{"p99_ms", "window_ms", "samples"}`` over every window given (one neighbour may be linked
    to this node in several shards)."""
    samples = [sample for window in windows for sample in window.current(now_s)]
    return {
        "p99_ms": round(p99(samples), 3),
        "window_ms": limits.latency_window_ms,
        "samples": len(samples),
    }
