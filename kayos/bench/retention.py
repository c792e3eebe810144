"""``kayos bench retention``: the retention soak (docs/retention.md, issue 15's acceptance).

Workload: a LocalCluster of 3 node processes, one shard whose chain is all of them, fsync on. The
queue has the policy ``until_consumed`` (and no other limit). One producer writes
``volume_factor`` times ``budget_bytes`` of payload (unique keys, ``value_bytes`` values, batches
of ``batch`` with ``in_flight`` batches outstanding, ``acks=all``); one consumer group reads
snapshot after snapshot from a tail and commits each boundary (it keeps up). Every
``sample_interval_ms`` the bench adds up, for each node, the disk blocks its data directory uses
(``st_blocks``: sparse files count what they hold, not their length).

Figures: ``produced_bytes``, ``consumed`` (must equal the messages produced), per node the
highest and the final disk use, and ``max_disk_bytes`` over all nodes; ``within_budget`` is true
when no sample of any node passed ``budget_bytes``. Bounded: the run stops after
``deadline_s`` whatever happened (and says so).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kayos.bench.produce import machine_facts
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json

# The disk-use series in the JSON keeps at most this many samples (thinned evenly).
SERIES_POINTS_MAX = 600
SOAK_QUEUE = "soak"
SOAK_GROUP = "soak-reader"


@dataclass(frozen=True, slots=True)
class RetentionSoakParameters:
    budget_bytes: int = 64 * 1024 * 1024
    volume_factor: int = 10
    value_bytes: int = 1000
    batch: int = 200
    in_flight: int = 4
    sample_interval_ms: int = 200
    deadline_s: float = 900.0

    def __post_init__(self) -> None:
        if self.budget_bytes < 1 or self.volume_factor < 1 or self.value_bytes < 1:
            raise ValueError("budget_bytes, volume_factor and value_bytes must be >= 1")
        if self.batch < 1 or self.in_flight < 1 or self.sample_interval_ms < 1:
            raise ValueError("batch, in_flight and sample_interval_ms must be >= 1")

    @property
    def messages(self) -> int:
        return -(-self.budget_bytes * self.volume_factor // (self.value_bytes + 16))


def disk_bytes(directory: str) -> int:
    """Bytes of disk the files under ``directory`` occupy (``st_blocks``), files that vanish
    while walking (a compaction's old file) skipped."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


class _Sampler:
    def __init__(self, directories: dict[str, str], interval_s: float) -> None:
        self.directories = directories
        self.interval_s = interval_s
        self.peak = dict.fromkeys(directories, 0)
        self.samples = 0
        self.began = time.monotonic()
        # [seconds since the sampler was made, each node's bytes in ``directories``' order].
        self.series: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> dict[str, int]:
        now = {node: disk_bytes(path) for node, path in self.directories.items()}
        for node, used in now.items():
            self.peak[node] = max(self.peak[node], used)
        self.samples += 1
        self.series.append([round(time.monotonic() - self.began, 3), *now.values()])
        return now

    def thinned(self) -> dict[str, Any]:
        """The disk-use series (the picture's, --plot), at most ``SERIES_POINTS_MAX`` samples
        (every k-th, the last kept), in MB per node."""
        step = max(1, -(-len(self.series) // SERIES_POINTS_MAX))
        kept = self.series[::step]
        if self.series and kept[-1] is not self.series[-1]:
            kept.append(self.series[-1])
        return {
            "t_s": [row[0] for row in kept],
            "disk_mb": {
                node: [round(row[1 + i] / (1 << 20), 2) for row in kept]
                for i, node in enumerate(self.directories)
            },
        }

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


async def _run(urls: list[str], parameters: RetentionSoakParameters) -> dict[str, Any]:
    from kayos.client.aio import AsyncClient

    value = b"r" * parameters.value_bytes
    total = parameters.messages
    produced = consumed = 0
    deadline = time.monotonic() + parameters.deadline_s
    done_producing = asyncio.Event()
    async with AsyncClient(urls, name="kayos-bench-retention") as client:
        starts = iter(range(0, total, parameters.batch))

        async def producer() -> None:
            nonlocal produced
            for start in starts:  # shared iterator: each batch is taken by one worker
                if time.monotonic() > deadline:
                    return
                end = min(start + parameters.batch, total)
                items = [(b"%016d" % n, value) for n in range(start, end)]
                await client.produce_batch(SOAK_QUEUE, items, acks="all")
                produced += end - start

        async def consumer() -> None:
            nonlocal consumed
            while time.monotonic() < deadline:
                boundary = None
                async for page in client.consume(
                    SOAK_QUEUE, SOAK_GROUP, page_size=5000, wait_s=0.2
                ):
                    consumed += len(page.messages)
                    boundary = page.boundary
                if boundary is not None:
                    await client.commit(SOAK_QUEUE, SOAK_GROUP, boundary)
                if done_producing.is_set() and consumed >= produced:
                    return

        async def producers() -> None:
            await asyncio.gather(*(producer() for _ in range(parameters.in_flight)))
            done_producing.set()

        began = time.perf_counter()
        await asyncio.gather(producers(), consumer())
        seconds = time.perf_counter() - began
    return {
        "messages": produced,
        "consumed": consumed,
        "produced_bytes": produced * (parameters.value_bytes + 16),
        "seconds": round(seconds, 2),
        "msgs_per_s": round(produced / seconds) if seconds else 0,
        "deadline_hit": time.monotonic() > deadline,
    }


def bench_retention(
    parameters: RetentionSoakParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Starts the cluster under ``base`` (a temporary directory if None), runs the soak, stops
    the cluster and returns the figures with the parameters and machine facts; ``phase`` is told
    what runs as it begins (a progress display)."""
    directory = base or tempfile.mkdtemp(prefix="kayos-bench-retention-")
    cluster = LocalCluster(os.path.join(directory, "cluster"), nodes=3, replicas=3, shards=1)
    try:
        phase("starting 3 nodes")
        with cluster:
            head = cluster.url(cluster.head_of(SOAK_QUEUE))
            status, reply = http_json(
                f"{head}/v1/queues/{SOAK_QUEUE}/retention",
                method="PUT",
                body={"until_consumed": True},
                timeout_s=60,
            )
            if status != 200:
                raise RuntimeError(f"setting the policy failed: {status} {reply}")
            directories = {node: str(cluster.data_dir(node)) for node in cluster.ids}
            sampler = _Sampler(directories, parameters.sample_interval_ms / 1000)
            volume_mb = parameters.volume_factor * parameters.budget_bytes / (1 << 20)
            phase(f"soak: {volume_mb:g} MB produced and consumed")
            with sampler:
                figures = asyncio.run(_run(list(cluster.urls.values()), parameters))
            final = sampler.sample()
            exits = cluster.stop()
    finally:
        if base is None:
            shutil.rmtree(directory, ignore_errors=True)
    peak = sampler.peak
    return {
        "bench": "retention",
        **figures,
        "budget_bytes": parameters.budget_bytes,
        "volume_over_budget": round(figures["produced_bytes"] / parameters.budget_bytes, 2),
        "max_disk_bytes": max(peak.values()),
        "peak_disk_bytes": peak,
        "final_disk_bytes": final,
        "within_budget": max(peak.values()) <= parameters.budget_bytes,
        "samples": sampler.samples,
        "disk_series": sampler.thinned(),
        "node_exit_codes": exits,
        "parameters": {**asdict(parameters), "policy": {"until_consumed": True}},
        "machine": machine_facts(),
    }
