"""The retention soak, bounded (docs/retention.md, "Soak"): 10x a disk budget goes through an
until_consumed queue on a real 3-node chain while a consumer keeps up; no node's data directory
ever passes the budget (sampled every 200 ms), and every message produced was consumed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kayos.bench.retention import RetentionSoakParameters, bench_retention

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_disk_use_stays_under_the_budget_while_ten_budgets_go_through(tmp_path: Path) -> None:
    parameters = RetentionSoakParameters(
        budget_bytes=32 * 1024 * 1024, volume_factor=10, batch=50, in_flight=1, deadline_s=240
    )
    result = bench_retention(parameters, str(tmp_path))
    print({k: v for k, v in result.items() if k not in ("machine", "parameters")})
    assert not result["deadline_hit"], result
    assert result["consumed"] == result["messages"] == parameters.messages
    assert result["volume_over_budget"] >= 10
    assert result["samples"] >= 10, "too few samples to say anything"
    assert result["within_budget"], result["peak_disk_bytes"]
    assert set(result["node_exit_codes"].values()) == {0}
