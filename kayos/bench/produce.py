"""``kayos bench produce``: a replicated chain's produce and consume figures, end to end.

Workload (issue 4's): a LocalCluster of ``replicas`` node processes with one shard whose chain is
all of them, fsync on; unique 16-byte keys (so de-dup keeps every message) with 100-byte values,
produced by ``kayos.AsyncClient`` in batches of 100 with many batches in flight, ``acks=all``.

Figures:
- ``msgs_per_s``: produced messages over the wall time of the batched phase.
- ``commit_p50_ms``/``commit_p99_ms``: per batch, produce call to committed (acks=all) reply.
- ``single_commit_p99_ms``: one message at a time, acks=all, sequential (the latency floor).
- ``consume_msgs_per_s``: one consumer snapshot of the whole bench queue read from the tail
  with the client's ``consume``.

With ``queue_shards`` N > 1 (``--queue-shards``) the cluster has ``max(replicas, N)`` rotated
shards and the batched phase runs twice in the same run, on the same nodes: on ``bench`` (one
shard, one head) and on ``bench-sharded`` (N shards: with N = replicas one head on every node);
each call carries ``batch`` x N messages, which the client splits by shard (``produce_sharded``)
into about ``batch`` per shard, so each of the N chains sees the load the one chain saw (the
same batch size, ``in_flight`` requests). ``sharded_msgs_per_s`` and ``sharded_vs_one_ratio``
report the second against the first.

The client runs in this process and the nodes in theirs, on the same machine: the figures are
for one box, and ``machine`` says which. ``cpu`` says, per batched phase, how busy the box was
(``busy_share``: CPU seconds of the nodes and this process over wall time x usable CPUs;
``machine_busy_share``: every process on the box), the busiest process's share of one CPU, and
the CPU each 1,000 messages cost (``cpu_ms_per_1k_msgs``). Shards add throughput only while the
one-shard phase leaves CPUs idle (its head, a single event loop, at one CPU while others wait):
when ``machine_busy_share`` is near 1 in both phases the box, not the chain, is the limit, and
the ratio measures the CPU each message costs, which sharding does not lower
(docs/performance.md).
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kayos import limits, tlsconfig
from kayos.bench.series import BIN_S, per_bin, quantiles_ms
from kayos.local.cluster import LocalCluster
from kayos.local.credentials import hold_credential

BENCH_QUEUE = "bench"
SHARDED_QUEUE = "bench-sharded"
SINGLE_QUEUE = "bench-single"
WARMUP_QUEUE = "bench-warmup"
# Batches produced before timing starts: opens connections and warms the nodes' caches.
warmup_batches = 20


@dataclass(frozen=True, slots=True)
class ProduceBenchParameters:
    messages: int = 300_000
    batch: int = 100
    # Enough batches in flight that every chain member always has a group commit waiting: the
    # head gathers what arrives while its store fsyncs, so throughput grows with this, and so
    # does the per-batch commit latency (Little's law). 128 x 100 x 100 B is 1.3 MB outstanding
    # (a Kafka producer buffers up to 32 MB); here it gave 183-197k msgs/s where 64 gave
    # 143-199k in the same minutes, at about twice the commit_p50_ms.
    in_flight: int = 128
    replicas: int = 3
    singles: int = 2000
    value_bytes: int = 100
    # Shards of the second queue (1: no second queue, the figures are one shard's only).
    queue_shards: int = 1
    # Node processes (None: ``replicas``). More nodes than replicas spread the shards' chains
    # (rotated) over them, e.g. 3 nodes, replicas 1, queue_shards 3: one head on each node.
    nodes: int | None = None
    # TLS on every port and link (docs/security.md): the cost of encryption, against plain.
    tls: bool = False
    # A credentials file (docs/security.md): the cluster holds its credential and the client
    # proves it on every request and connection (None: the cluster runs open).
    credentials: str | None = None

    def __post_init__(self) -> None:
        if self.messages < 1 or self.batch < 1 or self.in_flight < 1 or self.singles < 0:
            raise ValueError("messages, batch and in_flight must be >= 1, singles >= 0")
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.nodes is not None and self.nodes < self.replicas:
            raise ValueError("nodes must be >= replicas")
        if not 1 <= self.queue_shards <= limits.bench_queue_shards_max:
            raise ValueError(f"queue_shards must be 1 .. {limits.bench_queue_shards_max}")

    @property
    def shard_count(self) -> int:
        """The cluster's shards: one, or enough for the sharded queue and a head per node."""
        return 1 if self.queue_shards == 1 else max(self.node_count, self.queue_shards)

    @property
    def node_count(self) -> int:
        return self.replicas if self.nodes is None else self.nodes


class CpuMeter:
    """CPU seconds used by a set of processes (the nodes and this one) between two samples."""

    def __init__(self, pids: list[int]) -> None:
        import psutil

        self._processes = [psutil.Process(pid) for pid in pids]
        self._usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self._began = 0.0
        self._start: list[float] = []
        self._machine_start: Any = None

    def _sample(self) -> list[float]:
        import psutil

        seconds: list[float] = []
        for process in self._processes:
            try:
                times = process.cpu_times()
                seconds.append(times.user + times.system)
            except psutil.Error:  # a process gone: its last sample stands
                seconds.append(0.0)
        return seconds

    def start(self) -> None:
        import psutil

        self._start = self._sample()
        self._machine_start = psutil.cpu_times()
        self._began = time.perf_counter()

    def stop(self, messages: int) -> dict[str, Any]:
        import psutil

        wall = time.perf_counter() - self._began
        ends = self._sample()
        used = [max(0.0, end - start) for start, end in zip(self._start, ends, strict=True)]
        machine = psutil.cpu_times()
        idle = (machine.idle - self._machine_start.idle) + (
            getattr(machine, "iowait", 0.0) - getattr(self._machine_start, "iowait", 0.0)
        )
        total = sum(machine) - sum(self._machine_start)
        cpus = self._usable or os.cpu_count() or 1
        return {
            # Ours (the nodes and the client) over wall time x usable CPUs.
            "busy_share": round(sum(used) / (wall * cpus), 2) if wall > 0 else None,
            # Every process on the box, ours or not (1.0: no CPU left idle).
            "machine_busy_share": round(1 - idle / total, 2) if total > 0 else None,
            "busiest_process_cpus": round(max(used) / wall, 2) if wall > 0 and used else None,
            "cpu_seconds": round(sum(used), 2),
            "cpu_ms_per_1k_msgs": round(sum(used) * 1e6 / messages, 2) if messages else None,
        }


def percentile_ms(samples_s: list[float], fraction: float) -> float:
    """The nearest-rank percentile of latencies in seconds, in milliseconds."""
    assert samples_s, "a percentile of nothing"
    ordered = sorted(samples_s)
    rank = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return round(ordered[rank] * 1000, 3)


def _key(number: int) -> bytes:
    return b"%016d" % number


async def _produce_phase(
    client: Any,
    parameters: ProduceBenchParameters,
    value: bytes,
    queue: str = BENCH_QUEUE,
    per_call: int | None = None,
    done: list[tuple[float, float]] | None = None,
) -> tuple[float, list[float]]:
    """Produces ``messages`` in calls of ``per_call`` (default ``batch``) with ``in_flight``
    calls outstanding; returns the wall time and each call's produce->committed latency, and
    appends each call's (seconds since the phase began, messages committed) to ``done``."""
    latencies: list[float] = []
    done = [] if done is None else done
    size = per_call or parameters.batch
    starts = iter(range(0, parameters.messages, size))

    async def worker() -> None:
        for start in starts:  # shared iterator: each batch is taken by one worker
            end = min(start + size, parameters.messages)
            items = [(_key(n), value) for n in range(start, end)]
            began = time.perf_counter()
            # Split by shard (one part on a one-shard queue), each part to its head at once.
            await client.produce_sharded(queue, items, acks="all")
            ended = time.perf_counter()
            latencies.append(ended - began)
            done.append((ended - phase_began, float(end - start)))

    phase_began = began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(parameters.in_flight)))
    return time.perf_counter() - began, latencies


async def _single_phase(client: Any, count: int, value: bytes) -> list[float]:
    latencies: list[float] = []
    for number in range(count):
        began = time.perf_counter()
        await client.produce(SINGLE_QUEUE, _key(number), value, acks="all")
        latencies.append(time.perf_counter() - began)
    return latencies


async def _consume_phase(client: Any, queue: str = BENCH_QUEUE) -> tuple[int, float]:
    consumed = 0
    began = time.perf_counter()
    async for page in client.consume(queue, "bench-reader", page_size=10_000):
        consumed += len(page.messages)
    return consumed, time.perf_counter() - began


async def run_workload(
    urls: list[str],
    parameters: ProduceBenchParameters,
    meter: CpuMeter | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """The workload against the nodes at ``urls``: its figures."""
    from kayos.client.aio import AsyncClient

    value = bytes(range(256))[: parameters.value_bytes].ljust(parameters.value_bytes, b"x")
    async with AsyncClient(urls, name="kayos-bench", credentials=parameters.credentials) as client:
        phase("warm-up")
        for number in range(warmup_batches):
            items = [(_key(number * parameters.batch + i), value) for i in range(parameters.batch)]
            await client.produce_batch(WARMUP_QUEUE, items, acks="all")
        cpu: dict[str, Any] = {}
        if meter is not None:
            meter.start()
        done: list[tuple[float, float]] = []
        seconds, batch_latencies = await _produce_phase(client, parameters, value, done=done)
        if meter is not None:
            cpu["one_shard"] = meter.stop(parameters.messages)
        phase(f"single produces ({parameters.singles})")
        single_latencies = await _single_phase(client, parameters.singles, value)
        phase("consume")
        consumed, consume_seconds = await _consume_phase(client)
        sharded: dict[str, Any] = {}
        if parameters.queue_shards > 1:
            if meter is not None:
                meter.start()
            phase(f"sharded produce ({parameters.queue_shards} shards)")
            sharded_seconds, sharded_latencies = await _produce_phase(
                client,
                parameters,
                value,
                SHARDED_QUEUE,
                parameters.batch * parameters.queue_shards,
            )
            if meter is not None:
                cpu["sharded"] = meter.stop(parameters.messages)
            sharded_consumed, _ = await _consume_phase(client, SHARDED_QUEUE)
            sharded = {
                "sharded_msgs_per_s": round(parameters.messages / sharded_seconds),
                "sharded_commit_p50_ms": percentile_ms(sharded_latencies, 0.50),
                "sharded_commit_p99_ms": percentile_ms(sharded_latencies, 0.99),
                "sharded_produce_seconds": round(sharded_seconds, 3),
                "sharded_vs_one_ratio": round(seconds / sharded_seconds, 2),
                "sharded_consumed": sharded_consumed,
            }
    result: dict[str, Any] = {
        "msgs_per_s": round(parameters.messages / seconds),
        "commit_p50_ms": percentile_ms(batch_latencies, 0.50),
        "commit_p99_ms": percentile_ms(batch_latencies, 0.99),
        "produce_seconds": round(seconds, 3),
    }
    if single_latencies:
        result["single_commit_p50_ms"] = percentile_ms(single_latencies, 0.50)
        result["single_commit_p99_ms"] = percentile_ms(single_latencies, 0.99)
    result["consume_msgs_per_s"] = round(consumed / consume_seconds) if consume_seconds else 0
    result["consumed"] = consumed
    if cpu:
        result["cpu"] = cpu
    # The pictures' series (--plot): messages committed per bin of the batched phase, and the
    # commit latencies' quantiles (a CDF).
    result["series"] = {
        "bin_s": BIN_S,
        "committed_per_bin": [round(v) for v in per_bin(done, 0.0, seconds + BIN_S)],
        "commit_quantiles_ms": quantiles_ms(batch_latencies),
        "single_commit_quantiles_ms": quantiles_ms(single_latencies),
    }
    return {**result, **sharded}


def machine_facts() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def bench_produce(
    parameters: ProduceBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Starts the cluster under ``base`` (a temporary directory if None), runs the workload,
    stops the cluster and returns the figures with the parameters and machine facts; ``phase``
    is told the name of each phase as it begins (a progress display)."""
    directory = base or tempfile.mkdtemp(prefix="kayos-bench-produce-")
    cluster = LocalCluster(
        os.path.join(directory, "cluster"),
        nodes=parameters.node_count,
        replicas=parameters.replicas,
        shards=parameters.shard_count,
        queue_shards={SHARDED_QUEUE: parameters.queue_shards}
        if parameters.queue_shards > 1
        else {},
        tls=parameters.tls,
    )
    try:
        phase(f"starting {parameters.node_count} nodes")
        with cluster:
            if parameters.credentials is not None:
                hold_credential(cluster, parameters.credentials)
            pids = [cluster.pid(node) for node in cluster.urls]
            meter = CpuMeter([os.getpid(), *(pid for pid in pids if pid is not None)])
            urls = list(cluster.urls.values())
            figures = asyncio.run(run_workload(urls, parameters, meter, phase))
            phase("stopping the cluster")
            exits = cluster.stop()
    finally:
        tlsconfig.install(None)
        if base is None:
            shutil.rmtree(directory, ignore_errors=True)
    for name in ("consumed", "sharded_consumed"):
        if figures.get(name, parameters.messages) != parameters.messages:
            raise RuntimeError(f"{name} {figures[name]} of {parameters.messages} messages")
    return {
        "bench": "produce",
        **figures,
        "node_exit_codes": exits,
        "parameters": {
            **asdict(parameters),
            "acks": "all",
            "shards": parameters.shard_count,
            "fsync": True,
        },
        "machine": machine_facts(),
    }
