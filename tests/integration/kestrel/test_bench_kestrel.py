"""`kayos bench kestrel` end to end with tiny counts: every scenario is there with its figures,
against the memory-backed front, the cluster-backed front and (when on PATH) memcached."""

from __future__ import annotations

import json
import shutil
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration
pytest.importorskip("memcache", reason="python-memcached is in the dev extra")


@pytest.mark.parametrize("workers", ["processes", "threads"])
def test_bench_kestrel_writes_its_figures(tmp_path: Path, workers: str) -> None:
    out = tmp_path / "kestrel.json"
    arguments = [
        "bench", "kestrel", "--json", "--out", str(out), "--clients", "1,2", "--ops", "40",
        "--cluster-ops", "10", "--workers", workers, "--dir", str(tmp_path / "bench"),
    ]  # fmt: skip
    if workers == "processes":
        arguments.append("--local-cluster")  # one cluster run is enough for the suite
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures == json.loads(result.output)
    assert figures["bench"] == "kestrel"
    backends = ["memory", "cluster"] if workers == "processes" else ["memory"]
    expected = {
        (backend, workload, clients)
        for backend in backends
        for workload in ("set", "get_open_close")
        for clients in (1, 2)
    }
    rows = {(row["backend"], row["workload"], row["clients"]): row for row in figures["scenarios"]}
    assert set(rows) == expected
    with_memcached = shutil.which("memcached") is not None
    for (backend, _, _), row in rows.items():
        assert row["ops"] == (40 if backend == "memory" else 10), row
        assert row["ops_per_s"] > 0, row
        assert 0 < row["p50_ms"] <= row["p99_ms"], row
        assert ("memcached_ops_per_s" in row) is with_memcached, row
        if with_memcached:
            assert row["memcached_ops_per_s"] > 0, row
            assert row["ratio"] == pytest.approx(
                row["ops_per_s"] / row["memcached_ops_per_s"], abs=0.001
            )
    assert set(figures["front_exit_codes"]) == set(backends)
    assert all(code == 0 for code in figures["front_exit_codes"].values())
    assert figures["parameters"]["workers"] == workers
    assert figures["machine"]["cpu_count"] >= 1
