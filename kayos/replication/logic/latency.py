"""Round-trip and acknowledgement delays to a chain neighbour over a sliding window
(docs/node-api.md, "Status": ``latency``). The cluster manager removes a neighbour whose p99 stays
above its bound (issue 11, slow nodes).

Pure: the caller passes the time (``clock.monotonic_s``) with every call.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kayos import limits


@dataclass(slots=True)
class Bucket:
    """The samples of one ``limits.latency_bucket_ms`` of time: how many, and the largest
    ``limits.latency_bucket_top_max`` of them, which hold the bucket's p99 exactly up to
    100 times that many samples (past it, the smallest kept one, at or above the p99)."""

    index: int
    count: int = 0
    largest: list[float] = field(default_factory=list)  # a min-heap

    def add(self, sample_ms: float) -> None:
        self.count += 1
        if len(self.largest) < limits.latency_bucket_top_max:
            heapq.heappush(self.largest, sample_ms)
        elif sample_ms > self.largest[0]:
            heapq.heapreplace(self.largest, sample_ms)


@dataclass(slots=True)
class LatencyWindow:
    """Samples in milliseconds of the last ``limits.latency_window_ms``, at most
    ``limits.latency_samples_max`` of them (the oldest dropped first), and per bucket of
    ``limits.latency_bucket_ms`` the last ``limits.latency_buckets`` buckets' counts and
    largest samples (kept whatever the sample rate)."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)
    buckets: deque[Bucket] = field(default_factory=deque)

    def add(self, now_s: float, sample_ms: float) -> None:
        sample_ms = max(0.0, sample_ms)
        self.samples.append((now_s, sample_ms))
        if len(self.samples) > limits.latency_samples_max:
            self.samples.popleft()
        self._expire(now_s)
        index = bucket_index(now_s)
        if not self.buckets or self.buckets[-1].index < index:
            self.buckets.append(Bucket(index))
        self.buckets[-1].add(sample_ms)

    def _expire(self, now_s: float) -> None:
        horizon = now_s - limits.latency_window_ms / 1000
        while self.samples and self.samples[0][0] < horizon:
            self.samples.popleft()
        oldest = bucket_index(now_s) - limits.latency_buckets
        while self.buckets and self.buckets[0].index < oldest:
            self.buckets.popleft()

    def current(self, now_s: float) -> list[float]:
        self._expire(now_s)
        return [sample for _, sample in self.samples]


def bucket_index(now_s: float) -> int:
    return math.floor(now_s * 1000 / limits.latency_bucket_ms)


def p99(samples: list[float]) -> float:
    """The 99th percentile (nearest rank) of ``samples``; 0.0 when there is none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def summary(windows: Iterable[LatencyWindow], now_s: float) -> dict[str, Any]:
    """``{"p99_ms", "window_ms", "samples", "bucket_ms", "recent_p99_ms"}`` over every window
    given (one neighbour may be linked to this node in several shards): ``recent_p99_ms`` is the
    p99 of each of the last ``limits.latency_buckets`` whole buckets before the current one,
    oldest first, ``None`` for a bucket with no sample."""
    windows = list(windows)
    samples = [sample for window in windows for sample in window.current(now_s)]
    return {
        "p99_ms": round(p99(samples), 3),
        "window_ms": limits.latency_window_ms,
        "samples": len(samples),
        "bucket_ms": limits.latency_bucket_ms,
        "recent_p99_ms": recent_p99(windows, bucket_index(now_s)),
    }


def recent_p99(windows: list[LatencyWindow], current: int) -> list[float | None]:
    first = current - limits.latency_buckets
    merged: dict[int, tuple[int, list[float]]] = {}
    for window in windows:
        for bucket in window.buckets:
            if first <= bucket.index < current:
                count, largest = merged.get(bucket.index, (0, []))
                merged[bucket.index] = (count + bucket.count, largest + bucket.largest)
    out: list[float | None] = []
    for index in range(first, current):
        if index not in merged:
            out.append(None)
            continue
        count, largest = merged[index]
        out.append(round(bucket_p99(count, largest), 3))
    return out


def bucket_p99(count: int, largest: list[float]) -> float:
    """The p99 (nearest rank) of ``count`` samples of which ``largest`` are the biggest."""
    top = sorted(largest, reverse=True)[: limits.latency_bucket_top_max]
    rank_from_top = count - max(1, math.ceil(0.99 * count)) + 1  # 1 is the largest
    return top[min(rank_from_top, len(top)) - 1]
