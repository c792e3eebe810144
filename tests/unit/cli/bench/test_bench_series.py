"""The series the benchmarks record for their pictures (kayos/bench/series.py), from times given
here."""

from __future__ import annotations

import pytest

from kayos.bench.series import counts_per_bin, per_bin, quantiles_ms

pytestmark = pytest.mark.unit


def test_counts_per_bin_counts_each_time_in_its_bin_and_leaves_out_the_rest() -> None:
    times = [-0.01, 0.0, 0.05, 0.1, 0.29, 0.3, 0.31]
    assert counts_per_bin(times, 0.0, 0.3, 0.1) == [2, 1, 1]


def test_per_bin_sums_weights() -> None:
    assert per_bin([(0.01, 100.0), (0.02, 50.0), (0.15, 7.0)], 0.0, 0.2, 0.1) == [150.0, 7.0]


def test_an_empty_span_has_no_bins_and_a_bad_bin_is_refused() -> None:
    assert counts_per_bin([1.0], 5.0, 5.0) == []
    with pytest.raises(ValueError, match="bin_s"):
        per_bin([], 0.0, 1.0, 0.0)


def test_quantiles_run_from_the_least_to_the_most_in_milliseconds() -> None:
    samples = [i / 1000 for i in range(1, 1001)]  # 1 .. 1000 ms
    quantiles = quantiles_ms(samples)
    assert len(quantiles) == 101
    assert quantiles[0] == 1.0
    assert quantiles[-1] == 1000.0
    assert quantiles[50] == pytest.approx(500, abs=1)
    assert quantiles == sorted(quantiles)
    assert quantiles_ms([]) == []
