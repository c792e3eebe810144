"""Time series and distributions the benchmarks record for their pictures (``--plot``,
kayos/bench/plots.py; docs/benchmarks.md): pure functions of recorded times, kept small enough
to go in the JSON (a count per bin, a latency's quantiles), and a sampler thread for what can
only be read while it happens (the bytes a node has copied).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

# The bin of the throughput and acknowledgement series: fine enough to show a failover's gap
# (writes resume within a few hundred ms), coarse enough that a bin holds several acks.
BIN_S = 0.1
# Points of a recorded latency distribution: the 0th to the 100th percentile.
QUANTILE_POINTS = 101


def per_bin(
    events: Iterable[tuple[float, float]], start_s: float, end_s: float, bin_s: float = BIN_S
) -> list[float]:
    """The sum of the weights of ``events`` ((time, weight) pairs) in each ``bin_s`` bin of
    [start_s, end_s); events outside the span are left out."""
    if bin_s <= 0:
        raise ValueError("bin_s must be > 0")
    bins = [0.0] * max(0, math.ceil((end_s - start_s) / bin_s))
    for at_s, weight in events:
        index = math.floor((at_s - start_s) / bin_s)
        if start_s <= at_s < end_s and 0 <= index < len(bins):
            bins[index] += weight
    return bins


def counts_per_bin(
    times: Iterable[float], start_s: float, end_s: float, bin_s: float = BIN_S
) -> list[int]:
    """How many of ``times`` fall in each ``bin_s`` bin of [start_s, end_s)."""
    return [round(v) for v in per_bin(((t, 1.0) for t in times), start_s, end_s, bin_s)]


def quantiles_ms(samples_s: Sequence[float], points: int = QUANTILE_POINTS) -> list[float]:
    """``points`` evenly spaced quantiles (nearest rank, the 0th to the 100th percentile) of
    latencies in seconds, in milliseconds: a CDF small enough for the JSON."""
    if points < 2:
        raise ValueError("points must be >= 2")
    if not samples_s:
        return []
    ordered = sorted(samples_s)
    last = len(ordered) - 1
    return [round(ordered[round(i * last / (points - 1))] * 1000, 3) for i in range(points)]


class Sampler:
    """Calls ``read()`` every ``period_s`` on a thread of its own, from ``start()`` until
    ``stop()``, and keeps [seconds since ``origin``, value] pairs (a failing read is skipped)."""

    def __init__(self, read: Callable[[], float], period_s: float, origin: float) -> None:
        self.read = read
        self.period_s = period_s
        self.origin = origin
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                value = self.read()
            except OSError:  # a file gone between listing and stat: the next sample counts
                value = None
            if value is not None:
                self.samples.append([round(time.monotonic() - self.origin, 3), round(value, 3)])
            self._stop.wait(self.period_s)  # the sampling period (an Event wait: stop ends it)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.samples
