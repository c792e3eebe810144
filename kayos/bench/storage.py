"""``kayos bench storage``: the shard store against lmdb on the same workload, same run.

Workload (the storage issue's): N messages, 16-byte random keys of which 20% repeat an earlier
key, 100-byte values, 1,000 messages per commit, fsync on. Each engine runs in its own child
process so peak RSS and page cache effects are its own. Keys are derived from integers by
hashing, so the generator holds no list of keys and adds nothing to the measured RSS; only the
time inside commit calls is counted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

_U64 = struct.Struct(">Q")


def workload(
    messages: int, batch: int, seed: int, repeat_fraction: float = 0.2
) -> Iterator[list[tuple[bytes, bytes]]]:
    rng = random.Random(seed)  # noqa: S311 - workload shape, not security
    unique = 0
    value = bytes(rng.getrandbits(8) for _ in range(100))
    produced = 0
    while produced < messages:
        rows: list[tuple[bytes, bytes]] = []
        for _ in range(min(batch, messages - produced)):
            if unique and rng.random() < repeat_fraction:
                number = rng.randrange(unique)
            else:
                number = unique
                unique += 1
            key = hashlib.blake2b(_U64.pack(number), digest_size=16, person=b"kayos").digest()
            rows.append((key, value))
        produced += len(rows)
        yield rows


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_kayos(directory: str, messages: int, batch: int, seed: int) -> dict[str, Any]:
    from kayos import limits
    from kayos.storage import Put, ShardStore

    store = ShardStore.open(directory)
    commit_seconds = 0.0
    latencies: list[float] = []
    for rows in workload(messages, batch, seed):
        ops = [Put(key, value) for key, value in rows]
        started = time.perf_counter()
        store.commit(ops)
        elapsed = time.perf_counter() - started
        commit_seconds += elapsed
        latencies.append(elapsed)
    file_bytes = store.file_bytes()
    stats = store.stats()
    # The first read of this process, straight after the writes: nothing is pre-read (the file
    # is in the OS page cache as the writes left it), and every live entry is built with its
    # value, in pages of the default size (what a consumer that names no size gets).
    scanned = 0
    started = time.perf_counter()
    with store.snapshot() as snapshot:
        for page in snapshot.pages(0):
            scanned += len(page)
    scan_seconds = time.perf_counter() - started
    store.close()
    derived_bytes = _tree_bytes(os.path.join(directory, "derived"))
    latencies.sort()
    return {
        "msgs_per_s": round(messages / commit_seconds),
        "bytes_written_per_msg": round(file_bytes / messages, 1),
        "payload_bytes_per_msg": 116,
        "index_bytes_per_msg": round(derived_bytes / messages, 1),
        "scan_msgs_per_s": round(scanned / scan_seconds),
        "scanned_live_msgs": scanned,
        "scan_page_entries": limits.scan_page_entries_default,
        "commit_p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "commit_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "file_bytes": file_bytes,
        "live_keys": stats["keys"],
    }


def run_lmdb(directory: str, messages: int, batch: int, seed: int) -> dict[str, Any]:
    import lmdb

    env = lmdb.open(directory, map_size=1 << 36, max_dbs=2, sync=True, metasync=True)
    by_key = env.open_db(b"by_key")
    by_seq = env.open_db(b"by_seq")
    seq = 0
    commit_seconds = 0.0
    for rows in workload(messages, batch, seed):
        started = time.perf_counter()
        with env.begin(write=True) as txn:
            for key, value in rows:
                seq += 1
                old = txn.get(key, db=by_key)
                if old is not None:
                    txn.delete(old, db=by_seq)
                packed = _U64.pack(seq)
                txn.put(key, packed, db=by_key)
                txn.put(packed, key + value, db=by_seq, append=True)
        commit_seconds += time.perf_counter() - started
    scanned = 0
    started = time.perf_counter()
    with env.begin(db=by_seq) as txn:
        for _ in txn.cursor():
            scanned += 1
    scan_seconds = time.perf_counter() - started
    env.close()
    return {
        "msgs_per_s": round(messages / commit_seconds),
        "scan_msgs_per_s": round(scanned / scan_seconds),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "file_bytes": _tree_bytes(directory),
    }


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def _child(engine: str, messages: int, batch: int, seed: int, base: str) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix=f"kayos-bench-{engine}-", dir=base)
    try:
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "kayos.bench.storage",
                engine,
                directory,
                str(messages),
                str(batch),
                str(seed),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
        return result
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def bench_storage(
    messages: int = 1_000_000,
    batch: int = 1000,
    seed: int = 1,
    base: str | None = None,
    with_lmdb: bool = True,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """The shard store, then lmdb (unless ``with_lmdb`` is False), each in a child process on
    the same workload; ``phase`` is told which runs as it begins (a progress display)."""
    base = base or tempfile.gettempdir()
    phase(f"shard store: {messages} messages")
    kayos = _child("kayos", messages, batch, seed, base)
    result: dict[str, Any] = {
        "workload": {
            "messages": messages,
            "per_commit": batch,
            "key_bytes": 16,
            "value_bytes": 100,
            "repeat_fraction": 0.2,
            "fsync": True,
            "seed": seed,
        },
        **kayos,
    }
    if with_lmdb:
        phase(f"lmdb: {messages} messages")
        baseline = _child("lmdb", messages, batch, seed, base)
        result["lmdb_msgs_per_s"] = baseline["msgs_per_s"]
        result["lmdb_scan_msgs_per_s"] = baseline["scan_msgs_per_s"]
        result["lmdb_bytes_on_disk"] = baseline["file_bytes"]
        result["lmdb_peak_rss_mb"] = baseline["peak_rss_mb"]
        result["speedup_vs_lmdb"] = round(kayos["msgs_per_s"] / max(1, baseline["msgs_per_s"]), 2)
    return result


def main(argv: list[str]) -> int:
    engine, directory, messages, batch, seed = argv
    runner = run_kayos if engine == "kayos" else run_lmdb
    print(json.dumps(runner(directory, int(messages), int(batch), int(seed))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
