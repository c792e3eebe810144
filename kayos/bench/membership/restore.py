"""``kayos bench restore``: a node of a loaded cluster lost for good, and redundancy coming back by
itself (docs/manager.md rule 10, docs/operations.md "A host lost for good"), with producers
running ``acks=all`` throughout.

Workload: a LocalCluster of 4 node processes (fsync on) and 3 manager members; 4 shards x 3
replicas (each node holds three), each shard filled to ``shard_mb`` (values of
``fill_value_bytes``). ``producers`` threads produce one 100 B message at a time with acks=all,
in turn to a queue on each shard. After ``warmup_s`` (not measured) and ``baseline_s`` of the
producers alone (``produce_msgs_per_s_before``), node a is killed with SIGKILL and not started
again. The manager splices it out, waits out the grace (``grace_s``: the manager's
``replace_after_ms``), then copies each of the three shards a held to the one node that holds no
replica of it. Figures, in seconds from the kill:

- ``spliced_s``: a is out of every chain in the manager's view;
- ``copy_start_s``: the first replacement shows in the manager's status (``restore``);
- ``kill_to_full_redundancy_s``: every shard holds three replicas again, a in none;
- ``copy_s``: from the first replacement's start to full redundancy (the copies' own time);
- ``mb_copied``: what the replacements' targets hold of the shards they took (allocated blocks:
  store files are sparse), and ``mb_copied_per_s`` over ``copy_s``;
- ``produce_msgs_per_s_before`` / ``_during`` (kill to full redundancy) / ``_after``
  (``after_s`` more), the ack p99s, ``produce_errors``.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kayos import limits
from kayos.bench.membership.grow import fill_queues, manager_status, queue_per_shard
from kayos.bench.membership.heal import wait_for
from kayos.bench.membership.load import (
    check_loaded_cluster,
    check_produce_rate,
    phase_figures,
    producers_for,
    window_config,
)
from kayos.bench.produce import machine_facts
from kayos.local.cluster import LocalCluster
from kayos.manager.member.config import Config

NODES = 4
SHARDS = 4
REPLICAS = 3
VICTIM = "a"
POLL_S = 0.1  # how often the manager's status is read while the node is replaced


@dataclass(frozen=True, slots=True)
class RestoreBenchParameters:
    shard_mb: int = 64
    fill_value_bytes: int = 8000
    producers: int = 4
    produce_rate: float | None = None  # msgs/s offered by open-loop producers; None: closed loop
    grace_s: float = 10.0
    warmup_s: float = 5.0
    baseline_s: float = 10.0
    after_s: float = 5.0
    detection_window_ms: int = limits.manager_detection_window_ms
    step_timeout_s: float = 120.0
    restore_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        check_loaded_cluster(self.shard_mb, self.producers, self.baseline_s, self.after_s)
        check_produce_rate(self.produce_rate)
        self.manager_config().validate()

    def manager_config(self) -> Config:
        return window_config(self.detection_window_ms, replace_after_ms=round(self.grace_s * 1000))


@dataclass(slots=True)
class Watch:
    """What the manager's status showed after the kill, in seconds from it."""

    spliced_s: float | None = None
    copy_start_s: float | None = None
    full_s: float | None = None
    targets: dict[int, str] | None = None

    def look(self, cluster: LocalCluster, killed: float) -> bool:
        """Reads the leader's status once; True once every shard holds ``REPLICAS`` again."""
        status = manager_status(cluster)
        if status is None:
            return False
        at = round(time.monotonic() - killed, 3)
        chains = [s["chain"] for s in status["view"]["shards"]]
        if self.spliced_s is None and all(VICTIM not in c for c in chains):
            self.spliced_s = at
        restoring = status.get("restore", {}).get("restoring", [])
        if restoring and self.copy_start_s is None:
            self.copy_start_s = at
        self.targets = self.targets or {}
        for entry in restoring:
            self.targets[int(entry["shard"])] = str(entry["target"])
        if all(len(c) == REPLICAS and VICTIM not in c for c in chains):
            self.full_s = at
            return True
        return False


def _copied_bytes(cluster: LocalCluster, targets: dict[int, str]) -> int:
    """The disk blocks each replacement's target holds of the shard it took."""
    total = 0
    for shard, node in targets.items():
        directory = cluster.data_dir(node) / "shards" / str(shard)
        total += sum(f.stat().st_blocks * 512 for f in directory.rglob("*") if f.is_file())
    return total


def _run(
    cluster: LocalCluster,
    parameters: RestoreBenchParameters,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    urls = list(cluster.urls.values())
    step = parameters.step_timeout_s
    wait_for(lambda: manager_status(cluster), "a manager leader", step)
    phase(f"filling {SHARDS} shards to {parameters.shard_mb} MB")
    fill_queues(urls, queue_per_shard(cluster.topology, "restore-fill"), parameters.shard_mb,
          parameters.fill_value_bytes)  # fmt: skip
    cluster.wait_replicated(step)
    queues = tuple(queue_per_shard(cluster.topology, "restore"))
    producers = producers_for(urls, parameters.producers, queues, parameters.produce_rate)
    watch = Watch()
    try:
        producers.start()
        wait_for(lambda: producers.acked_between(0, time.monotonic()) > 0, "a first ack", step)
        phase(f"warm-up ({parameters.warmup_s:g} s)")
        time.sleep(parameters.warmup_s)  # the fill's compaction settles; not measured
        wait_for(producers.caught_up, "the producers' backlog", step)
        before_start = time.monotonic()
        phase(f"baseline ({parameters.baseline_s:g} s)")
        time.sleep(parameters.baseline_s)  # the phase's length, not a synchronisation
        killed = time.monotonic()
        phase(f"kill -9 {VICTIM}; grace {parameters.grace_s:g} s, then the copies")
        cluster.kill(VICTIM, signal.SIGKILL)
        deadline = killed + parameters.restore_timeout_s
        while not watch.look(cluster, killed):
            if time.monotonic() > deadline:
                raise RuntimeError(f"not back to {REPLICAS} replicas in {deadline - killed} s")
            time.sleep(POLL_S)  # the status's sampling period, not a synchronisation
        restored = time.monotonic()
        phase(f"after ({parameters.after_s:g} s)")
        time.sleep(parameters.after_s)  # the phase's length, not a synchronisation
        after_end = time.monotonic()
    finally:
        producers.finish(step)
    load = phase_figures(producers, (before_start, killed), (killed, restored))
    copied = _copied_bytes(cluster, watch.targets or {})
    assert watch.full_s is not None
    # A copy that began and ended between two reads of the status shows no start: none measured.
    copy_start = watch.copy_start_s if watch.copy_start_s is not None else watch.full_s
    copy_s = watch.full_s - copy_start
    after_rate = producers.acked_between(restored, after_end) / max(after_end - restored, 1e-6)
    return {
        "load": load["load"],
        "grace_s": parameters.grace_s,
        "detection_window_s": parameters.detection_window_ms / 1000,
        "spliced_s": watch.spliced_s,
        "copy_start_s": copy_start,
        "copy_s": round(copy_s, 3),
        "kill_to_full_redundancy_s": watch.full_s,
        "restored": {str(s): n for s, n in sorted((watch.targets or {}).items())},
        "mb_copied": round(copied / (1 << 20), 1),
        "mb_copied_per_s": round(copied / (1 << 20) / max(copy_s, 1e-6), 1),
        "produce_offered_per_s": load["produce_offered_per_s"],
        "produce_msgs_per_s_before": load["produce_acks_per_s_before"],
        "produce_msgs_per_s_during": load["produce_acks_per_s_during"],
        "produce_msgs_per_s_after": round(after_rate, 1),
        "ack_p99_ms_before": load["ack_p99_ms_before"],
        "ack_p99_ms_during": load["ack_p99_ms_during"],
        "produce_errors": producers.errors,
    }


def bench_restore(
    parameters: RestoreBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Runs the bench; ``phase`` is told what runs as it begins."""
    root = Path(base or tempfile.mkdtemp(prefix="kayos-bench-restore-"))
    try:
        cluster = LocalCluster(
            root / "cluster", nodes=NODES, replicas=REPLICAS, shards=SHARDS, managers=3,
            manager_config=parameters.manager_config(),
        )  # fmt: skip
        phase(f"starting {NODES} nodes and 3 managers")
        with cluster:
            figures = _run(cluster, parameters, phase)
            cluster.stop()
    finally:
        if base is None:
            shutil.rmtree(root, ignore_errors=True)
    return {**figures, "parameters": asdict(parameters), "machine": machine_facts()}
