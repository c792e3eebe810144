"""What a catch-up copy cost and how it went, as ``kayos bench heal`` and the catch-up bench report
them (kayos.bench.membership.copycost; docs/performance.md, "What a copy costs")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

import pytest

from kayos.bench.membership.copycost import (
    CpuMark,
    copy_cost,
    copy_cpu_s,
    copy_cpu_s_per_gb,
    copy_mode,
    log_since,
    log_size,
    process_cpu_s,
    serving_node,
)
from kayos.local.cluster import LocalCluster

pytestmark = pytest.mark.unit

SNAPSHOT_LOG = """\
I shard 0: copying the store of c by snapshot
I shard 0: copy_mode=file: installed a copy of 268435456 bytes through seq 33000 from c: \
received 268435456 bytes in 1 attempts, 2.10 s, 127.8 MB/s
I shard 0: learning from c from seq 33000
"""
ENTRIES_LOG = """\
I shard 0: snapshot from b failed: unavailable
I shard 0: learning from b from seq 0
"""


def test_copy_mode_is_file_when_a_snapshot_was_installed() -> None:
    assert copy_mode(SNAPSHOT_LOG) == "file"
    assert serving_node(SNAPSHOT_LOG) == "c"


def test_copy_mode_is_log_when_entries_were_copied() -> None:
    assert copy_mode(ENTRIES_LOG) == "log"
    assert serving_node(ENTRIES_LOG) == "b"


def test_copy_mode_is_unknown_without_either_line() -> None:
    assert copy_mode("shard 0: link to c failed: refused\n") is None
    assert serving_node("") is None


def test_cpu_cost_takes_off_the_baseline_rate() -> None:
    # c spent 2 s in a 4 s baseline (0.5/s); during a 10 s copy it spent 9 s: 9 - 0.5 x 10 = 4 s
    # on the copy. d started for it: all its 3 s count. 7 s for 2 GB: 3.5 s/GB.
    baseline = (CpuMark(0.0, {"c": 10.0}), CpuMark(4.0, {"c": 12.0}))
    start = CpuMark(5.0, {"c": 12.5, "d": 0.4})
    end = CpuMark(15.0, {"c": 21.5, "d": 3.4})
    assert copy_cpu_s(baseline, start, end, "c") == pytest.approx(4.0)
    assert copy_cpu_s(baseline, start, end, "d") == pytest.approx(3.0)
    assert copy_cpu_s_per_gb(baseline, start, end, ["c", "d"], 2e9) == pytest.approx(3.5)


class _Logs:
    """The one thing ``copy_cost`` asks of a cluster: where a node's log is."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def log_path(self, node: str) -> Path:
        return self.directory / f"{node}.log"


def test_copy_cost_gives_each_side_its_part(tmp_path: Path) -> None:
    """The same copy as above, as the benches report it: the total and each node's share."""
    (tmp_path / "d.log").write_text(SNAPSHOT_LOG)
    baseline = (CpuMark(0.0, {"c": 10.0}), CpuMark(4.0, {"c": 12.0}))
    start = CpuMark(5.0, {"c": 12.5, "d": 0.4})
    end = CpuMark(15.0, {"c": 21.5, "d": 3.4})
    cluster = cast("LocalCluster", _Logs(tmp_path))
    cost = copy_cost(cluster, "d", 0, (baseline, start, end), 2e9)
    assert cost["copy_mode"] == "file"
    assert cost["copy_served_by"] == "c"
    assert cost["copy_cpu_s_per_gb"] == pytest.approx(3.5)
    assert cost["copy_cpu_s_per_gb_by_node"] == {"c": 2.0, "d": 1.5}


def test_cpu_cost_without_a_baseline_counts_everything() -> None:
    start, end = CpuMark(0.0, {"c": 1.0}), CpuMark(2.0, {"c": 2.5})
    assert copy_cpu_s(None, start, end, "c") == pytest.approx(1.5)


def test_cpu_cost_is_unknown_for_a_process_not_measured_or_nothing_copied() -> None:
    start, end = CpuMark(0.0, {"c": 1.0}), CpuMark(2.0, {"c": 2.0})
    assert copy_cpu_s_per_gb(None, start, end, ["c", "d"], 1e9) is None
    assert copy_cpu_s_per_gb(None, start, end, ["c"], 0) is None


def test_process_cpu_of_this_process_and_of_none() -> None:
    spent = process_cpu_s(os.getpid())
    assert spent is not None
    assert spent > 0
    assert process_cpu_s(None) is None


def test_log_is_read_from_the_copy_on(tmp_path: Path) -> None:
    path = tmp_path / "d.log"
    assert log_size(path) == 0
    assert log_since(path, 0) == ""
    path.write_text(ENTRIES_LOG)
    offset = log_size(path)
    with path.open("a") as handle:
        handle.write(SNAPSHOT_LOG)
    assert log_since(path, offset) == SNAPSHOT_LOG
