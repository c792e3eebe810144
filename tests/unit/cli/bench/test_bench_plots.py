"""The benchmarks' pictures (kayos/bench/plots.py): each plot function writes a PNG from figures
given here (no benchmark runs), and every ``kayos bench`` subcommand takes ``--plot``, which
fails at once, naming the extra, where matplotlib is not installed. Skipped without matplotlib,
unless KAYOS_REQUIRE_PLOT=1 (CI, which installs the plot extra) makes that a failure."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from kayos.bench import plots
from kayos.cli.bench import bench

pytestmark = pytest.mark.unit

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        reason = "matplotlib is not installed (pip install 'kayos[plot]')"
        if os.environ.get("KAYOS_REQUIRE_PLOT") == "1":
            pytest.fail(f"KAYOS_REQUIRE_PLOT=1 but {reason}")
        pytest.skip(reason)


def _timeline(gap_bins: int) -> dict[str, Any]:
    acks = [30] * 10 + [0] * gap_bins + [28] * 12
    return {"bin_s": 0.1, "from_fault_s": -1.0, "acks": acks, "errors": [0] * len(acks)}


CANNED: dict[str, dict[str, Any]] = {
    "produce": {
        "msgs_per_s": 40_000,
        "parameters": {"batch": 100, "in_flight": 128},
        "series": {
            "bin_s": 0.1,
            "committed_per_bin": [0, 1200, 3900, 4100, 4000, 3800, 4200, 2600],
            "commit_quantiles_ms": [200 + i for i in range(101)],
            "single_commit_quantiles_ms": [3 + i / 10 for i in range(101)],
        },
    },
    "failover": {
        "parameters": {"roles": ["head", "middle", "tail"]},
        "runs": [
            {"fault": fault, "role": role, "timeline": _timeline(3 if fault == "kill9" else 9)}
            for fault in ("kill9", "sigstop")
            for role in ("head", "middle", "tail")
        ]
        + [{"fault": "kill9", "role": "tail", "timeline": None}],  # a case that failed outright
    },
    "heal": {
        "runs": [
            {
                "catchup_series": {
                    "bin_s": 0.1,
                    "catchup_start_s": 5.0,
                    "catchup_end_s": 9.0,
                    "acks_per_bin": [20] * 50 + [12] * 40,
                    "node_samples": [[5.0 + i / 4, i * 100, i * 4.0] for i in range(17)],
                    "node_sample_fields": ["t_s", "durable_seq", "store_mb"],
                }
            }
        ]
    },
    "grow": {
        "grow_series": {
            "bin_s": 0.1,
            "move_start_s": 5.0,
            "move_end_s": 8.0,
            "acks_per_bin": [25] * 50 + [15] * 30 + [25] * 50,
            "copied_mb_samples": [[i / 2, max(0.0, (i - 10) * 5.0)] for i in range(26)],
        }
    },
    "retention": {
        "budget_bytes": 16 << 20,
        "produced_bytes": 64 << 20,
        "disk_series": {
            "t_s": [0.0, 1.0, 2.0, 3.0],
            "disk_mb": {"a": [1.0, 9.0, 12.0, 8.0], "b": [1.0, 8.5, 11.0, 7.5]},
        },
    },
    "restore": {
        "grace_s": 10.0,
        "spliced_s": 0.5,
        "copy_start_s": 10.4,
        "kill_to_full_redundancy_s": 19.9,
        "mb_copied": 230.2,
        "produce_msgs_per_s_before": 120.5,
        "produce_msgs_per_s_during": 80.8,
        "produce_msgs_per_s_after": 77.9,
    },
    "storage": {
        "workload": {"messages": 100_000, "per_commit": 1000},
        "msgs_per_s": 150_000,
        "scan_msgs_per_s": 900_000,
        "lmdb_msgs_per_s": 60_000,
        "lmdb_scan_msgs_per_s": 1_200_000,
    },
    "spark": {
        "parameters": {"rows": 100_000},
        "write_rows_per_s": 40_000,
        "client_read_rows_per_s": 300_000,
        "batch_read_rows_per_s": 200_000,
        "stream_read_rows_per_s": 150_000,
        "spark_floor_rows_per_s": 400_000,
    },
    "kestrel": {
        "scenarios": [
            {"backend": "memory", "workload": w, "clients": c, "ops_per_s": 5000 * c}
            for w in ("set", "get")
            for c in (1, 4)
        ]
        + [
            {
                "backend": "cluster",
                "workload": "set",
                "clients": 1,
                "ops_per_s": 900,
                "memcached_ops_per_s": 20_000,
            }
        ],
    },
    "scale": {
        "parameters": {"node_cpu": 0.15},
        "cases": {
            "6n-1s": {
                "msgs_per_s": 30_000,
                "node_cpu_s_per_msg": {
                    "a": {"roles": "head", "cpu_s_per_msg": 5e-6},
                    "b": {"roles": "middle", "cpu_s_per_msg": 4e-6},
                    "c": {"roles": "tail", "cpu_s_per_msg": 3.5e-6},
                    "d": {"roles": "idle", "cpu_s_per_msg": None},
                },
            },
            "3n-3s": {
                "msgs_per_s": 33_000,
                "node_cpu_s_per_msg": {
                    node: {"roles": "head+middle+tail", "cpu_s_per_msg": 4.5e-6} for node in "abc"
                },
            },
        },
        "model": {
            "predictions": {
                "6n-1s": {"predicted_msgs_per_s": 30_000},
                "3n-3s": {"predicted_msgs_per_s": 36_000},
            }
        },
    },
}


def test_there_is_a_picture_for_every_bench_subcommand() -> None:
    assert set(plots.PLOTS) == set(bench.commands)
    assert set(CANNED) == set(plots.PLOTS)


@pytest.mark.parametrize("name", sorted(CANNED))
def test_each_picture_is_a_png_written_from_canned_figures(name: str, tmp_path: Path) -> None:
    _require_matplotlib()
    path = tmp_path / f"{name}.png"
    plots.write_plot(name, CANNED[name], str(path))
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), name
    assert 2_000 < len(data) < 150_000, (name, len(data))


def test_the_heal_picture_needs_a_recorded_catch_up() -> None:
    _require_matplotlib()
    with pytest.raises(ValueError, match="catch-up series"):
        plots.plot_heal({"runs": [{"catchup_series": None}]}, "unused.png")


def test_smoothing_is_a_rolling_mean_shorter_at_the_start() -> None:
    assert plots.smoothed([5, 0, 10, 10, 10, 10, 0], window=5) == [5, 2.5, 5, 6.25, 7, 8, 8]


def test_every_bench_subcommand_takes_plot() -> None:
    for name, command in bench.commands.items():
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert "--plot" in options, f"kayos bench {name} has no --plot"


def _missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(plots.importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("name", sorted(plots.PLOTS))
def test_plot_without_matplotlib_fails_before_the_bench_runs(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _missing(monkeypatch)
    command = bench.commands[name]
    assert isinstance(command, click.Command)
    ran: list[str] = []
    monkeypatch.setattr(command, "callback", lambda **_kw: ran.append(name))
    result = CliRunner().invoke(bench, [name, "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2, result.output
    assert "matplotlib" in result.output, result.output
    assert "kayos[plot]" in result.output, result.output
    assert ran == []


def test_plot_into_a_missing_directory_fails_before_the_bench_runs(tmp_path: Path) -> None:
    _require_matplotlib()
    result = CliRunner().invoke(bench, ["storage", "--plot", str(tmp_path / "no" / "x.png")])
    assert result.exit_code == 2, result.output
    assert "no directory" in result.output, result.output


def test_plot_writes_the_picture_after_the_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _require_matplotlib()
    import kayos.bench.storage

    monkeypatch.setattr(kayos.bench.storage, "bench_storage", lambda *_a, **_k: CANNED["storage"])
    path = tmp_path / "storage.png"
    result = CliRunner().invoke(bench, ["storage", "--json", "--plot", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == CANNED["storage"]
    assert path.read_bytes().startswith(PNG_MAGIC)
