"""``kayos bench heal``: how fast the cluster heals itself, with producers running ``acks=all``
throughout (docs/performance.md, "Healing"). It ran as ``kayos bench failover`` before that name
went to the client-side bench (``failover.py``).

Workload, per run: a LocalCluster of 3 node processes (fsync on, as always) and 3 manager members,
one shard a -> b -> c filled to ``shard_mb`` (values of ``fill_value_bytes``). ``producers``
threads then produce one 100 B message at a time with acks=all until the run ends. In order:

1. **slow node**: b is made slow by a SIGSTOP/SIGCONT duty cycle (stopped ``slow_stop_ms`` of
   every ``slow_stop_ms + slow_run_ms``), so it still answers but every hop through it waits.
   ``slow_node_removed_s``: from the first SIGSTOP until the manager's chain leaves b out; null,
   with ``slow_node_reason``, if that does not happen within ``slow_timeout_s``. b is then let run
   and the run waits for full replication again (the manager brings it back by itself).
2. **dead node**: kill -9 of the chain's middle (c, b having rejoined as the tail).
   ``dead_node_removed_s``: from the kill until the first acks=all write *begun after the kill*
   is acknowledged (only a repaired chain acknowledges one).
3. **catch-up**: the killed node's copy of the shard is deleted and it is started again; whatever
   catch-up path the node and the manager take (a streamed copy today, a snapshot when there is
   one) brings it back. ``catchup_mb_per_s``: its store file after the copy, over the seconds from
   its readiness until its durable seq reaches what the tail held when it started.
   ``produce_drop_during_catchup``: 1 - (acks/s during the copy) / (acks/s in the ``baseline_s``
   just before it, the median of its 1 s windows); with ``produce_rate`` (an open-loop producer,
   ``kayos.bench.membership.load``) 1 - (acks/s during the copy) / the offered rate.
   ``ack_p99_ms_before`` / ``_during_catchup``: the acks' latency p99 in the same two spans.
   ``copy_mode`` (``file``: a store snapshot; ``log``: entry by entry), ``copy_served_by`` and
   ``copy_cpu_s_per_gb`` (the serving and the returning node's CPU seconds spent on the copy,
   less the serving node's baseline rate, per GB of the returned store:
   ``kayos.bench.membership.copycost``).

``disk_seq_write_mb_per_s`` is measured in the same run on the same filesystem (one file of
``disk_probe_mb``, by default the shard's size, in 1 MiB writes, one fsync). ``repeat`` runs the
whole scenario again on a fresh cluster; each figure is then reported as the median with its
range. ``both_loads`` runs every repeat twice, closed loop and then open loop at ``produce_rate``:
the closed-loop figures stay where they were, the open-loop ones go under ``open_loop``.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from kayos import limits
from kayos.bench.membership.catchup import disk_seq_write_mb_per_s
from kayos.bench.membership.copycost import copy_cost, cpu_mark, log_size
from kayos.bench.membership.load import (
    Producers,
    check_produce_rate,
    phase_figures,
    produce_fill_batch,
    producers_for,
    window_config,
)
from kayos.bench.produce import machine_facts
from kayos.bench.series import BIN_S, counts_per_bin
from kayos.client.sync import Client
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.manager.member.config import Config

QUEUE = "heal"
FILL_QUEUE = "heal-fill"
POLL_S = 0.02  # the period of every bounded poll below (a condition, not a synchronisation)
# The period of the returning node's samples in the catch-up series (the picture's, --plot).
CATCHUP_SAMPLE_S = 0.25

# The targets.
DEAD_BEYOND_WINDOW_S_TARGET = 1.0
SLOW_REMOVED_S_TARGET = 3.0
CATCHUP_SHARE_OF_DISK_TARGET = 0.5
PRODUCE_DROP_TARGET = 0.2

FIGURES = (
    "dead_node_removed_s",
    "slow_node_removed_s",
    "catchup_mb_per_s",
    "disk_seq_write_mb_per_s",
    "produce_drop_during_catchup",
)


@dataclass(frozen=True, slots=True)
class HealBenchParameters:
    shard_mb: int = 1024
    detection_window_ms: int = limits.manager_detection_window_ms
    slow_p99_ms: int = limits.manager_slow_p99_ms
    slow_window_ms: int = limits.manager_slow_window_ms
    fill_value_bytes: int = 8000
    producers: int = 4
    baseline_s: float = 10.0
    produce_rate: float | None = None  # msgs/s offered by open-loop producers; None: closed loop
    both_loads: bool = False  # each run twice: closed loop, then open loop at produce_rate
    slow_stop_ms: int = 400
    slow_run_ms: int = 100
    slow_timeout_s: float = 30.0
    disk_probe_mb: int | None = None  # None: as large as the shard (at least 16 MiB)
    repeat: int = 1
    step_timeout_s: float = 120.0
    catchup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.shard_mb < 1 or self.repeat < 1 or self.producers < 1:
            raise ValueError("shard_mb, repeat and producers must be >= 1")
        if self.slow_stop_ms < 1 or self.slow_run_ms < 1:
            raise ValueError("slow_stop_ms and slow_run_ms must be >= 1")
        check_produce_rate(self.produce_rate)
        if self.both_loads and self.produce_rate is None:
            raise ValueError("both_loads needs produce_rate (the open loop's offered rate)")
        self.manager_config().validate()

    def manager_config(self) -> Config:
        return window_config(
            self.detection_window_ms,
            slow_p99_ms=self.slow_p99_ms,
            slow_window_ms=self.slow_window_ms,
        )


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float) -> Any:
    """``condition()``'s first truthy value, polled every ``POLL_S``; ``TimeoutError`` naming
    ``what`` once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench heal: timed out after {timeout_s}s waiting for {what}")
        time.sleep(POLL_S)


def _manager_view(cluster: LocalCluster) -> dict[str, Any] | None:
    leader = cluster.wait_manager_leader()
    if leader is None:
        return None
    code, body = http_json(cluster.manager_url(leader) + "/v1/manager/status", timeout_s=2.0)
    return body["view"] if code == 200 else None


def _chain(cluster: LocalCluster) -> list[str] | None:
    view = _manager_view(cluster)
    return None if view is None else list(view["shards"][0]["chain"])


def _node_state(cluster: LocalCluster, node: str) -> str | None:
    view = _manager_view(cluster)
    states = {} if view is None else {n: s for n, s, *_ in view["nodes"]}
    return states.get(node)


def _shard_status(cluster: LocalCluster, node: str) -> dict[str, Any]:
    status = cluster.status(node) or {}
    shard = status.get("shards", {}).get("0")
    return shard if isinstance(shard, dict) else {}


def _file_mb(cluster: LocalCluster, node: str) -> float:
    directory = cluster.data_dir(node) / "shards" / "0"
    return sum(p.stat().st_size for p in directory.glob("data.*.kys")) / (1 << 20)


def _fill(urls: list[str], megabytes: int, value_bytes: int) -> None:
    value = os.urandom(value_bytes)
    total = megabytes * (1 << 20) // value_bytes
    batch = max(1, (1 << 20) // value_bytes)
    starts = list(range(0, total, batch))

    def worker(part: list[int]) -> None:
        with Client(urls, name="bench-heal-fill") as client:
            for start in part:
                end = min(start + batch, total)
                items = [(b"f%012d" % n, value) for n in range(start, end)]
                produce_fill_batch(client, FILL_QUEUE, items)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, [starts[i::4] for i in range(4)]))


def _slow_phase(
    cluster: LocalCluster, parameters: HealBenchParameters, victim: str
) -> tuple[float | None, str | None, str | None]:
    """Returns the seconds until ``victim`` left the chain (or None and why not) and the state
    the manager gave it then ("slow", or "down" if it judged the node silent instead)."""
    pid = cluster.pid(victim)
    assert pid is not None
    began = time.monotonic()
    deadline = began + parameters.slow_timeout_s
    removed: float | None = None
    state: str | None = None
    stop_s, run_s = parameters.slow_stop_ms / 1000, parameters.slow_run_ms / 1000
    try:
        while time.monotonic() < deadline:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_s)  # the duty cycle's stopped part: the fault itself, not a wait
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_s)  # ... and its running part
            chain = _chain(cluster)
            if chain is not None and victim not in chain:
                removed = time.monotonic() - began
                state = _node_state(cluster, victim)
                break
    finally:
        os.kill(pid, signal.SIGCONT)
    if removed is None:
        cycle = f"{parameters.slow_stop_ms} ms stopped / {parameters.slow_run_ms} ms running"
        why = (
            f"{victim} under a {cycle} duty cycle was not removed in {parameters.slow_timeout_s} s"
        )
        return None, None, why
    return round(removed, 3), state, None


def _full_again(cluster: LocalCluster, timeout_s: float) -> None:
    """Waits until the manager put every node back in the chain: it does so once a returning node
    has caught up (writes go on, so the members' seqs never stand still to be compared)."""
    wait_for(
        lambda: sorted(_chain(cluster) or []) == ["a", "b", "c"], "full replication", timeout_s
    )


def _dead_phase(
    cluster: LocalCluster,
    producers: Producers,
    window_s: float,
    step: float,
    figures: dict[str, Any],
) -> tuple[str, list[str]]:
    """Kills the middle of the chain as it is now; records how long until a produce began on the
    repaired chain, and waits until the manager spliced it out. Returns it and the survivors."""
    chain = wait_for(lambda: _chain(cluster), "the manager's chain", step)
    victim = chain[1]
    survivors = [n for n in chain if n != victim]
    figures["dead_node_role"] = "middle"
    killed = time.monotonic()
    cluster.kill(victim, signal.SIGKILL)
    first = wait_for(lambda: producers.first_begun_after(killed), "a repaired chain", step)
    figures["dead_node_removed_s"] = round(first - killed, 3)
    figures["dead_node_beyond_window_s"] = round(first - killed - window_s, 3)
    wait_for(lambda: _chain(cluster) == survivors, f"{victim} spliced out", step)
    return victim, survivors


def _catchup_phase(
    cluster: LocalCluster,
    producers: Producers,
    parameters: HealBenchParameters,
    victim: str,
    survivors: list[str],
    figures: dict[str, Any],
) -> None:
    """Starts the dead ``victim`` again with no copy of the shard and records how fast it caught
    up and what that cost the producers, once an open loop has worked off what the dead node's
    stall held up (else its baseline is that backlog)."""
    step = parameters.step_timeout_s
    wait_for(producers.caught_up, "the producers' backlog", step)
    cpu_before = cpu_mark(cluster, survivors)
    before = time.monotonic()
    time.sleep(parameters.baseline_s)  # the baseline phase's length, not a wait
    baseline_start, baseline_end = before, time.monotonic()
    cpu_baseline = (cpu_before, cpu_mark(cluster, survivors))
    shutil.rmtree(cluster.data_dir(victim) / "shards" / "0", ignore_errors=True)
    target = int(_shard_status(cluster, survivors[-1])["last_seq"])
    log_offset = log_size(cluster.log_path(victim))
    started = time.monotonic()
    cluster.start(victim)  # returns once the node answers
    ready = time.monotonic()
    cpu_start = cpu_mark(cluster, [*survivors, victim])
    samples: list[list[float]] = []
    caught = wait_for(
        _catchup_poll(cluster, victim, target, baseline_start, samples),
        f"{victim} catching up to seq {target}",
        parameters.catchup_timeout_s,
    )
    cpu_end = cpu_mark(cluster, [*survivors, victim])
    copy_s = caught - ready
    shard_mb = _file_mb(cluster, victim)
    marks = (cpu_baseline, cpu_start, cpu_end)
    figures.update(copy_cost(cluster, victim, log_offset, marks, shard_mb * (1 << 20)))
    load = phase_figures(producers, (baseline_start, baseline_end), (ready, caught))
    figures["catchup_mb_per_s"] = round(shard_mb / copy_s, 1)
    figures["catchup_shard_mb"] = round(shard_mb, 1)
    figures["catchup_s"] = round(copy_s, 2)
    figures["catchup_node_start_s"] = round(ready - started, 2)
    figures["load"] = load["load"]
    figures["produce_offered_per_s"] = load["produce_offered_per_s"]
    figures["produce_acks_per_s_before_catchup"] = load["produce_acks_per_s_before"]
    figures["produce_acks_per_s_during_catchup"] = load["produce_acks_per_s_during"]
    figures["produce_drop_during_catchup"] = load["produce_drop"]
    figures["ack_p99_ms_before_catchup"] = load["ack_p99_ms_before"]
    figures["ack_p99_ms_during_catchup"] = load["ack_p99_ms_during"]
    with producers.lock:
        acked = [done for _, done in producers.calls]
    # The picture's series (--plot): times in seconds from the baseline's start.
    figures["catchup_series"] = {
        "bin_s": BIN_S,
        "catchup_start_s": round(ready - baseline_start, 3),
        "catchup_end_s": round(caught - baseline_start, 3),
        "acks_per_bin": counts_per_bin(acked, baseline_start, caught),
        "node_samples": samples,
        "node_sample_fields": ["t_s", "durable_seq", "store_mb"],
    }


def _catchup_poll(
    cluster: LocalCluster, node: str, target: int, origin: float, samples: list[list[float]]
) -> Callable[[], float | bool]:
    """A ``wait_for`` condition: the time ``node``'s durable seq reached ``target``, else False;
    it appends [seconds since ``origin``, durable seq, store MB] to ``samples`` every
    ``CATCHUP_SAMPLE_S``."""
    last = [-CATCHUP_SAMPLE_S]

    def poll() -> float | bool:
        now = time.monotonic()
        durable = int(_shard_status(cluster, node).get("durable_seq", 0))
        if now - last[0] >= CATCHUP_SAMPLE_S:
            last[0] = now
            try:
                store_mb = _file_mb(cluster, node)
            except OSError:  # a file replaced between listing and stat: the last sample's
                store_mb = samples[-1][2] if samples else 0.0
            samples.append([round(now - origin, 3), durable, round(store_mb, 2)])
        return durable >= target and now

    return poll


def _one_run(
    directory: str,
    parameters: HealBenchParameters,
    rate: float | None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    phase("disk probe")
    probe_mb = parameters.disk_probe_mb or max(16, parameters.shard_mb)
    disk = disk_seq_write_mb_per_s(directory, probe_mb)
    window_s = parameters.detection_window_ms / 1000
    figures: dict[str, Any] = {"disk_seq_write_mb_per_s": disk}
    cluster = LocalCluster(
        os.path.join(directory, "cluster"),
        nodes=3,
        replicas=3,
        shards=1,
        managers=3,
        manager_config=parameters.manager_config(),
    )
    step = parameters.step_timeout_s
    phase("starting 3 nodes and 3 managers")
    with cluster:
        urls = list(cluster.urls.values())
        phase(f"filling the shard to {parameters.shard_mb} MB")
        _fill(urls, parameters.shard_mb, parameters.fill_value_bytes)
        cluster.wait_replicated(step)
        producers = producers_for(urls, parameters.producers, (QUEUE,), rate)
        producers.start()
        try:
            wait_for(lambda: producers.acked_between(0, time.monotonic()) > 0, "first acks", step)
            victim = "b"

            # 1. Slow node.
            phase("slow node")
            slow_s, state, reason = _slow_phase(cluster, parameters, victim)
            figures["slow_node_removed_s"] = slow_s
            figures["slow_node_removed_as"] = state
            figures["slow_node_reason"] = reason
            _full_again(cluster, step)

            # 2. Dead node: the middle of the chain as it is now (b rejoined as the tail).
            phase("dead node")
            victim, survivors = _dead_phase(cluster, producers, window_s, step, figures)
            # 3. Catch-up of a returning node with no copy of the shard.
            phase(f"baseline ({parameters.baseline_s:g} s), then catch-up")
            _catchup_phase(cluster, producers, parameters, victim, survivors, figures)
            _full_again(cluster, step)
        finally:
            producers.finish(step)
        figures["produce_errors"] = producers.errors
        figures["produce_acks"] = len(producers.calls)
        cluster.stop()
    return figures


def _spread(values: list[float | None]) -> dict[str, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(known), 3), "min": min(known), "max": max(known)}


def _targets(figures: dict[str, Any], window_s: float) -> dict[str, dict[str, Any]]:
    def verdict(value: float | None, ok: Callable[[float], bool], target: str) -> dict[str, Any]:
        return {"value": value, "target": target, "met": None if value is None else ok(value)}

    dead = figures["dead_node_removed_s"]
    catchup, disk = figures["catchup_mb_per_s"], figures["disk_seq_write_mb_per_s"]
    share = None if catchup is None or not disk else round(catchup / disk, 3)
    return {
        "dead_node_beyond_window_s": verdict(
            None if dead is None else round(dead - window_s, 3),
            lambda v: v < DEAD_BEYOND_WINDOW_S_TARGET,
            f"< {DEAD_BEYOND_WINDOW_S_TARGET} s beyond the detection window",
        ),
        "slow_node_removed_s": verdict(
            figures["slow_node_removed_s"],
            lambda v: v < SLOW_REMOVED_S_TARGET,
            f"< {SLOW_REMOVED_S_TARGET} s",
        ),
        "catchup_share_of_disk": verdict(
            share,
            lambda v: v >= CATCHUP_SHARE_OF_DISK_TARGET,
            f">= {CATCHUP_SHARE_OF_DISK_TARGET} of disk_seq_write_mb_per_s",
        ),
        "produce_drop_during_catchup": verdict(
            figures["produce_drop_during_catchup"],
            lambda v: v <= PRODUCE_DROP_TARGET,
            f"<= {PRODUCE_DROP_TARGET}",
        ),
    }


def bench_heal(
    parameters: HealBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Runs the scenario ``parameters.repeat`` times; returns the figures (medians when repeated),
    their ranges, the targets and whether each is met, and every run's figures. ``phase`` is
    told what runs as it begins (a progress display)."""
    root = base or tempfile.mkdtemp(prefix="kayos-bench-heal-")
    rates = [None, parameters.produce_rate] if parameters.both_loads else [parameters.produce_rate]
    runs: list[dict[str, Any]] = []
    try:
        for index in range(parameters.repeat):
            for kind, rate in enumerate(rates):
                name = f"run-{index}" + ("-open" if kind else "")
                label = f"run {len(runs) + 1}/{parameters.repeat * len(rates)}: "
                directory = os.path.join(root, name)
                os.makedirs(directory, exist_ok=True)
                try:
                    runs.append(_one_run(directory, parameters, rate, _labelled(phase, label)))
                finally:
                    if base is not None:  # a directory the caller chose: keep the processes' logs
                        logs = os.path.join(directory, "cluster", "logs")
                        if os.path.isdir(logs):
                            shutil.copytree(logs, os.path.join(root, f"{name}-logs"))
                    shutil.rmtree(directory, ignore_errors=True)
    finally:
        if base is None:
            shutil.rmtree(root, ignore_errors=True)
    first = [run for run in runs if run["produce_offered_per_s"] == rates[0]]
    result = _summary(first, parameters)
    if parameters.both_loads:
        result["open_loop"] = _summary(
            [run for run in runs if run["produce_offered_per_s"] is not None], parameters
        )
    result["runs"] = runs
    result["parameters"] = asdict(parameters)
    result["machine"] = machine_facts()
    return result


def _labelled(phase: Callable[[str], None], label: str) -> Callable[[str], None]:
    """``phase`` with ``label`` before every name (which run of several a phase belongs to)."""
    return lambda name: phase(f"{label}{name}")


def _summary(runs: list[dict[str, Any]], parameters: HealBenchParameters) -> dict[str, Any]:
    """The figures of ``runs`` (of one kind of load): medians, ranges, targets."""
    ranges = {name: _spread([run[name] for run in runs]) for name in FIGURES}
    window_s = parameters.detection_window_ms / 1000
    result: dict[str, Any] = {name: ranges[name]["median"] for name in FIGURES}
    reasons = [run["slow_node_reason"] for run in runs if run["slow_node_reason"]]
    result["slow_node_reason"] = reasons[0] if reasons else None
    result["detection_window_s"] = window_s
    result["catchup_shard_mb"] = _spread([run["catchup_shard_mb"] for run in runs])["median"]
    result["shard_mb_requested"] = parameters.shard_mb
    result["targets"] = _targets(result, window_s)
    result["ranges"] = ranges
    for name in ("load", "produce_offered_per_s"):
        result[name] = runs[0][name]
    for name in (
        "produce_acks_per_s_before_catchup",
        "produce_acks_per_s_during_catchup",
        "ack_p99_ms_before_catchup",
        "ack_p99_ms_during_catchup",
        "copy_cpu_s_per_gb",
    ):
        result[name] = _spread([run[name] for run in runs])["median"]
    # How the returning node copied (docs/performance.md, "What a copy costs"): one mode, or
    # every run's when they differ.
    modes = [run["copy_mode"] for run in runs]
    result["copy_mode"] = modes[0] if len(set(modes)) == 1 else modes
    return result
