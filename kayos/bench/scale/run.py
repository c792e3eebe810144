"""``kayos bench scale``'s runs: capped node processes, one queue produced at acks=all over one
shard and over several, each node's CPU per message by role, and the model's predictions beside
the measured figures (docs/performance.md, "Scale-out on capped nodes").

Cases (``CASES``), two clusters:
- six nodes, two shards whose chains share no node (a->b->c and d->e->f), replication 3:
  ``6n-1s`` produces to a queue on one of the shards (the other three nodes idle), ``6n-2s`` to
  a queue over both;
- three nodes, three rotated shards (a->b->c, b->c->a, c->a->b): ``3n-1s`` a queue on one
  shard, ``3n-3s`` a queue over all three (every node carries every role).

Every node runs in a cgroup capped at ``node_cpu`` cores (``cgroups.py``); the producers run in
this process, in an uncapped group, with ``in_flight`` calls of ``batch`` messages outstanding
per shard (each call to one shard's head, so a slow chain holds back no other), so the nodes,
not the producers, are the limit (``producer_cpus`` in each case says how much of a core the
producers took). After ``warmup_s`` of producing, a window of ``seconds`` is timed: messages
committed in it (by calls that returned in it) and each node's CPU seconds (utime + stime from
``/proc/PID/stat``, all its threads) over it. Each case gets ``repeat`` windows, alternating
with the other case of its cluster, and its figures are over all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kayos import limits
from kayos.bench.produce import machine_facts, percentile_ms
from kayos.bench.scale.cgroups import DEFAULT_ROOT, CpuCaps, Hierarchy, choose, sweep_stale
from kayos.bench.scale.model import RoleCosts, attribute, predict_msgs_per_s
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.topology import ShardChain, Topology

ONE_QUEUE = "scale-one"
MANY_QUEUE = "scale-many"
# Each case: (name, nodes, shard chains by node index, shards of the queue it produces to).
CLUSTERS: dict[int, list[tuple[int, ...]]] = {
    6: [(0, 1, 2), (3, 4, 5)],
    3: [(0, 1, 2), (1, 2, 0), (2, 0, 1)],
}
CASES: dict[str, tuple[int, int]] = {
    "6n-1s": (6, 1),
    "6n-2s": (6, 2),
    "3n-1s": (3, 1),
    "3n-3s": (3, 3),
}
# The cases whose nodes carry one role each: the model's role costs come from the first run.
COST_CASES = ("6n-1s", "3n-1s")


@dataclass(frozen=True, slots=True)
class ScaleBenchParameters:
    # Each node's CPU cap, in cores. 6 x 0.15 = 0.9 core for the nodes of the largest case
    # leaves about 1.1 of this 2-vCPU box to the producers and everything else, and a node at
    # 0.15 core saturates at a few thousand messages/s, which one producer process outruns.
    node_cpu: float = 0.15
    # Each case's timed window, and how many windows each case gets (alternating with the other
    # case of its cluster; its figures are over all of them).
    seconds: float = 10.0
    repeat: int = 2
    warmup_s: float = 3.0
    batch: int = 100
    # Calls outstanding per shard: enough that every member of a capped chain always has a
    # group commit waiting (a capped node runs 15 ms in each 100 ms, so requests queue).
    in_flight: int = 64
    value_bytes: int = 100
    cases: tuple[str, ...] = tuple(CASES)
    # The bench's cgroup's CPU weight, in busy processes' worth (cgroups.CpuCaps): on a box that
    # others load too, the capped nodes should still get their caps and the producers what they
    # need, or the figures measure the others. 16 keeps that up to a load average of about 16;
    # the caps bound what the weight can take (6 x node_cpu plus the producers).
    weight: int = 16

    def __post_init__(self) -> None:
        if not limits.bench_scale_node_cpu_min <= self.node_cpu <= limits.bench_scale_node_cpu_max:
            raise ValueError(
                f"node_cpu must be {limits.bench_scale_node_cpu_min} .. "
                f"{limits.bench_scale_node_cpu_max} cores"
            )
        if self.seconds <= 0 or self.warmup_s < 0 or self.repeat < 1:
            raise ValueError("seconds must be > 0, warmup_s >= 0 and repeat >= 1")
        if self.batch < 1 or self.in_flight < 1 or self.value_bytes < 1:
            raise ValueError("batch, in_flight and value_bytes must be >= 1")
        if not 1 <= self.weight <= limits.bench_scale_weight_max:
            raise ValueError(f"weight must be 1 .. {limits.bench_scale_weight_max}")
        unknown = [case for case in self.cases if case not in CASES]
        if unknown or not self.cases:
            raise ValueError(f"cases must be some of {', '.join(CASES)} (got {unknown or 'none'})")


def stat_cpu_seconds(text: str, ticks_per_s: float) -> float:
    """utime + stime of a ``/proc/PID/stat`` line, in seconds (the command name, in brackets,
    may hold spaces and brackets: the fields are counted after the last ``)``)."""
    fields = text.rpartition(")")[2].split()
    if len(fields) < 13:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        return stat_cpu_seconds(handle.read(), os.sysconf("SC_CLK_TCK"))


class ChainedCluster(LocalCluster):
    """A LocalCluster whose shards are the chains given (node indexes), not rotated ones."""

    def __init__(self, base_dir: str, chains: Sequence[tuple[int, ...]], **kwargs: Any) -> None:
        self.chains = list(chains)
        super().__init__(base_dir, shards=len(self.chains), **kwargs)

    def _make_topology(self) -> Topology:
        made = super()._make_topology()
        ids = list(made.nodes)
        shards = {
            index: ShardChain(index, tuple(ids[position] for position in chain))
            for index, chain in enumerate(self.chains)
        }
        return dataclasses.replace(made, shards=shards)


async def _drive(
    urls: list[str],
    queue: str,
    parameters: ScaleBenchParameters,
    pids: dict[str, int],
    window_id: int,
) -> dict[str, Any]:
    """Produces to ``queue`` until the timed window is over; the window's figures. Keys start
    with ``window_id``: every window writes keys never written before (a key written again is
    a de-dup of the old one, which costs a node otherwise than a new message)."""
    from kayos.client.aio import AsyncClient

    value = bytes(parameters.value_bytes)
    keys = itertools.count()
    window: dict[str, Any] = {"open": False, "stop": False, "latencies": [], "errors": 0}
    committed: dict[int, int] = {}
    async with AsyncClient(urls, name="kayos-bench-scale") as client:
        topology = client.topology
        shards = topology.shards_for(queue)

        pending: dict[int, list[bytes]] = {shard: [] for shard in shards}

        def batch_for(shard: int) -> list[tuple[bytes, bytes]]:
            """``batch`` fresh keys that all go to ``shard`` (one request to its head): keys
            are made in runs and split by shard, so none is made in vain."""
            while len(pending[shard]) < parameters.batch:
                made = [
                    b"%04d-%016d" % (window_id, next(keys))
                    for _ in range(parameters.batch * len(shards))
                ]
                for part, positions in topology.split_by_shard(queue, made).items():
                    pending[part].extend(made[position] for position in positions)
            taken = pending[shard][: parameters.batch]
            del pending[shard][: parameters.batch]
            return [(key, value) for key in taken]

        async def worker(shard: int) -> None:
            # One shard's calls, each on its own: a slow chain never holds back another's.
            while not window["stop"]:
                items = batch_for(shard)
                began = time.perf_counter()
                try:
                    await client.produce_batch(queue, items, acks="all")
                except KayosError:
                    # A capped node on a loaded box can fall silent past the client's bound
                    # (client_silence_ms): the call is counted, not retried (its keys are new).
                    window["errors"] += 1
                    continue
                if window["open"]:
                    window["latencies"].append(time.perf_counter() - began)
                    committed[shard] = committed.get(shard, 0) + len(items)

        async def timer() -> dict[str, Any]:
            await asyncio.sleep(parameters.warmup_s)  # the window's start, not a synchronisation
            began, cpu_began = time.perf_counter(), _cpu_now(pids)
            window["open"] = True
            await asyncio.sleep(parameters.seconds)
            window["open"] = False
            wall, cpu_ended = time.perf_counter() - began, _cpu_now(pids)
            window["stop"] = True
            used = {node: cpu_ended[node] - cpu_began[node] for node in pids}
            return {"wall": wall, "cpu": used}

        workers = [worker(shard) for shard in shards for _ in range(parameters.in_flight)]
        timed, *_ = await asyncio.gather(timer(), *workers)
    return {
        **timed,
        "shards": list(shards),
        "committed": [committed.get(shard, 0) for shard in shards],
        "latencies": window["latencies"],
        "errors": window["errors"],
    }


def merge_drives(drives: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One case's windows as one: their wall time, CPU seconds, committed messages and
    latencies summed; ``window_msgs_per_s`` keeps each window's rate."""
    if not drives:
        raise ValueError("no window to merge")
    first = drives[0]
    return {
        "wall": sum(drive["wall"] for drive in drives),
        "cpu": {node: sum(drive["cpu"][node] for drive in drives) for node in first["cpu"]},
        "shards": first["shards"],
        "committed": [
            sum(values) for values in zip(*(d["committed"] for d in drives), strict=True)
        ],
        "latencies": [latency for drive in drives for latency in drive["latencies"]],
        "errors": sum(drive.get("errors", 0) for drive in drives),
        "window_msgs_per_s": [
            round(sum(drive["committed"]) / drive["wall"]) if drive["wall"] > 0 else 0
            for drive in drives
        ],
    }


def _cpu_now(pids: dict[str, int]) -> dict[str, float]:
    return {node: process_cpu_seconds(pid) for node, pid in pids.items()}


def case_figures(
    name: str,
    topology: Topology,
    drive: dict[str, Any],
    parameters: ScaleBenchParameters,
    throttled: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """One case's JSON from what ``_drive`` measured (node CPU includes the producers' process
    under the name ``producers``, which is left out of the nodes)."""
    chains = [topology.shards[shard].chain for shard in drive["shards"]]
    wall = drive["wall"]
    node_cpu = {node: s for node, s in drive["cpu"].items() if node != "producers"}
    found = attribute(chains, node_cpu, drive["committed"])
    for node, row in found["nodes"].items():
        row["cap_used"] = round(row["cpu_seconds"] / (wall * parameters.node_cpu), 2)
        row["throttled_periods"] = throttled.get(node, {}).get("nr_throttled")
    total = sum(drive["committed"])
    return {
        "case": name,
        "nodes": len(topology.nodes),
        "shards": len(chains),
        "chains": [list(chain) for chain in chains],
        "msgs_per_s": round(total / wall) if wall > 0 else 0,
        "committed": total,
        "committed_per_shard": drive["committed"],
        "window_s": round(wall, 3),
        "window_msgs_per_s": drive.get("window_msgs_per_s", []),
        "commit_p50_ms": percentile_ms(drive["latencies"], 0.5) if drive["latencies"] else None,
        "commit_p99_ms": percentile_ms(drive["latencies"], 0.99) if drive["latencies"] else None,
        "failed_calls": drive.get("errors", 0),
        "producer_cpus": round(drive["cpu"].get("producers", 0.0) / wall, 2) if wall else None,
        "node_cpu_s_per_msg": found["nodes"],
        "role_cpu_s_per_msg": found["roles"],
    }


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the bench as Ctrl-C does (its cgroups removed on the way out)."""

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_cluster(
    nodes: int,
    names: list[str],
    parameters: ScaleBenchParameters,
    caps: CpuCaps,
    directory: str,
    phase: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """One cluster of ``nodes`` capped nodes; each of the cases ``names`` run on it in turn."""
    queues = {MANY_QUEUE: max(CASES[name][1] for name in names)}
    cluster = ChainedCluster(
        os.path.join(directory, f"{nodes}-nodes"),
        CLUSTERS[nodes],
        nodes=nodes,
        replicas=3,
        queue_shards={name: count for name, count in queues.items() if count > 1},
    )
    results: dict[str, dict[str, Any]] = {}
    phase(f"starting {nodes} nodes")
    groups = {node: f"{nodes}n-{node}" for node in cluster.ids}  # a group per node per cluster
    with cluster:
        pids: dict[str, int] = {}
        for node, group in groups.items():
            pid = cluster.pid(node)
            assert pid is not None, node
            caps.cap(group, parameters.node_cpu)
            caps.add(group, pid)
            pids[node] = pid
        urls = list(cluster.urls.values())
        drives: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        throttled: dict[str, dict[str, dict[str, int]]] = {name: {} for name in names}
        # The cases' windows alternate (1 shard, several, 1, several, ...): a box whose speed
        # drifts from minute to minute drifts under every case alike.
        for round_ in range(1, parameters.repeat + 1):
            for name in names:
                queue = ONE_QUEUE if CASES[name][1] == 1 else MANY_QUEUE
                phase(f"{name} window {round_} of {parameters.repeat}")
                before = {node: caps.throttled(groups[node]) for node in pids}
                every = {**pids, "producers": os.getpid()}
                window_id = len(names) * (round_ - 1) + names.index(name)
                drive = _drive(urls, queue, parameters, every, window_id)
                drives[name].append(asyncio.run(drive))
                for node in pids:
                    counted = throttled[name].setdefault(node, {})
                    for key, value in caps.throttled(groups[node]).items():
                        counted[key] = counted.get(key, 0) + value - before[node].get(key, 0)
        for name in names:
            merged = merge_drives(drives[name])
            results[name] = case_figures(
                name, cluster.topology, merged, parameters, throttled[name]
            )
        phase(f"stopping {nodes} nodes")
    return results


def model_figures(cases: dict[str, dict[str, Any]], node_cpu: float) -> dict[str, Any] | None:
    """The role costs of the first one-role case run, and each case's predicted throughput
    beside its measured one (``error``: predicted / measured - 1)."""
    source = next((name for name in COST_CASES if name in cases), None)
    if source is None:
        return None
    measured = cases[source]["role_cpu_s_per_msg"]
    if any(role not in measured for role in ("head", "middle", "tail")):
        return None
    costs = RoleCosts(measured["head"], measured["middle"], measured["tail"])
    predictions: dict[str, Any] = {}
    for name, case in cases.items():
        predicted = predict_msgs_per_s(case["chains"], costs, node_cpu)
        predictions[name] = {
            "predicted_msgs_per_s": round(predicted),
            "measured_msgs_per_s": case["msgs_per_s"],
            "error": round(predicted / case["msgs_per_s"] - 1, 3) if case["msgs_per_s"] else None,
        }
    return {
        "costs_from": source,
        "role_cpu_s_per_msg": asdict(costs),
        "chain_cpu_s_per_msg": costs.per_message(3),
        "predictions": predictions,
    }


def ratios(cases: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Many shards against one, per cluster, where both ran."""
    found: dict[str, float] = {}
    for one, many in (("6n-1s", "6n-2s"), ("3n-1s", "3n-3s")):
        if one in cases and many in cases and cases[one]["msgs_per_s"]:
            found[f"{many}_vs_{one}"] = round(
                cases[many]["msgs_per_s"] / cases[one]["msgs_per_s"], 2
            )
    return found


def bench_scale(
    parameters: ScaleBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
    cgroup_root: str = DEFAULT_ROOT,
) -> dict[str, Any]:
    """Chooses where the caps go (``CgroupUnavailable`` before anything starts if nowhere), runs
    the cases, and returns the figures; every cgroup made is removed on the way out."""
    hierarchy: Hierarchy = choose(Path(cgroup_root))
    swept = sweep_stale(hierarchy)
    if swept:
        phase(f"removed cgroups a killed run left: {', '.join(swept)}")
    directory = base or tempfile.mkdtemp(prefix="kayos-bench-scale-")
    cases: dict[str, dict[str, Any]] = {}
    left: list[str] = []
    try:
        with _terminate_as_interrupt():
            caps = CpuCaps(hierarchy, weight=parameters.weight)
            try:
                with caps:
                    # The producers (this process) in a group of their own, uncapped: outside
                    # the nodes' caps, inside the bench's weight.
                    caps.cap("producers", None)
                    caps.add("producers", os.getpid())
                    for nodes in CLUSTERS:
                        names = [n for n in parameters.cases if CASES[n][0] == nodes]
                        if names:
                            cases.update(
                                _run_cluster(nodes, names, parameters, caps, directory, phase)
                            )
            finally:
                left = caps.close()
    finally:
        if base is None:
            shutil.rmtree(directory, ignore_errors=True)
    if left:
        raise RuntimeError("cgroups left behind: " + "; ".join(left))
    return {
        "bench": "scale",
        "cases": cases,
        "ratios": ratios(cases),
        "model": model_figures(cases, parameters.node_cpu),
        "cgroup": {"kind": hierarchy.kind, "path": str(hierarchy.path)},
        "parameters": {**asdict(parameters), "acks": "all", "replication": 3, "fsync": True},
        "machine": machine_facts(),
    }


def text_lines(result: dict[str, Any]) -> list[str]:
    """The figures as aligned lines: each case, the ratios, the model's predictions."""
    lines = [f"cgroup {result['cgroup']['kind']} at {result['cgroup']['path']}, "
             f"{result['parameters']['node_cpu']} core per node"]  # fmt: skip
    for name, case in result["cases"].items():
        roles = ", ".join(
            f"{role} {seconds * 1e6:.0f} us" for role, seconds in case["role_cpu_s_per_msg"].items()
        )
        lines.append(
            f"{name:>6}: {case['msgs_per_s']:>8,} msgs/s  producers {case['producer_cpus']} cpu"
            f"  cpu/msg {roles or 'every node carries several roles'}"
        )
    for name, ratio in result["ratios"].items():
        lines.append(f"{name}: {ratio}x")
    model = result["model"]
    if model is not None:
        for name, row in model["predictions"].items():
            lines.append(
                f"{name:>6}: model {row['predicted_msgs_per_s']:>8,} msgs/s  "
                f"measured {row['measured_msgs_per_s']:>8,}  error {row['error']:+.0%}"
            )
    return lines
