"""``python -m kayos.bench.membership.catchup``: how fast a learner copies a large shard, against
the disk's sequential write speed measured in the same run, and how much live produce throughput
drops while it does (docs/replication-protocol.md, "Learners and repair links").

Workload: a LocalCluster of 4 node processes, one shard a -> b -> c, d outside it. The shard is
filled to ``shard_mb`` (values of ``fill_value_bytes``). Then, alternating: a produce phase alone
(``produce_s`` seconds, acks=all, batches of 100 x 100 B with ``in_flight`` outstanding), and a
produce phase of the same shape while d copies the whole shard from the tail c (d's store wiped
before each copy). Figures: ``disk_seq_write_mb_per_s`` (one file of ``disk_probe_mb`` written in
1 MiB writes, one fsync), ``catchup_mb_per_s`` (the bytes the learner's store file holds after the
copy over the copy's wall time, the median of ``idle_copies`` copies of the idle shard; a learner
holding nothing copies the source's store file whole, docs/replication-protocol.md "Store
snapshots", so its file is the source's) on an idle shard and under live writes, produce msgs/s
with and without a copy running, and ``produce_drop_during_catchup`` (1 - with / without, mean
over the rounds). Each copy also reports ``copy_mode`` (``file`` or ``log``) and
``copy_cpu_s_per_gb`` (c's and d's CPU seconds spent on it per GB copied; an idle copy's baseline
is the ``IDLE_BASELINE_S`` before it, a round's its produce phase alone:
``kayos.bench.membership.copycost``); the top level gives the idle copies' mode and median cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from kayos.bench.membership.copycost import CpuMark, copy_cost, cpu_mark, log_size
from kayos.bench.produce import machine_facts
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.signing import sign

QUEUE = "catchup"
LIVE_QUEUE = "catchup-live"
# The baseline window of an idle copy's CPU cost: the serving node's CPU per second before it.
IDLE_BASELINE_S = 1.0


@dataclass(frozen=True, slots=True)
class CatchUpBenchParameters:
    shard_mb: int = 200
    fill_value_bytes: int = 8000
    produce_s: float = 5.0
    in_flight: int = 8
    rounds: int = 2
    disk_probe_mb: int = 256
    copy_timeout_s: float = 600.0
    idle_copies: int = 3


def disk_seq_write_mb_per_s(directory: str, megabytes: int) -> float:
    path = os.path.join(directory, "disk-probe")
    block = os.urandom(1 << 20)
    began = time.perf_counter()
    with open(path, "wb") as handle:
        for _ in range(megabytes):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - began
    os.unlink(path)
    return round(megabytes / seconds, 1)


async def _fill(client: Any, megabytes: int, value_bytes: int) -> None:
    value = os.urandom(value_bytes)
    total = megabytes * (1 << 20) // value_bytes
    batch = max(1, (1 << 20) // value_bytes)
    starts = iter(range(0, total, batch))

    async def worker() -> None:
        for start in starts:
            items = [(b"f%012d" % n, value) for n in range(start, min(start + batch, total))]
            await client.produce_batch(QUEUE, items, acks="all")

    await asyncio.gather(*(worker() for _ in range(4)))


async def _produce_for(client: Any, seconds: float, in_flight: int, stop: asyncio.Event) -> float:
    """Produces until ``seconds`` passed or ``stop`` is set; returns msgs/s."""
    value = b"v" * 100
    counter = iter(range(10**12))
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal sent
        while time.perf_counter() < deadline and not stop.is_set():
            base = next(counter) * 100
            items = [(b"l%014d" % (base + i), value) for i in range(100)]
            await client.produce_batch(LIVE_QUEUE, items, acks="all")
            sent += 100

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return sent / (time.perf_counter() - began)


def _status(cluster: LocalCluster, node: str) -> dict[str, Any]:
    status = cluster.status(node) or {}
    shard = status.get("shards", {}).get("0")
    return shard if isinstance(shard, dict) else {}


def _wipe_learner(cluster: LocalCluster) -> None:
    if cluster.running("d"):
        cluster.kill("d")
    shutil.rmtree(cluster.data_dir("d") / "shards" / "0", ignore_errors=True)
    cluster.start("d")


def _order_copy(cluster: LocalCluster) -> None:
    assert cluster.identity is not None
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "c"}
    status, reply = http_json(
        f"{cluster.url('d')}/v1/admin/catch-up",
        method="POST",
        body={"body": body, "mac": sign(cluster.identity, "catch-up", body)},
    )
    if status != 200:
        raise RuntimeError(f"catch-up refused: {status} {reply}")


async def _copy(cluster: LocalCluster, timeout_s: float) -> float:
    """Orders d to copy shard 0 from c; returns the seconds until d holds what c held."""
    target = int(_status(cluster, "c")["last_seq"])
    began = time.perf_counter()
    await asyncio.to_thread(_order_copy, cluster)
    while time.perf_counter() - began < timeout_s:
        learner = await asyncio.to_thread(_status, cluster, "d")
        if int(learner.get("durable_seq", 0)) >= target:
            return time.perf_counter() - began
        await asyncio.sleep(0.05)  # a bounded poll of the learner's status
    raise RuntimeError(f"d did not copy the shard within {timeout_s} s")


async def _measured_copy(
    cluster: LocalCluster, timeout_s: float, baseline: tuple[CpuMark, CpuMark] | None
) -> tuple[float, dict[str, Any]]:
    """``_copy`` with what it cost (``copy_mode``, ``copy_cpu_s_per_gb``: docs/performance.md,
    "What a copy costs"; ``baseline``: the window before it, None: the last ``IDLE_BASELINE_S``)."""
    if baseline is None:
        before = cpu_mark(cluster, ["c"])
        await asyncio.sleep(IDLE_BASELINE_S)  # the baseline window's length, not a wait
        baseline = (before, cpu_mark(cluster, ["c"]))
    offset = log_size(cluster.log_path("d"))
    start = cpu_mark(cluster, ["c", "d"])
    seconds = await _copy(cluster, timeout_s)
    end = cpu_mark(cluster, ["c", "d"])
    copied = _file_mb(cluster, "d") * (1 << 20)
    cost = copy_cost(cluster, "d", offset, (baseline, start, end), copied)
    return seconds, cost


def _copy_figures(cluster: LocalCluster, seconds: float) -> dict[str, Any]:
    """One idle copy: its wall time (order to the learner holding the source's last seq) and, if
    it went by snapshot, the file copy's own time (docs/replication-protocol.md, "Store
    snapshots"); the rest is the order, opening the copy and subscribing."""
    mb = _file_mb(cluster, "d")
    snapshot = _status(cluster, "d").get("snapshot") or {}
    figures: dict[str, Any] = {"seconds": round(seconds, 3), "learner_file_mb": round(mb, 1)}
    figures["mb_per_s"] = round(mb / seconds, 1)
    if snapshot.get("done"):
        figures["snapshot_copy_s"] = float(snapshot["seconds"])
        figures["snapshot_attempts"] = int(snapshot["attempts"])
    return figures


def _file_mb(cluster: LocalCluster, node: str) -> float:
    """The node's data file of shard 0, in MiB (a learner's: what the copy wrote)."""
    directory = cluster.data_dir(node) / "shards" / "0"
    size = sum(p.stat().st_size for p in directory.glob("data.*.kys"))
    return size / (1 << 20)


async def _run(cluster: LocalCluster, parameters: CatchUpBenchParameters) -> dict[str, Any]:
    from kayos.client.aio import AsyncClient

    rounds: list[dict[str, Any]] = []
    async with AsyncClient(list(cluster.urls.values()), name="kayos-bench-catchup") as client:
        await _fill(client, parameters.shard_mb, parameters.fill_value_bytes)
        cluster.wait_replicated(120)
        source_mb = _file_mb(cluster, "c")
        idle: list[dict[str, Any]] = []
        for copy_no in range(parameters.idle_copies):
            if copy_no:
                await asyncio.to_thread(_wipe_learner, cluster)
            copy_s, cost = await _measured_copy(cluster, parameters.copy_timeout_s, None)
            idle.append(_copy_figures(cluster, copy_s) | cost)
        idle_s = sorted(c["seconds"] for c in idle)[len(idle) // 2]
        idle_mb = idle[0]["learner_file_mb"]
        for _ in range(parameters.rounds):
            before = cpu_mark(cluster, ["c"])
            alone = await _produce_for(
                client, parameters.produce_s, parameters.in_flight, asyncio.Event()
            )
            baseline = (before, cpu_mark(cluster, ["c"]))
            await asyncio.to_thread(_wipe_learner, cluster)
            cluster.wait_replicated(120)
            stop = asyncio.Event()
            copy = asyncio.create_task(_measured_copy(cluster, parameters.copy_timeout_s, baseline))
            # The produce phase lasts as long as the copy (at least produce_s).
            producing = asyncio.create_task(
                _produce_for(client, parameters.copy_timeout_s, parameters.in_flight, stop)
            )
            copy_s, cost = await copy
            remaining = parameters.produce_s - copy_s
            if remaining > 0:
                await asyncio.sleep(remaining)  # the phase's length, not a synchronisation
            stop.set()
            during = await producing
            shard_mb = _file_mb(cluster, "d")
            rounds.append(
                {
                    "produce_msgs_per_s_alone": round(alone),
                    "produce_msgs_per_s_during_catchup": round(during),
                    "catchup_s_under_load": round(copy_s, 2),
                    "catchup_mb_per_s_under_load": round(shard_mb / copy_s, 1),
                    "shard_mb": round(shard_mb, 1),
                }
                | cost
            )
    drops = [
        1 - r["produce_msgs_per_s_during_catchup"] / r["produce_msgs_per_s_alone"] for r in rounds
    ]
    costs = [c["copy_cpu_s_per_gb"] for c in idle if c["copy_cpu_s_per_gb"] is not None]
    modes = [c["copy_mode"] for c in idle]
    return {
        "catchup_mb_per_s": round(idle_mb / idle_s, 1),
        # How the idle copies went and what they cost (the rounds' under load are per round).
        "copy_mode": modes[0] if len(set(modes)) == 1 else modes,
        "copy_cpu_s_per_gb": sorted(costs)[len(costs) // 2] if costs else None,
        "idle_copies": idle,
        "catchup_shard_mb": round(idle_mb, 1),
        "source_file_mb": round(source_mb, 1),
        "catchup_s": round(idle_s, 2),
        # None with --rounds 0 (idle copies only: what a copy costs, with nothing else running).
        "produce_drop_during_catchup": round(sum(drops) / len(drops), 3) if drops else None,
        "rounds": rounds,
    }


def bench_catchup(parameters: CatchUpBenchParameters, base: str | None = None) -> dict[str, Any]:
    directory = base or tempfile.mkdtemp(prefix="kayos-bench-catchup-")
    try:
        disk = disk_seq_write_mb_per_s(directory, parameters.disk_probe_mb)
        cluster = LocalCluster(os.path.join(directory, "cluster"), nodes=4, replicas=3, shards=1)
        with cluster:
            figures = asyncio.run(_run(cluster, parameters))
            cluster.stop()
    finally:
        if base is None:
            shutil.rmtree(directory, ignore_errors=True)
    figures["disk_seq_write_mb_per_s"] = disk
    figures["catchup_share_of_disk"] = round(figures["catchup_mb_per_s"] / disk, 3)
    return {**figures, "parameters": asdict(parameters), "machine": machine_facts()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kayos.bench.membership.catchup")
    defaults = CatchUpBenchParameters()
    parser.add_argument("--shard-mb", type=int, default=defaults.shard_mb)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--idle-copies", type=int, default=defaults.idle_copies)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    parameters = CatchUpBenchParameters(
        shard_mb=args.shard_mb, rounds=args.rounds, idle_copies=args.idle_copies
    )
    print(json.dumps(bench_catchup(parameters, args.dir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
