"""``python -m kayos.bench.kestrel.read_behind``: the Kestrel front's memory serving a queue many
times its max_memory_size_bytes (docs/kestrel-compat.md §10, docs/performance.md).

Fills one Kestrel queue on a LocalCluster (3 node processes, replication factor 3) with
``queue_bytes`` of ``item_bytes`` items through the front's own backend (as ``kayos
import-kestrel`` does), starts a ``kayos kestrel --cluster`` process with ``max_memory_size_bytes``
set, and drains the queue with one python-memcached client doing ``get q/close/open``, checking
that every item comes in order. The front's RSS is sampled every ``sample_s`` from its start
(recovery included) to the end of the drain; the report gives it after start-up and at its most.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from kayos.local.cluster import LocalCluster
from kayos.local.kestrel import KestrelFront
from kestrel_compat.backends.kayos_backend import KayosBackend
from kestrel_compat.core.persistence import GroupState, NewEntry, encode_removed

QUEUE = "big"
_BATCH_BYTES = 8 * 1024 * 1024


def item(index: int, item_bytes: int) -> bytes:
    return (b"%010d" % index).ljust(item_bytes, b".")


async def fill(seed: str, items: int, item_bytes: int) -> None:
    backend = await KayosBackend.connect(seed)
    try:
        per_batch = max(1, _BATCH_BYTES // item_bytes)
        first = 0
        for start in range(0, items, per_batch):
            entries = [
                NewEntry(item(index, item_bytes), 1_000, None, (QUEUE,))
                for index in range(start, min(items, start + per_batch))
            ]
            seqs = await backend.append(QUEUE, entries)
            first = first or seqs[0]
        await backend.commit_group(QUEUE, QUEUE, GroupState(first - 1, encode_removed(0, [])))
    finally:
        await backend.close()


class RssSampler(threading.Thread):
    def __init__(self, sample_s: float) -> None:
        super().__init__(daemon=True)
        self.sample_s = sample_s
        self.pid: int | None = None
        self.max_bytes = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.sample_s):
            if self.pid is None:
                continue
            try:
                rss = psutil.Process(self.pid).memory_info().rss
            except psutil.Error:
                continue
            self.max_bytes = max(self.max_bytes, rss)


def bench_read_behind(
    queue_bytes: int, item_bytes: int, memory_bytes: int, root: Path, sample_s: float = 0.2
) -> dict[str, Any]:
    import memcache  # python-memcached, in the dev extra

    items = queue_bytes // item_bytes
    cluster = LocalCluster(root / "cluster", nodes=3, replicas=3)
    cluster.start_all()
    try:
        seed = cluster.url(cluster.ids[0])
        started = time.monotonic()
        asyncio.run(fill(seed, items, item_bytes))
        fill_s = time.monotonic() - started
        config = root / "kestrel.toml"
        config.write_text(f"[default]\nmax_memory_size_bytes = {memory_bytes}\n")
        front = KestrelFront(root / "front.log", cluster=seed, config=config)
        sampler = RssSampler(sample_s)
        sampler.start()
        started = time.monotonic()
        front.start()
        assert front.process is not None
        sampler.pid = front.process.pid
        start_s = time.monotonic() - started
        after_start = psutil.Process(front.process.pid).memory_info().rss
        try:
            client = memcache.Client([front.address], dead_retry=0, socket_timeout=60)
            started = time.monotonic()
            served = 0
            while (value := client.get(f"{QUEUE}/close/open")) is not None:
                if value != item(served, item_bytes):
                    raise AssertionError(f"item {served} out of order: {value[:10]!r}")
                served += 1
            client.get(f"{QUEUE}/close")
            drain_s = time.monotonic() - started
            client.disconnect_all()
        finally:
            sampler.stopping.set()
            sampler.join()
            front.stop()
        if served != items:
            raise AssertionError(f"served {served} of {items} items")
        return {
            "queue_bytes": items * item_bytes,
            "items": items,
            "item_bytes": item_bytes,
            "max_memory_size_bytes": memory_bytes,
            "fill_s": round(fill_s, 1),
            "front_start_s": round(start_s, 1),
            "drain_s": round(drain_s, 1),
            "drain_items_per_s": round(items / drain_s),
            "front_rss_after_start_mb": round(after_start / 2**20, 1),
            "front_rss_max_mb": round(max(sampler.max_bytes, after_start) / 2**20, 1),
        }
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queue-mb", type=int, default=2048)
    parser.add_argument("--item-bytes", type=int, default=4096)
    parser.add_argument("--memory-mb", type=int, default=64)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kayos-bench-read-behind-") as root:
        report = bench_read_behind(
            arguments.queue_mb * 2**20,
            arguments.item_bytes,
            arguments.memory_mb * 2**20,
            Path(root),
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
