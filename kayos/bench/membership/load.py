"""Live load for the benches that measure what a copy costs (``kayos bench failover``, ``kayos
bench grow``; docs/performance.md, "Pacing a copy").

Two kinds of producer, one 100 B message at a time with acks=all:

- **closed loop** (``Producers``, the default): each thread sends its next message when
  the last is acknowledged. On a small shared box it saturates the CPU, so a drop in its rate
  measures CPU sharing as much as the copy's pacing.
- **open loop** (``OpenLoopProducers``, ``--produce-rate N``): messages are due at a fixed offered
  rate, spread evenly over the threads; a message's latency runs from when it was due (a late
  send counts its wait), so a stall shows as latency, not as a quieter producer. The drop is then
  1 - achieved / offered.

Rates over a phase use the median of its whole one-second windows (``median_rate``): a single
mean over 5 s ranged 154-627 acks/s between runs on a shared box.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.manager.member.config import Config

RATE_WINDOW_S = 1.0
# An open-loop thread offers at most this many msgs/s (one message in flight each): at 50/s a
# thread at 13 ms a message is busy 65% of the time and a chain change's backlog took longer to
# work off than the 10 s baseline after it.
OPEN_LOOP_PER_THREAD_PER_S_MAX = 20.0
# An open loop has worked off its backlog when every thread's last ack was due this recently.
OPEN_LOOP_CAUGHT_UP_S = 0.5
FILL_TRIES = 5  # tries of one fill batch


def produce_fill_batch(client: Client, queue: str, items: list[tuple[bytes, bytes]]) -> None:
    """One acks=all batch of a bench's fill, tried up to ``FILL_TRIES`` times: a loaded machine's
    timeout is retried (a duplicate fill is harmless: only the store's size is measured)."""
    for attempt in range(FILL_TRIES):
        try:
            client.produce_batch(queue, items, acks="all")
            return
        except KayosError:
            if attempt == FILL_TRIES - 1:
                raise


@dataclass
class Producers:
    """``count`` threads producing one message at a time with acks=all, in turn to each of
    ``queues``; each ack's call start and end are recorded (monotonic seconds)."""

    urls: list[str]
    count: int
    queues: tuple[str, ...]
    calls: list[tuple[float, float]] = field(default_factory=list)
    # (queue, key) of each acknowledged message, in the order of its ack (``kayos bench grow``
    # consumes them all afterwards: kayos.bench.membership.consumed).
    acked: list[tuple[str, str]] = field(default_factory=list)
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for index in range(self.count):
            thread = threading.Thread(target=self._run, args=(index,), name=f"bench-p{index}")
            thread.start()
            self.threads.append(thread)

    def _run(self, index: int) -> None:
        with Client(self.urls, name=f"bench-closed-{index}") as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                self._send(client, f"p{index}-{n}", n, time.monotonic())

    def _send(self, client: Client, key: str, n: int, began: float) -> None:
        """One acks=all message; its (began, acknowledged) recorded, or an error counted."""
        queue = self.queues[n % len(self.queues)]
        try:
            client.produce(queue, key, "v" * 100, acks="all")
        except KayosError:
            with self.lock:
                self.errors += 1
            return
        with self.lock:
            self.calls.append((began, time.monotonic()))
            self.acked.append((queue, key))

    def caught_up(self) -> bool:
        """A closed loop has no backlog."""
        return True

    def finish(self, timeout_s: float) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout_s)

    def acked_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for _, acked in self.calls if start <= acked < end)

    def first_begun_after(self, moment: float) -> float | None:
        with self.lock:
            done = [acked for began, acked in self.calls if began > moment]
        return min(done) if done else None


@dataclass
class OpenLoopProducers(Producers):
    """``count`` threads that together offer ``rate_per_s`` messages a second; ``calls`` records
    (when due, when acknowledged) for each ack."""

    rate_per_s: float = 0.0
    started_s: float = 0.0
    last_due: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0:
            raise ValueError("the offered rate must be > 0 messages/s")

    def start(self) -> None:
        self.started_s = time.monotonic()
        super().start()

    def _run(self, index: int) -> None:
        interval_s = self.count / self.rate_per_s
        first_s = self.started_s + index / self.rate_per_s
        with Client(self.urls, name=f"bench-open-{index}") as client:
            n = 0
            while not self.stop.is_set():
                due = first_s + n * interval_s
                n += 1
                wait_s = due - time.monotonic()
                # Waiting for the next message's due time: the offered load itself (an Event
                # wait, so a stop ends it at once).
                if wait_s > 0 and self.stop.wait(wait_s):
                    return
                self._send(client, f"o{index}-{n}", n, due)
                with self.lock:
                    self.last_due[index] = due

    def caught_up(self) -> bool:
        """Every thread's last message was due within ``OPEN_LOOP_CAUGHT_UP_S``: no backlog."""
        horizon = time.monotonic() - OPEN_LOOP_CAUGHT_UP_S
        with self.lock:
            dues = [self.last_due.get(index, 0.0) for index in range(self.count)]
        return min(dues) >= horizon


def median_rate(producers: Producers, start_s: float, end_s: float) -> float:
    """The median of the acks/s of the whole ``RATE_WINDOW_S`` windows in [start_s, end_s) (the
    plain rate if the span holds none)."""
    windows = int((end_s - start_s) // RATE_WINDOW_S)
    if windows < 1:
        return producers.acked_between(start_s, end_s) / max(end_s - start_s, 1e-6)
    rates = [
        producers.acked_between(start_s + i * RATE_WINDOW_S, start_s + (i + 1) * RATE_WINDOW_S)
        / RATE_WINDOW_S
        for i in range(windows)
    ]
    return float(statistics.median(rates))


def ack_p99_ms(producers: Producers, start_s: float, end_s: float) -> float | None:
    """The 99th percentile (nearest rank) of the ack latencies (ms) of the messages begun in
    [start_s, end_s) and acknowledged: from the call's start (closed loop) or from when the
    message was due (open loop). By when they began, so a backlog from before (an open loop's
    messages held up by an earlier chain change) is not charged to the phase."""
    with producers.lock:
        latencies = sorted(
            acked - began for began, acked in producers.calls if start_s <= began < end_s
        )
    if not latencies:
        return None
    return round(latencies[max(0, math.ceil(0.99 * len(latencies)) - 1)] * 1000, 1)


def producers_for(
    urls: list[str], count: int, queues: tuple[str, ...], rate_per_s: float | None
) -> Producers:
    """Closed-loop producers, or open-loop ones offering ``rate_per_s`` messages/s (over at least
    ``count`` threads, more if each would offer over ``OPEN_LOOP_PER_THREAD_PER_S_MAX``)."""
    if rate_per_s is None:
        return Producers(urls, count, queues)
    threads = max(count, math.ceil(rate_per_s / OPEN_LOOP_PER_THREAD_PER_S_MAX))
    return OpenLoopProducers(urls, threads, queues, rate_per_s=rate_per_s)


def phase_figures(
    producers: Producers, before: tuple[float, float], during: tuple[float, float]
) -> dict[str, Any]:
    """What a copy cost the producers: acks/s before (median of 1 s windows) and during (acks
    over the phase), the drop (against the offered rate for open-loop producers, else against
    before), and the ack latency p99 of each phase."""
    rate_before = median_rate(producers, *before)
    rate_during = producers.acked_between(*during) / max(during[1] - during[0], 1e-6)
    offered = producers.rate_per_s if isinstance(producers, OpenLoopProducers) else None
    reference = offered if offered is not None else rate_before
    return {
        "load": "closed" if offered is None else "open",
        "produce_offered_per_s": offered,
        "produce_acks_per_s_before": round(rate_before, 1),
        "produce_acks_per_s_during": round(rate_during, 1),
        "produce_drop": round(1 - rate_during / reference, 3) if reference > 0 else None,
        "ack_p99_ms_before": ack_p99_ms(producers, *before),
        "ack_p99_ms_during": ack_p99_ms(producers, *during),
    }


def check_loaded_cluster(shard_mb: int, producers: int, baseline_s: float, after_s: float) -> None:
    """The checks every bench of a loaded cluster changing under producers makes of its sizes
    and phases (grow, restore)."""
    if shard_mb < 0 or producers < 1:
        raise ValueError("shard_mb must be >= 0 and producers >= 1")
    if baseline_s <= 0 or after_s < 0:
        raise ValueError("baseline_s must be > 0 and after_s >= 0")


def check_produce_rate(produce_rate: float | None) -> None:
    """An open loop's offered rate, if any, is positive."""
    if produce_rate is not None and produce_rate <= 0:
        raise ValueError("produce_rate must be > 0 messages/s")


def window_config(detection_window_ms: int, **more: Any) -> Config:
    """The manager's config of a membership bench: its detection window, a node suspected after
    half of it, and ``more`` of the bench's own."""
    window = detection_window_ms
    return Config(detection_window_ms=window, suspect_after_ms=max(1, window // 2), **more)
