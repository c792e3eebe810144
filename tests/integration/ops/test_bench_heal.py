"""``kayos bench heal`` run small: a real 3-node, 3-manager cluster, a few MB in the
shard. It checks that the JSON has every figure with sane values, not the timing targets
(performance lives in the benchmark, docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WINDOW_MS = 2_000
SHARD_MB = 4
OFFERED = 40.0  # msgs/s of the open-loop run: far below what the cluster takes


def test_bench_heal_json_has_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "heal.json"
    command = [
        sys.executable, "-m", "kayos", "bench", "heal", "--shard-mb", str(SHARD_MB),
        "--detection-window-ms", str(WINDOW_MS), "--json", "--out", str(out),
        "--dir", str(tmp_path / "bench"), "--produce-rate", str(OFFERED), "--both-loads",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    printed = json.loads(done.stdout)
    written = json.loads(out.read_text())
    assert printed["parameters"] == written["parameters"]
    print(json.dumps({k: v for k, v in written.items() if k not in ("runs", "machine")}, indent=1))

    window_s = WINDOW_MS / 1000
    assert written["detection_window_s"] == window_s
    # Removal cannot be faster than noticing: the first new ack comes after the window, bounded.
    assert 0 < written["dead_node_removed_s"] < 60
    slow = written["slow_node_removed_s"]
    if slow is None:
        assert written["slow_node_reason"], "a slow node not removed says why"
    else:
        assert 0 < slow < 60
        assert written["slow_node_reason"] is None
    assert written["catchup_mb_per_s"] > 0
    assert written["catchup_shard_mb"] >= SHARD_MB * 0.9  # the returning node holds the shard
    assert written["disk_seq_write_mb_per_s"] > 0
    drop = written["produce_drop_during_catchup"]
    assert drop is not None
    assert drop <= 1  # negative: produce ran faster during the copy (a noisy box)
    assert set(written["targets"]) == {
        "dead_node_beyond_window_s",
        "slow_node_removed_s",
        "catchup_share_of_disk",
        "produce_drop_during_catchup",
    }
    for name, verdict in written["targets"].items():
        assert verdict["met"] in (True, False, None), name
        assert verdict["target"], name
    for run in written["runs"]:
        assert run["produce_errors"] >= 0
        assert run["produce_acks"] > 0
    for name, spread in written["ranges"].items():
        if spread["median"] is not None:
            assert spread["min"] <= spread["median"] <= spread["max"], name
    # The closed loop's figures stay at the top; the open loop's are under open_loop.
    assert written["load"] == "closed"
    assert written["produce_offered_per_s"] is None
    opened = written["open_loop"]
    assert opened["load"] == "open"
    assert opened["produce_offered_per_s"] == OFFERED
    assert opened["produce_acks_per_s_before_catchup"] > 0
    assert opened["produce_drop_during_catchup"] <= 1
    for figures in (written, opened):
        assert figures["ack_p99_ms_before_catchup"] > 0
        assert figures["ack_p99_ms_during_catchup"] > 0
    assert [run["load"] for run in written["runs"]] == ["closed", "open"]
