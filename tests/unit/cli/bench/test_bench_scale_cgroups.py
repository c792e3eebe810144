"""The scale bench's CPU caps (kayos.bench.scale.cgroups) against a fake cgroup root directory:
which hierarchy is chosen, what is written to cap a group and move a process into it, that every
group made is removed (on an error too), and that ``kayos bench scale`` exits non-zero, saying
why, where no hierarchy is writable. No process is capped."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.bench.scale.cgroups import (
    CgroupUnavailable,
    CpuCaps,
    Hierarchy,
    choose,
    quota_us,
    sweep_stale,
)
from kayos.cli.main import cli

pytestmark = pytest.mark.unit


def _v1(root: Path) -> Path:
    path = root / "cpu"
    path.mkdir(parents=True)
    for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cgroup.procs"):
        (path / name).write_text("")
    return path


def _v2(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    path = root / "unified"
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text("\n")
    (path / "cgroup.procs").write_text("")
    return path


def _rmtree(path: Path) -> None:
    """A real cgroup directory goes with its control files in it; a fake one needs rmtree."""
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, "gone", str(path))
    shutil.rmtree(path)


def _refuse(path: Path) -> None:
    raise PermissionError(errno.EACCES, "Permission denied", str(path))


def test_cgroup_v1_is_chosen_first(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    _v2(tmp_path)
    assert choose(tmp_path) == Hierarchy("v1", v1)
    assert sorted(p.name for p in v1.iterdir()) == [
        "cgroup.procs",
        "cpu.cfs_period_us",
        "cpu.cfs_quota_us",
    ], "the probe group is removed"


def test_cgroup_v2_is_chosen_where_v1_has_no_cpu_controller(tmp_path: Path) -> None:
    v2 = _v2(tmp_path)
    assert choose(tmp_path) == Hierarchy("v2", v2)


def test_a_v2_only_host_has_its_hierarchy_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert choose(tmp_path) == Hierarchy("v2", tmp_path)


def test_v2_without_the_cpu_controller_is_not_chosen(tmp_path: Path) -> None:
    _v2(tmp_path, controllers="memory pids")
    with pytest.raises(CgroupUnavailable, match="without the cpu controller"):
        choose(tmp_path)


def test_an_unwritable_root_names_every_place_tried(tmp_path: Path) -> None:
    _v1(tmp_path)
    _v2(tmp_path)
    with pytest.raises(CgroupUnavailable) as caught:
        choose(tmp_path, mkdir=_refuse)
    text = str(caught.value)
    assert f"{tmp_path / 'cpu'}: cannot make a group there (Permission denied)" in text
    assert f"{tmp_path / 'unified'}: cannot make a group there (Permission denied)" in text
    assert "no writable cgroup cpu controller" in text


def test_v1_caps_are_a_quota_over_a_period(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    with CpuCaps(Hierarchy("v1", v1), rmdir=_rmtree, name="bench") as caps:
        path = caps.cap("a", 0.15)
        caps.add("a", 4242)
        assert path == v1 / "bench" / "a"
        assert (path / "cpu.cfs_period_us").read_text() == "100000"
        assert (path / "cpu.cfs_quota_us").read_text() == "15000"
        assert (path / "cgroup.procs").read_text() == "4242"
    assert not (v1 / "bench").exists()
    assert (v1 / "cgroup.procs").read_text() == "4242", "a process still inside moves to the root"


def test_v2_caps_enable_the_cpu_controller_and_write_cpu_max(tmp_path: Path) -> None:
    v2 = _v2(tmp_path)
    with CpuCaps(Hierarchy("v2", v2), rmdir=_rmtree, name="bench") as caps:
        path = caps.cap("b", 0.25)
        assert (v2 / "cgroup.subtree_control").read_text() == "+cpu"
        assert (v2 / "bench" / "cgroup.subtree_control").read_text() == "+cpu"
        assert (path / "cpu.max").read_text() == "25000 100000"
    assert not (v2 / "bench").exists()


@pytest.mark.parametrize(
    ("kind", "weight", "file", "written"),
    [
        ("v1", 16, "cpu.shares", "16384"),
        ("v2", 16, "cpu.weight", "1600"),
        ("v2", 100, "cpu.weight", "10000"),
    ],
)
def test_the_bench_group_weighs_as_many_busy_processes_as_asked(
    tmp_path: Path, kind: str, weight: int, file: str, written: str
) -> None:
    path = _v1(tmp_path) if kind == "v1" else _v2(tmp_path)
    with CpuCaps(Hierarchy(kind, path), rmdir=_rmtree, name="g", weight=weight):
        assert (path / "g" / file).read_text() == written


def test_at_weight_one_and_uncapped_nothing_is_written(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    with CpuCaps(Hierarchy("v1", v1), rmdir=_rmtree, name="g") as caps:
        producers = caps.cap("producers", None)
        assert list((v1 / "g").iterdir()) == [producers]
        assert list(producers.iterdir()) == []
    with pytest.raises(ValueError, match=">= 1"):
        CpuCaps(Hierarchy("v1", v1), weight=0)


def test_every_group_is_removed_newest_first_on_an_interrupt(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    removed: list[str] = []

    def rmdir(path: Path) -> None:
        removed.append(path.name)
        _rmtree(path)

    caps = CpuCaps(Hierarchy("v1", v1), rmdir=rmdir, name="g")

    def interrupted() -> None:
        with caps:
            caps.cap("a", 0.1)
            caps.cap("b", 0.1)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert removed == ["b", "a", "g"]
    assert caps.made == []


def test_a_group_that_cannot_be_removed_is_reported(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    caps = CpuCaps(Hierarchy("v1", v1), rmdir=_refuse, name="g")
    with caps:
        caps.cap("a", 0.1)
    assert [Path(line.partition(":")[0]).name for line in caps.close()] == ["a", "g"]


def test_a_quota_is_at_least_the_kernels_minimum() -> None:
    assert quota_us(0.15) == 15_000
    assert quota_us(0.001) == 1000
    with pytest.raises(ValueError, match="> 0"):
        quota_us(0)


def test_bench_scale_without_a_writable_cgroup_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "scale", "--cgroup-root", str(tmp_path), "--dir", str(tmp_path / "b")]
    )
    assert result.exit_code == 2, result.output
    assert "no writable cgroup cpu controller" in result.output
    assert "no cgroup v1 cpu controller" in result.output
    assert not (tmp_path / "b").exists(), "nothing started"
    assert os.listdir(tmp_path) == []


def test_groups_a_killed_run_left_are_swept_and_a_live_runs_kept(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    for pid in ("111", "222"):
        (v1 / f"kayos-bench-scale-{pid}" / "a").mkdir(parents=True)
    (v1 / "kayos-bench-scale-x").mkdir()  # not a pid: not ours to judge
    (v1 / "other").mkdir()
    removed = sweep_stale(Hierarchy("v1", v1), rmdir=os.rmdir, alive=lambda pid: pid == 222)
    assert removed == ["kayos-bench-scale-111"]
    assert sorted(p.name for p in v1.iterdir() if p.is_dir()) == [
        "kayos-bench-scale-222",
        "kayos-bench-scale-x",
        "other",
    ]


def test_a_stale_group_still_holding_a_process_is_left(tmp_path: Path) -> None:
    v1 = _v1(tmp_path)
    (v1 / "kayos-bench-scale-111" / "a").mkdir(parents=True)
    removed = sweep_stale(Hierarchy("v1", v1), rmdir=_refuse, alive=lambda _pid: False)
    assert removed == []
    assert (v1 / "kayos-bench-scale-111" / "a").is_dir()
