"""``python -m kayos.bench.kestrel.journal_import``: ``kayos import-kestrel`` of one queue of N
items.

Writes a Kestrel journal of ``items`` ADDX records of ``item_bytes`` each, starts a LocalCluster
(3 node processes, replication factor 3, fsync on), imports the queue in this process exactly as
the command does (``kestrel_compat.migration.importer.import_queue``) and reports items/s over the
whole import (replay of the journal, batches produced with ``acks=all``, the group commit), with
the CPU seconds of this process and of the three nodes (docs/performance.md, "Kestrel journal
import").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from kayos.local.cluster import LocalCluster
from kestrel_compat.backends.kayos_backend import KayosBackend
from kestrel_compat.migration.importer import QueueResult, import_queue
from kestrel_compat.migration.plan import plan

_ADDX = struct.Struct("<biqq")


def write_journal(path: Path, items: int, item_bytes: int) -> None:
    pad = b"x" * max(0, item_bytes - 10)
    with open(path, "wb") as handle:
        for index in range(items):
            data = (b"%010d" % index)[:item_bytes] + pad
            handle.write(_ADDX.pack(2, 16 + len(data), 1_700_000_000_000 + index, 0) + data)


def bench_import(items: int, item_bytes: int, root: Path) -> dict[str, Any]:
    directory = root / "kestrel"
    directory.mkdir(parents=True)
    write_journal(directory / "bulk", items, item_bytes)
    cluster = LocalCluster(root / "cluster", nodes=3, replicas=3)
    cluster.start_all()
    try:
        processes = [psutil.Process(cluster.pid(node)) for node in cluster.ids]

        def nodes_cpu_s() -> float:
            return sum(sum(process.cpu_times()[:2]) for process in processes)

        async def run() -> QueueResult:
            backend = await KayosBackend.connect(cluster.url(cluster.ids[0]))
            try:
                (files,), _ = plan(directory)
                return await import_queue(backend, directory, files, existing=set())
            finally:
                await backend.close()

        nodes_before, client_before = nodes_cpu_s(), time.process_time()
        started = time.monotonic()
        result = asyncio.run(run())
        wall_s = time.monotonic() - started
        return {
            "result": result.result,
            "items": result.items,
            "bytes": result.bytes,
            "wall_s": round(wall_s, 2),
            "items_per_s": round(result.items / wall_s),
            "client_cpu_s": round(time.process_time() - client_before, 1),
            "nodes_cpu_s": round(nodes_cpu_s() - nodes_before, 1),
        }
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--item-bytes", type=int, default=100)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kayos-bench-import-") as root:
        print(json.dumps(bench_import(arguments.items, arguments.item_bytes, Path(root))))


if __name__ == "__main__":
    main()
