"""CPU caps for ``kayos bench scale``'s node processes: one cgroup per node under a group of the
bench's own, made on entry and removed on exit (also on Ctrl-C or an error).

Where the caps go (``choose``), under a cgroup root (``/sys/fs/cgroup`` unless injected):
- cgroup v1's cpu controller, ``ROOT/cpu`` (or ``ROOT/cpu,cpuacct``): a node's group holds its
  cap as ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``;
- else cgroup v2's unified hierarchy (``ROOT/unified``, or ``ROOT`` itself on a v2-only host)
  whose ``cgroup.controllers`` offers ``cpu``: the bench's group enables ``+cpu`` for its
  children, and a node's group holds its cap as ``cpu.max`` ("QUOTA PERIOD").
A hierarchy counts only if a group can really be made there (a probe group is made and removed):
a path that exists but refuses us (not root, a read-only mount) is not writable. Where neither
is, ``CgroupUnavailable`` says what was tried and why each failed.

A process joins its node's group by writing its pid to the group's ``cgroup.procs`` (all its
threads move with it, and processes it starts later are born inside). The writes are plain file
writes, so a test runs all of this against a fake root directory; ``mkdir`` and ``rmdir`` are
injected for the same reason (a real cgroup directory is removed with its control files in it,
a plain directory is not).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kayos.errors import KayosError

DEFAULT_ROOT = "/sys/fs/cgroup"
# The scheduler's accounting period for a cap: 100 ms is the kernel's default CFS period; a cap
# of 0.15 core then allows 15 ms of CPU in every 100 ms.
PERIOD_US = 100_000
# A group's CPU weight against the machine's other processes at weight 1: the kernel's default
# (v1 cpu.shares, v2 cpu.weight) is the unit.
V1_SHARES_UNIT = 1024
V2_WEIGHT_UNIT = 100
V2_WEIGHT_MAX = 10_000


class CgroupUnavailable(KayosError):
    """No cgroup cpu controller this process can write: the bench cannot cap its nodes."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where the caps go: ``kind`` "v1" or "v2", at ``path``."""

    kind: str
    path: Path


def v1_candidates(root: Path) -> list[Path]:
    return [root / "cpu", root / "cpu,cpuacct"]


def v2_candidates(root: Path) -> list[Path]:
    return [root / "unified", root]


def _probe(path: Path, mkdir: Callable[[Path], None], rmdir: Callable[[Path], None]) -> str | None:
    """Why no group can be made under ``path`` (None: one was made and removed)."""
    probe = path / f"kayos-bench-probe-{os.getpid()}"
    try:
        mkdir(probe)
    except OSError as exc:
        return f"cannot make a group there ({exc.strerror or exc})"
    try:
        rmdir(probe)
    except OSError as exc:
        return f"made a probe group but cannot remove it ({exc.strerror or exc})"
    return None


def choose(
    root: Path,
    mkdir: Callable[[Path], None] = os.mkdir,
    rmdir: Callable[[Path], None] = os.rmdir,
) -> Hierarchy:
    """The writable hierarchy with a cpu controller under ``root``, v1 first; else
    ``CgroupUnavailable`` naming each place tried and why it failed."""
    tried: list[str] = []
    for path in v1_candidates(root):
        if not (path / "cpu.cfs_quota_us").is_file():
            tried.append(f"{path}: no cgroup v1 cpu controller (no cpu.cfs_quota_us)")
            continue
        why = _probe(path, mkdir, rmdir)
        if why is None:
            return Hierarchy("v1", path)
        tried.append(f"{path}: {why}")
    for path in v2_candidates(root):
        controllers = path / "cgroup.controllers"
        if not controllers.is_file():
            tried.append(f"{path}: no cgroup v2 hierarchy (no cgroup.controllers)")
            continue
        if "cpu" not in controllers.read_text().split():
            tried.append(f"{path}: cgroup v2 without the cpu controller (bound to v1?)")
            continue
        why = _probe(path, mkdir, rmdir)
        if why is None:
            return Hierarchy("v2", path)
        tried.append(f"{path}: {why}")
    raise CgroupUnavailable(
        "no writable cgroup cpu controller, so the nodes cannot be capped (run as root on a "
        "host with cgroup v1's cpu controller or cgroup v2's cpu controller):\n  "
        + "\n  ".join(tried)
    )


def quota_us(cores: float, period_us: int = PERIOD_US) -> int:
    """The CFS quota giving ``cores`` cores over ``period_us`` (at least the kernel's 1 ms)."""
    if cores <= 0:
        raise ValueError("a CPU cap must be > 0 cores")
    return max(1000, round(cores * period_us))


GROUP_PREFIX = "kayos-bench-scale-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(
    hierarchy: Hierarchy,
    rmdir: Callable[[Path], None] = os.rmdir,
    alive: Callable[[int], bool] = _alive,
) -> list[str]:
    """Removes the groups an earlier bench left when it was killed (``kill -9`` gives it no
    chance to): ``kayos-bench-scale-PID`` whose PID is no running process, its node groups
    first; returns the names removed. A group still holding a process is left alone."""
    removed: list[str] = []
    for group in sorted(hierarchy.path.glob(GROUP_PREFIX + "*")):
        pid = group.name.removeprefix(GROUP_PREFIX)
        if not group.is_dir() or not pid.isdigit() or alive(int(pid)):
            continue
        try:
            for child in sorted(p for p in group.iterdir() if p.is_dir()):
                rmdir(child)
            rmdir(group)
        except OSError:
            continue  # a process still inside (or a group not ours to remove): leave it
        removed.append(group.name)
    return removed


class CpuCaps:
    """The bench's cgroups in ``hierarchy``: entering makes the bench's group (with ``weight``
    times the kernel's default CPU weight against its siblings: in cgroup v1 every process in
    the root group is such a sibling, so at weight 1 all the bench's processes together would
    get no more CPU than one busy process of anyone else's), ``cap(name, cores)`` makes a capped
    group in it, ``add(name, pid)`` moves a process into one, ``close()`` (or leaving the
    ``with``) moves any process still inside back to the hierarchy's root and removes every
    group made, newest first."""

    def __init__(
        self,
        hierarchy: Hierarchy,
        *,
        mkdir: Callable[[Path], None] = os.mkdir,
        rmdir: Callable[[Path], None] = os.rmdir,
        name: str | None = None,
        weight: int = 1,
    ) -> None:
        if weight < 1:
            raise ValueError("a CPU weight must be >= 1")
        self.hierarchy = hierarchy
        self.weight = weight
        self.mkdir = mkdir
        self.rmdir = rmdir
        self.group = hierarchy.path / (name or f"{GROUP_PREFIX}{os.getpid()}")
        self.made: list[Path] = []

    def __enter__(self) -> CpuCaps:
        self.mkdir(self.group)
        self.made.append(self.group)
        if self.hierarchy.kind == "v2":
            self._enable_cpu(self.hierarchy.path)
            self._enable_cpu(self.group)
        if self.weight != 1 and self.hierarchy.kind == "v1":
            (self.group / "cpu.shares").write_text(str(self.weight * V1_SHARES_UNIT))
        elif self.weight != 1:
            weight = min(V2_WEIGHT_MAX, self.weight * V2_WEIGHT_UNIT)
            (self.group / "cpu.weight").write_text(str(weight))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @staticmethod
    def _enable_cpu(path: Path) -> None:
        control = path / "cgroup.subtree_control"
        present = control.read_text().split() if control.is_file() else []
        if "cpu" not in present:
            control.write_text("+cpu")

    def path(self, name: str) -> Path:
        return self.group / name

    def cap(self, name: str, cores: float | None) -> Path:
        """Makes group ``name`` capped at ``cores`` cores (None: uncapped); returns its path."""
        path = self.path(name)
        self.mkdir(path)
        self.made.append(path)
        if cores is None:
            return path
        quota = quota_us(cores)
        if self.hierarchy.kind == "v1":
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        return path

    def add(self, name: str, pid: int) -> None:
        """Moves process ``pid`` (and all its threads) into group ``name``."""
        (self.path(name) / "cgroup.procs").write_text(str(pid))

    def throttled(self, name: str) -> dict[str, int]:
        """The group's ``cpu.stat`` counters (periods, throttled periods, throttled time)."""
        found: dict[str, int] = {}
        stat = self.path(name) / "cpu.stat"
        if stat.is_file():
            for line in stat.read_text().splitlines():
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    found[key] = int(value)
        return found

    def close(self) -> list[str]:
        """Removes every group made, newest first, after moving out any process still in one;
        returns what could not be removed (also left in ``made``)."""
        failed: list[str] = []
        for path in reversed(list(self.made)):
            self._evict(path)
            try:
                self.rmdir(path)
                self.made.remove(path)
            except FileNotFoundError:
                self.made.remove(path)
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror or exc}")
        return failed

    def _evict(self, path: Path) -> None:
        procs = path / "cgroup.procs"
        try:
            pids = procs.read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                (self.hierarchy.path / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone already, or a process that cannot move: rmdir will say
