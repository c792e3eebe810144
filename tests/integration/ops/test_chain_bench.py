"""`kayos bench produce` end to end on a small workload: the figures are there and add up."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from kayos.bench.produce import percentile_ms
from kayos.cli.main import cli

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration


def test_percentile_is_nearest_rank() -> None:
    samples = [n / 1000 for n in range(1, 101)]  # 1 .. 100 ms
    assert percentile_ms(samples, 0.50) == 50.0
    assert percentile_ms(samples, 0.99) == 99.0
    assert percentile_ms([0.002], 0.99) == 2.0


def test_bench_produce_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "produce.json"
    result = CliRunner().invoke(
        cli,
        [
            "bench", "produce", "--messages", "2000", "--in-flight", "4", "--singles", "20",
            "--json", "--out", str(out), "--dir", str(tmp_path / "bench"),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures == json.loads(result.output)
    assert figures["consumed"] == 2000
    assert figures["node_exit_codes"] == {"a": 0, "b": 0, "c": 0}
    for name in ("msgs_per_s", "commit_p50_ms", "commit_p99_ms", "single_commit_p99_ms"):
        assert figures[name] > 0, name
    assert figures["commit_p50_ms"] <= figures["commit_p99_ms"]
    assert figures["consume_msgs_per_s"] > 0
    assert figures["machine"]["cpu_count"] >= 1
    assert figures["parameters"]["replicas"] == 3


def test_bench_produce_compares_a_sharded_queue_in_the_same_run(tmp_path: Path) -> None:
    out = tmp_path / "sharded.json"
    result = CliRunner().invoke(
        cli,
        [
            "bench", "produce", "--messages", "1500", "--in-flight", "4", "--singles", "0",
            "--queue-shards", "3", "--json", "--out", str(out), "--dir", str(tmp_path / "bench"),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["consumed"] == 1500
    assert figures["sharded_consumed"] == 1500
    assert figures["parameters"]["shards"] == 3
    assert figures["parameters"]["queue_shards"] == 3
    for name in ("msgs_per_s", "sharded_msgs_per_s", "sharded_commit_p99_ms"):
        assert figures[name] > 0, name
    ratio = figures["sharded_msgs_per_s"] / figures["msgs_per_s"]
    assert abs(figures["sharded_vs_one_ratio"] - ratio) < 0.05 * ratio + 0.01
    for phase in ("one_shard", "sharded"):
        cpu = figures["cpu"][phase]
        assert cpu["cpu_seconds"] > 0, cpu
        assert 0 < cpu["machine_busy_share"] <= 1, cpu
        assert cpu["cpu_ms_per_1k_msgs"] == pytest.approx(
            cpu["cpu_seconds"] * 1e6 / 1500,
            abs=5,  # cpu_seconds is rounded to 10 ms
        )
    bad = CliRunner().invoke(cli, ["bench", "produce", "--queue-shards", "0"])
    assert bad.exit_code != 0
    assert "queue_shards must be" in bad.output


def test_bench_produce_measures_a_cluster_with_tls_and_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kayos.auth.keys import new_secret
    from kayos.cli.address import CREDENTIALS_ENV

    monkeypatch.delenv(CREDENTIALS_ENV, raising=False)  # the option sets it: undone after
    credentials = tmp_path / "bench-client.json"
    credentials.write_text(json.dumps({"name": "bench-client", "secret": new_secret().text()}))
    result = CliRunner().invoke(
        cli,
        [
            "bench", "produce", "--messages", "1000", "--in-flight", "4", "--singles", "10",
            "--replicas", "2", "--tls", "--credentials", str(credentials), "--json",
            "--dir", str(tmp_path / "bench"),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["consumed"] == 1000
    assert figures["parameters"]["tls"] is True
    assert figures["parameters"]["credentials"] == str(credentials)
    # Every node held the credential (its table on disk), and none refused the bench's client.
    tables = sorted((tmp_path / "bench").rglob("credentials.json"))
    assert len(tables) == 2, tables
    for table in tables:
        assert "bench-client" in json.loads(table.read_text())["credentials"]
    logs = sorted((tmp_path / "bench").rglob("*.log"))
    assert logs
    assert not [path for path in logs if "refused" in path.read_text()]
