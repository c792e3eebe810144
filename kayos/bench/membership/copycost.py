"""What a catch-up copy cost the two processes doing it, and how it went (docs/performance.md,
"What a copy costs"): ``copy_mode`` and ``copy_cpu_s_per_gb`` for ``kayos bench heal`` and
``python -m kayos.bench.membership.catchup``.

- ``copy_mode``: ``file`` when the copying node installed its upstream's store file (its log
  says "copy_mode=file: installed a copy"), ``log`` when it copied entry by entry ("learning
  from" with no
  snapshot installed), None when its log says neither.
- ``copy_cpu_s_per_gb``: the CPU seconds (user + system, ``psutil``) the serving node's process and
  the copying node's process spent from the copy's start to its end, less what each spent per
  second in a baseline window before the copy times the copy's duration, per GB (10^9 bytes) of
  the copying node's store file after it. A process with no baseline (the copying node, started
  for the copy) counts whole.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from kayos.local.cluster import LocalCluster

_INSTALLED = re.compile(
    r"copy_mode=file: installed a copy of \d+ bytes through seq \d+ from ([^\s:]+)"
)
_LEARNING = re.compile(r"learning from (\S+) from seq")


@dataclass(frozen=True, slots=True)
class CpuMark:
    """The CPU seconds each node process had spent at ``at_s`` (monotonic)."""

    at_s: float
    cpu_s: dict[str, float]


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (its children not counted); None when there
    is no such process."""
    if pid is None:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def cpu_mark(cluster: LocalCluster, nodes: list[str]) -> CpuMark:
    """The CPU seconds of each of ``nodes`` that runs, now."""
    found: dict[str, float] = {}
    for node in nodes:
        spent = process_cpu_s(cluster.pid(node))
        if spent is not None:
            found[node] = spent
    return CpuMark(time.monotonic(), found)


def copy_cpu_s(
    baseline: tuple[CpuMark, CpuMark] | None, start: CpuMark, end: CpuMark, node: str
) -> float | None:
    """CPU seconds ``node`` spent on the copy from ``start`` to ``end``: all it spent then, less
    its CPU seconds per second over ``baseline`` (the window before the copy) times the copy's
    duration; with no baseline for it, all it spent. None if it was not running at both ends."""
    if node not in start.cpu_s or node not in end.cpu_s:
        return None
    spent = end.cpu_s[node] - start.cpu_s[node]
    if baseline is not None:
        before, after = baseline
        window_s = after.at_s - before.at_s
        if node in before.cpu_s and node in after.cpu_s and window_s > 0:
            per_s = (after.cpu_s[node] - before.cpu_s[node]) / window_s
            spent -= per_s * (end.at_s - start.at_s)
    return spent


def copy_cpu_s_per_gb(
    baseline: tuple[CpuMark, CpuMark] | None,
    start: CpuMark,
    end: CpuMark,
    nodes: list[str],
    copied_bytes: float,
) -> float | None:
    """The CPU seconds of ``nodes`` (the serving and the copying node) spent on the copy per GB
    (10^9 bytes) of ``copied_bytes``; None when a node was not measured or nothing was copied."""
    if copied_bytes <= 0 or not nodes:
        return None
    total = 0.0
    for node in nodes:
        spent = copy_cpu_s(baseline, start, end, node)
        if spent is None:
            return None
        total += spent
    return round(total / (copied_bytes / 1e9), 2)


def copy_mode(log_text: str) -> str | None:
    """``file`` (a store snapshot was installed), ``log`` (entries copied), None (neither
    line) from the copying node's log over the copy."""
    if _INSTALLED.search(log_text):
        return "file"
    if _LEARNING.search(log_text):
        return "log"
    return None


def serving_node(log_text: str) -> str | None:
    """The node the copy came from, by the copying node's log over the copy."""
    found = _INSTALLED.search(log_text) or _LEARNING.search(log_text)
    return found.group(1) if found else None


def log_size(path: Path) -> int:
    """Bytes of the log so far (0: none yet): where this copy's lines start."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def log_since(path: Path, offset: int) -> str:
    """The log's text from ``offset`` on (undecodable bytes replaced)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def copy_cost(
    cluster: LocalCluster,
    copier: str,
    log_offset: int,
    marks: tuple[tuple[CpuMark, CpuMark] | None, CpuMark, CpuMark],
    copied_bytes: float,
) -> dict[str, object]:
    """The figures of one copy by ``copier``: ``copy_mode``, ``copy_served_by`` and
    ``copy_cpu_s_per_gb`` (the serving and the copying node), from its log since ``log_offset``
    and the CPU marks (baseline window, start, end); ``copy_cpu_s_per_gb_by_node`` gives each
    of the two nodes' part of it."""
    text = log_since(cluster.log_path(copier), log_offset)
    served_by = serving_node(text)
    baseline, start, end = marks
    nodes = [copier] if served_by is None else [served_by, copier]
    per_gb = copy_cpu_s_per_gb(baseline, start, end, nodes, copied_bytes)
    by_node = {
        node: copy_cpu_s_per_gb(baseline, start, end, [node], copied_bytes) for node in nodes
    }
    return {
        "copy_mode": copy_mode(text),
        "copy_served_by": served_by,
        "copy_cpu_s_per_gb": per_gb if served_by is not None else None,
        # Each side's share: where the copy's CPU went (the serving node, the copying node).
        "copy_cpu_s_per_gb_by_node": by_node if served_by is not None else None,
    }
