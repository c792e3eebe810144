"""``kayos bench grow``: adding a fourth node to a loaded 3-node cluster and rebalancing onto it
(issue 13, docs/operations.md "Adding a node to a loaded cluster"), with producers running
``acks=all`` throughout.

Workload: a LocalCluster of 3 node processes (fsync on) and 3 manager members; 3 shards x 3
replicas, each shard filled to ``shard_mb`` (values of ``fill_value_bytes``). ``producers``
threads produce one 100 B message at a time with acks=all, in turn to a queue on each shard. A
fourth node d is started outside the topology (from a copy of the file that names it, as an
operator would), then, in order:

1. **before**: after ``warmup_s`` (not measured: the stores settle after the fill),
   ``baseline_s`` of the producers alone: ``produce_msgs_per_s_before``.
2. **move**: ``add-node d`` and ``rebalance`` (signed operator requests to the manager leader),
   then until the manager holds no pending move: ``move_s`` (from the rebalance request),
   ``produce_msgs_per_s_during`` (acks in that window over its length), ``moves``.
3. **after**: ``after_s`` more: ``produce_msgs_per_s_after``.

``produce_msgs_per_s_before`` is the median of the phase's 1 s windows. With ``produce_rate``
the producers are open loop (``kayos.bench.membership.load``: messages due at that offered rate,
latency from when each was due). ``produce_during_share`` is during / before, or during / offered
with an open loop (issue 13's target: at least ``PRODUCE_DURING_SHARE_TARGET``);
``ack_p99_ms_before`` / ``_during``: the acks' latency p99 in each phase. ``both_loads`` runs the
whole bench twice, closed loop then open loop; the open loop's figures go under ``open_loop``.
``bytes_copied`` is what d's data directory holds on disk after the moves (allocated blocks: store
files are sparse); d held nothing before, so it is the copy. ``longest_ack_gap_s_before`` /
``_during``: the longest stretch with no ack at all (a chain change stalls a shard's producers while
they find its new head). ``min_replicas_seen`` is the
lowest replica count of any shard at any epoch in the manager's log of changes
(GET /v1/manager/changes) from the rebalance on: 3 unless a move shortened a chain. After the
run, with d still up, every queue is consumed by a fresh group to an end marker:
``consumed_in_order`` is true when every acknowledged message was consumed and each producer's
came out in the order it sent them (``consumed``: the counts, ``lost``, ``out_of_order`` and
examples; ``kayos.bench.membership.consumed``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kayos import limits
from kayos.bench.membership.consumed import check_consumed
from kayos.bench.membership.heal import wait_for
from kayos.bench.membership.load import (
    Producers,
    check_loaded_cluster,
    check_produce_rate,
    phase_figures,
    produce_fill_batch,
    producers_for,
    window_config,
)
from kayos.bench.produce import machine_facts
from kayos.bench.series import BIN_S, Sampler, counts_per_bin
from kayos.client.operator import post_operator_until
from kayos.client.sync import Client
from kayos.identity import write_private
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.local.ports import free_ports
from kayos.local.processes import die_with_parent
from kayos.manager.member.config import Config
from kayos.topology import NodeAddr, Topology

PRODUCE_DURING_SHARE_TARGET = 0.8
SHARDS = 3
NEW_NODE = "d"
# The period of the new node's copied-bytes samples (the picture's series, --plot).
COPY_SAMPLE_S = 0.5


@dataclass(frozen=True, slots=True)
class GrowBenchParameters:
    shard_mb: int = 64
    fill_value_bytes: int = 8000
    producers: int = 4
    produce_rate: float | None = None  # msgs/s offered by open-loop producers; None: closed loop
    both_loads: bool = False  # the bench twice: closed loop, then open loop at produce_rate
    warmup_s: float = 5.0
    baseline_s: float = 10.0
    after_s: float = 5.0
    detection_window_ms: int = limits.manager_detection_window_ms
    step_timeout_s: float = 120.0
    move_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        check_loaded_cluster(self.shard_mb, self.producers, self.baseline_s, self.after_s)
        check_produce_rate(self.produce_rate)
        if self.both_loads and self.produce_rate is None:
            raise ValueError("both_loads needs produce_rate (the open loop's offered rate)")
        self.manager_config().validate()

    def manager_config(self) -> Config:
        return window_config(self.detection_window_ms)


def queue_per_shard(topology: Topology, prefix: str) -> list[str]:
    """One queue name that maps to each shard, shard by shard (bounded search)."""
    found: dict[int, str] = {}
    for n in range(100_000):
        name = f"{prefix}-{n}"
        found.setdefault(topology.shard_for(name), name)
        if len(found) == len(topology.shards):
            return [found[s] for s in sorted(found)]
    raise RuntimeError(f"no queue name found for every shard with prefix {prefix!r}")


def start_outside_node(
    cluster: LocalCluster, node: str, directory: Path
) -> tuple[NodeAddr, subprocess.Popen[bytes]]:
    """Starts ``kayos node`` ``node`` from a copy of the cluster's topology file that names it
    (free loopback ports; data and log under ``directory``), as an operator starts a node the
    cluster does not know yet; the caller stops it."""
    http_port, bin_port = free_ports(2, "127.0.0.1")
    address = NodeAddr(node, "127.0.0.1", http_port, bin_port)
    topology = cluster.topology
    own = Topology(topology.epoch, {**topology.nodes, node: address}, topology.shards)
    own_path = directory / f"{node}.toml"
    write_private(str(own_path), own.with_identity(cluster.identity).dumps_toml())
    (directory / node).mkdir(parents=True, exist_ok=True)
    with open(directory / f"{node}.log", "wb") as log:
        process = subprocess.Popen(
            [*cluster.node_command, "--config", str(own_path), "--id", node,
             "--data", str(directory / node)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    return address, process


def answers(url: str) -> bool:
    try:
        code, _ = http_json(url + "/v1/status", timeout_s=1.0)
    except (OSError, ValueError):
        return False
    return code == 200


def manager_status(cluster: LocalCluster) -> dict[str, Any] | None:
    leader = cluster.wait_manager_leader()
    if leader is None:
        return None
    code, body = http_json(cluster.manager_url(leader) + "/v1/manager/status", timeout_s=2.0)
    return body if code == 200 and isinstance(body, dict) else None


def min_replicas_since(cluster: LocalCluster, epoch: int) -> int:
    """The lowest replica count of any shard at any epoch after ``epoch`` in the leader's log of
    changes (a move's extra member, between its target joining and its source leaving, does
    not count)."""
    leader = cluster.wait_manager_leader()
    assert leader is not None
    code, body = http_json(cluster.manager_url(leader) + "/v1/manager/changes", timeout_s=5.0)
    if code != 200 or not isinstance(body, dict):
        raise RuntimeError(f"GET /v1/manager/changes: {code} {body}")
    counts: list[int] = []
    for change in body["changes"]:
        if change["epoch"] <= epoch:
            continue
        for shard in change["shards"]:
            chain, moves = shard["chain"], shard["moves"]
            extra = any(t in chain and s in chain for t, s in moves)
            counts.append(len(chain) - int(extra))
    if not counts:
        raise RuntimeError(f"the manager's log of changes holds no epoch after {epoch}")
    return min(counts)


def fill_queues(urls: list[str], queues: list[str], megabytes: int, value_bytes: int) -> None:
    """Fills each queue with ``megabytes`` of ``value_bytes`` values, a thread per queue."""
    value = os.urandom(value_bytes)
    total = megabytes * (1 << 20) // value_bytes
    batch = max(1, (1 << 20) // value_bytes)

    def worker(queue: str) -> None:
        with Client(urls, name="bench-grow-fill") as client:
            for start in range(0, total, batch):
                items = [(b"f%012d" % n, value) for n in range(start, min(start + batch, total))]
                produce_fill_batch(client, queue, items)

    with ThreadPoolExecutor(len(queues)) as pool:
        list(pool.map(worker, queues))


def _add_and_rebalance(
    cluster: LocalCluster, address: NodeAddr, parameters: GrowBenchParameters
) -> tuple[int, int]:
    """Adds the new node at ``address`` and asks for a rebalance (signed operator requests),
    then waits until the manager holds no pending move. Returns the epoch the rebalance was
    asked at and how many moves it planned."""
    step = parameters.step_timeout_s
    add: dict[str, Any] = {"op": "add-node", "node": NEW_NODE, "host": address.host}
    add |= {"http_port": address.http_port, "bin_port": address.bin_port}
    post_operator_until(cluster.identity, cluster.manager_urls, add, step)
    start = manager_status(cluster)
    assert start is not None
    rebalance = {"op": "rebalance"}
    reply = post_operator_until(cluster.identity, cluster.manager_urls, rebalance, step)
    planned = len(reply.get("moves", []))
    wait_for(
        lambda: (
            (s := manager_status(cluster)) is not None
            and not any(shard["moves"] for shard in s["view"]["shards"])
        ),
        "the rebalance's moves",
        parameters.move_timeout_s,
    )
    return int(start["epoch"]), planned


def _consume_all(
    urls: list[str],
    producers: Producers,
    parameters: GrowBenchParameters,
    phase: Callable[[str], None],
) -> dict[str, Any]:
    """Stops the producers and consumes every queue they wrote to its end: the verdict of
    ``kayos.bench.membership.consumed``."""
    producers.finish(parameters.step_timeout_s)
    phase("consuming every queue")
    with producers.lock:
        acked = list(producers.acked)
    return check_consumed(urls, producers.queues, acked, parameters.move_timeout_s)


def _rate(producers: Producers, begin: float, end: float) -> float:
    return round(producers.acked_between(begin, end) / max(end - begin, 1e-6), 1)


def _longest_ack_gap(producers: Producers, begin: float, end: float) -> float:
    """The longest time no producer got an ack in [begin, end): a chain change's stall."""
    with producers.lock:
        acks = sorted(t for _, t in producers.calls if begin <= t < end)
    edges = [begin, *acks, end]
    return round(max(b - a for a, b in itertools.pairwise(edges)), 3)


def _replica_counts(status: dict[str, Any]) -> dict[str, int]:
    """How many replicas each node holds in the manager's view (a status reply), by node."""
    replicas: dict[str, int] = {}
    for shard in status["view"]["shards"]:
        for member in shard["chain"]:
            replicas[member] = replicas.get(member, 0) + 1
    return dict(sorted(replicas.items()))


def _copied_bytes(directory: Path) -> int:
    """The disk blocks the new node's data directory holds (sparse store files count what they
    hold)."""
    return sum(f.stat().st_blocks * 512 for f in (directory / NEW_NODE).rglob("*") if f.is_file())


def _run(
    cluster: LocalCluster,
    directory: Path,
    parameters: GrowBenchParameters,
    offered: float | None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    urls = list(cluster.urls.values())
    step = parameters.step_timeout_s
    wait_for(lambda: manager_status(cluster), "a manager leader", step)
    phase(f"filling {SHARDS} shards to {parameters.shard_mb} MB")
    fill_queues(urls, queue_per_shard(cluster.topology, "grow-fill"), parameters.shard_mb,
          parameters.fill_value_bytes)  # fmt: skip
    cluster.wait_replicated(step)
    address, node = start_outside_node(cluster, NEW_NODE, directory)
    queues = tuple(queue_per_shard(cluster.topology, "grow"))
    producers = producers_for(urls, parameters.producers, queues, offered)
    try:
        wait_for(lambda: answers(address.http_url), f"node {NEW_NODE} answering", step)
        producers.start()
        wait_for(lambda: producers.acked_between(0, time.monotonic()) > 0, "a first ack", step)
        phase(f"warm-up ({parameters.warmup_s:g} s)")
        time.sleep(parameters.warmup_s)  # the fill's compaction settles; not measured
        wait_for(producers.caught_up, "the producers' backlog", step)
        before_start = time.monotonic()
        sampler = Sampler(lambda: _copied_bytes(directory) / (1 << 20), COPY_SAMPLE_S, before_start)
        sampler.start()
        phase(f"baseline ({parameters.baseline_s:g} s)")
        time.sleep(parameters.baseline_s)  # the phase's length, not a synchronisation
        before_end = time.monotonic()
        phase(f"add {NEW_NODE} and rebalance")
        start_epoch, planned = _add_and_rebalance(cluster, address, parameters)
        during_end = time.monotonic()
        phase(f"after ({parameters.after_s:g} s)")
        time.sleep(parameters.after_s)  # the phase's length, not a synchronisation
        after_end = time.monotonic()
        copied_samples = sampler.stop()
        final = manager_status(cluster)
        consumed = _consume_all(urls, producers, parameters, phase)
    finally:
        producers.finish(step)
        node.terminate()
        node.wait(step)

    load = phase_figures(producers, (before_start, before_end), (before_end, during_end))
    drop = load["produce_drop"]
    assert final is not None
    replicas = _replica_counts(final)
    copied = _copied_bytes(directory)
    return {
        "load": load["load"],
        "produce_offered_per_s": load["produce_offered_per_s"],
        "produce_msgs_per_s_before": load["produce_acks_per_s_before"],
        "produce_msgs_per_s_during": load["produce_acks_per_s_during"],
        "produce_msgs_per_s_after": _rate(producers, during_end, after_end),
        "produce_during_share": None if drop is None else round(1 - drop, 3),
        "produce_during_share_target": PRODUCE_DURING_SHARE_TARGET,
        "ack_p99_ms_before": load["ack_p99_ms_before"],
        "ack_p99_ms_during": load["ack_p99_ms_during"],
        "longest_ack_gap_s_before": _longest_ack_gap(producers, before_start, before_end),
        "longest_ack_gap_s_during": _longest_ack_gap(producers, before_end, during_end),
        "move_s": round(during_end - before_end, 3),
        "moves": planned,
        "bytes_copied": copied,
        "mb_copied_per_s": round(copied / (1 << 20) / max(during_end - before_end, 1e-6), 1),
        "replicas": replicas,
        "min_replicas_seen": min_replicas_since(cluster, start_epoch),
        "produce_errors": producers.errors,
        # Every acknowledged message consumed, in each producer's order (kayos.bench.membership.
        # consumed): the acceptance's second half.
        "consumed_in_order": consumed["consumed_in_order"],
        "consumed": consumed,
        "targets": _targets(drop, consumed["consumed_in_order"]),
        "grow_series": _series(
            producers, (before_start, before_end, during_end, after_end), copied_samples
        ),
    }


def _targets(drop: float | None, in_order: bool) -> dict[str, dict[str, Any]]:
    """The acceptance's two halves: produce during the move at least
    ``PRODUCE_DURING_SHARE_TARGET`` of before, and every acknowledged message consumed in order
    after."""
    share = None if drop is None else round(1 - drop, 3)
    return {
        "produce_during_share": {
            "value": share,
            "target": f">= {PRODUCE_DURING_SHARE_TARGET}",
            "met": share is not None and share >= PRODUCE_DURING_SHARE_TARGET,
        },
        "consumed_in_order": {
            "value": in_order,
            "target": "every acknowledged message consumed, in order",
            "met": in_order,
        },
    }


def _series(
    producers: Producers, times: tuple[float, float, float, float], copied: list[list[float]]
) -> dict[str, Any]:
    """The picture's series (--plot), in seconds from the baseline's start: ``times`` are the
    baseline's start, the move's start and end, the run's end."""
    before_start, before_end, during_end, after_end = times
    with producers.lock:
        acked = [done for _, done in producers.calls]
    return {
        "bin_s": BIN_S,
        "move_start_s": round(before_end - before_start, 3),
        "move_end_s": round(during_end - before_start, 3),
        "acks_per_bin": counts_per_bin(acked, before_start, after_end),
        "copied_mb_samples": copied,
    }


def bench_grow(
    parameters: GrowBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Runs the bench (twice with ``both_loads``); ``phase`` is told what runs as it begins."""
    root = Path(base or tempfile.mkdtemp(prefix="kayos-bench-grow-"))
    rates = [None, parameters.produce_rate] if parameters.both_loads else [parameters.produce_rate]
    results: list[dict[str, Any]] = []
    try:
        for kind, rate in enumerate(rates):
            directory = root / "open" if kind else root
            cluster = LocalCluster(
                directory / "cluster", nodes=3, replicas=3, shards=SHARDS, managers=3,
                manager_config=parameters.manager_config(),
            )  # fmt: skip
            phase("starting 3 nodes and 3 managers")
            with cluster:
                results.append(_run(cluster, directory, parameters, rate, phase))
                cluster.stop()
    finally:
        if base is None:
            shutil.rmtree(root, ignore_errors=True)
    figures = results[0]
    if parameters.both_loads:
        figures["open_loop"] = results[1]
    return {**figures, "parameters": asdict(parameters), "machine": machine_facts()}
