"""`kayos bench scale` end to end on its smallest case (3 capped nodes, one shard) for a short
window: the JSON has its fields, every node's CPU is attributed to its role, and the cgroups it
made are gone afterwards. Needs root and a writable cgroup cpu controller; skipped, saying which
is missing, elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.bench.scale.cgroups import DEFAULT_ROOT, CgroupUnavailable, choose
from kayos.cli.main import cli

pytestmark = pytest.mark.integration


def _hierarchy() -> Path:
    if os.geteuid() != 0:
        pytest.skip("kayos bench scale caps its nodes with cgroups: needs root")
    try:
        return choose(Path(DEFAULT_ROOT)).path
    except CgroupUnavailable as exc:
        pytest.skip(f"no writable cgroup cpu controller here: {exc}")


def test_bench_scale_smallest_case_writes_its_figures_and_leaves_no_cgroup(tmp_path: Path) -> None:
    hierarchy = _hierarchy()
    out = tmp_path / "scale.json"
    result = CliRunner().invoke(
        cli,
        [
            "bench", "scale", "--cases", "3n-1s", "--seconds", "2", "--repeat", "1",
            "--warmup-s", "1", "--in-flight", "8", "--json", "--out", str(out),
            "--dir", str(tmp_path / "bench"),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["bench"] == "scale"
    assert set(figures["cases"]) == {"3n-1s"}
    case = figures["cases"]["3n-1s"]
    assert case["chains"] == [["a", "b", "c"]]
    assert case["committed"] > 0
    assert case["msgs_per_s"] > 0
    assert case["committed_per_shard"] == [case["committed"]]
    nodes = case["node_cpu_s_per_msg"]
    assert {node: row["roles"] for node, row in nodes.items()} == {
        "a": "head",
        "b": "middle",
        "c": "tail",
    }
    for row in nodes.values():
        assert row["cpu_seconds"] > 0
        assert row["cap_used"] > 0
    assert set(case["role_cpu_s_per_msg"]) == {"head", "middle", "tail"}
    model = figures["model"]
    assert model["costs_from"] == "3n-1s"
    assert model["predictions"]["3n-1s"]["predicted_msgs_per_s"] > 0
    assert figures["cgroup"]["path"] == str(hierarchy)
    assert figures["parameters"]["node_cpu"] == 0.15
    # The bench ran in this process: its groups are named after this pid.
    ours = (f"kayos-bench-scale-{os.getpid()}", f"kayos-bench-probe-{os.getpid()}")
    left = [name for name in os.listdir(hierarchy) if name in ours]
    assert left == [], f"cgroups left behind: {left}"
