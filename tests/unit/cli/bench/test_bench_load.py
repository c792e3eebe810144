"""The bench load figures (kayos.bench.membership.load): the baseline as the median of 1 s windows,
the drop against the offered rate for an open loop, and the ack latency p99; recorded calls are
given, no cluster runs."""

from __future__ import annotations

import time

import pytest

from kayos.bench.membership.load import (
    OpenLoopProducers,
    Producers,
    ack_p99_ms,
    median_rate,
    phase_figures,
    producers_for,
)

pytestmark = pytest.mark.unit


def _closed(calls: list[tuple[float, float]]) -> Producers:
    producers = Producers(["http://127.0.0.1:1"], 1, ("q",))
    producers.calls.extend(calls)
    return producers


def test_median_rate_ignores_one_noisy_window() -> None:
    # 100 acks a second for 10 s, but 900 in the fourth second: the mean would say 180/s.
    calls = [(t / 100, t / 100 + 0.001) for t in range(1000)]
    calls += [(3.5, 3.5 + k / 10_000) for k in range(800)]
    producers = _closed(calls)
    assert median_rate(producers, 0.0, 10.0) == pytest.approx(100.0)
    assert producers.acked_between(0.0, 10.0) / 10 == pytest.approx(180.0)


def test_median_rate_of_a_span_shorter_than_a_window_is_its_plain_rate() -> None:
    producers = _closed([(0.0, 0.1), (0.0, 0.2), (0.0, 0.3)])
    assert median_rate(producers, 0.0, 0.5) == pytest.approx(6.0)


def test_ack_p99_is_nearest_rank() -> None:
    calls = [(float(i), float(i) + 0.010) for i in range(99)] + [(99.0, 99.5)]
    producers = _closed(calls)
    assert ack_p99_ms(producers, 0.0, 100.0) == pytest.approx(10.0)
    assert ack_p99_ms(producers, 0.0, 101.0) == pytest.approx(10.0)  # 99th of 100: not the max
    producers.calls.append((100.0, 101.0))
    assert ack_p99_ms(producers, 0.0, 200.0) == pytest.approx(500.0)
    assert ack_p99_ms(producers, 500.0, 600.0) is None


def test_open_loop_drop_is_against_the_offered_rate() -> None:
    producers = producers_for(["http://127.0.0.1:1"], 2, ("q",), 50.0)
    assert isinstance(producers, OpenLoopProducers)
    # 50/s before; during, 40/s acknowledged (the rest late or lost): a drop of 0.2.
    producers.calls.extend((t / 50, t / 50 + 0.004) for t in range(500))
    producers.calls.extend((10 + t / 40, 10 + t / 40 + 0.020) for t in range(400))
    figures = phase_figures(producers, (0.0, 10.0), (10.0, 20.0))
    assert figures["load"] == "open"
    assert figures["produce_offered_per_s"] == 50.0
    assert figures["produce_drop"] == pytest.approx(0.2)
    assert figures["ack_p99_ms_before"] == pytest.approx(4.0)
    assert figures["ack_p99_ms_during"] == pytest.approx(20.0)


def test_closed_loop_drop_is_against_before() -> None:
    producers = producers_for(["http://127.0.0.1:1"], 1, ("q",), None)
    assert not isinstance(producers, OpenLoopProducers)
    producers.calls.extend((t / 200, t / 200 + 0.001) for t in range(2000))
    producers.calls.extend((10 + t / 150, 10 + t / 150 + 0.002) for t in range(1500))
    figures = phase_figures(producers, (0.0, 10.0), (10.0, 20.0))
    assert figures["load"] == "closed"
    assert figures["produce_offered_per_s"] is None
    assert figures["produce_drop"] == pytest.approx(0.25)


def test_open_loop_threads_and_backlog() -> None:
    producers = producers_for(["http://127.0.0.1:1"], 4, ("q",), 200.0)
    assert isinstance(producers, OpenLoopProducers)
    assert producers.count == 10  # at most OPEN_LOOP_PER_THREAD_PER_S_MAX (20) a thread
    assert producers_for(["http://127.0.0.1:1"], 4, ("q",), 30.0).count == 4
    assert not producers.caught_up()  # no thread has sent anything yet
    now = time.monotonic()
    producers.last_due.update(dict.fromkeys(range(10), now))
    assert producers.caught_up()
    producers.last_due[3] = now - 5.0  # one thread 5 s behind its schedule
    assert not producers.caught_up()
    assert Producers(["http://127.0.0.1:1"], 1, ("q",)).caught_up()


def test_an_offered_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="offered rate"):
        OpenLoopProducers(["http://127.0.0.1:1"], 1, ("q",), rate_per_s=0.0)
