"""A full disk on a real 3-node chain (docs/retention.md, "Disk full"): the head's data directory
is a tmpfs of a fixed size; two producers with acks=all fill it. Producers get 507 disk_full (and
nothing else), status and /metrics say so, every acknowledged message survives on every replica,
`kayos check` passes on the full node's store, and once space is freed (a person deletes a
ballast file) writes resume without a restart.

Needs root to mount the tmpfs; skipped (saying so) without it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import (
    answered_status,
    produce,
    read_snapshot,
    wait_until,
    write_ballast,
)
from tests.support.cluster import small_disk as mount_small_disk

pytestmark = pytest.mark.integration

# The tmpfs: the disk reserve and the head's margin, room for ~20 MB of data, and a ballast to
# free later.
BALLAST_BYTES = 24 * 1024 * 1024
TMPFS_BYTES = (
    limits.disk_reserve_bytes + limits.disk_head_margin_bytes + BALLAST_BYTES + 20 * 1024 * 1024
)
# Producers stop after this many bytes if the disk never fills (a failure, not a hang).
PRODUCE_BYTES_MAX = 4 * TMPFS_BYTES
VALUE = "x" * 1000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mount_small_disk(tmp_path / "cluster" / "a", TMPFS_BYTES) as mount_point:
        yield mount_point


def metric(cluster: LocalCluster, node: str, name: str) -> float | None:
    with urllib.request.urlopen(f"{cluster.url(node)}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(rf'^{name}\{{[^}}]*shard="0"[^}}]*\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def disk_full_shown(cluster: LocalCluster, node: str) -> bool:
    status = answered_status(cluster, node)
    return bool(status["shards"]["0"]["disk_full"])


def test_a_full_disk_refuses_writes_loses_nothing_and_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", nodes=3, replicas=3, shards=1)
    ballast = small_disk / "ballast"
    write_ballast(ballast, BALLAST_BYTES)
    cluster.start_all()
    try:
        assert cluster.head_of("fill") == "a"
        head = cluster.url("a")
        acked: list[str] = []
        refused: list[int] = []
        unexpected: list[Any] = []
        lock = threading.Lock()
        sent = [0]

        def producer(name: str) -> None:
            n = 0
            while sent[0] < PRODUCE_BYTES_MAX:
                with lock:
                    if len(refused) >= 20:
                        return
                keys = [f"{name}-{n + i}" for i in range(50)]
                n += 50
                status, body = produce(head, "fill", [(k, VALUE) for k in keys])
                with lock:
                    sent[0] += 50 * len(VALUE)
                    if status == 200:
                        acked.extend(keys)
                    elif status == 507 and body["error"]["code"] == "disk_full":
                        refused.append(status)
                    else:
                        unexpected.append((status, body))
                        return

        threads = [threading.Thread(target=producer, args=(f"p{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert not any(thread.is_alive() for thread in threads)
        assert not unexpected, unexpected[:3]
        assert refused, f"the disk never filled ({sent[0]} bytes sent)"
        assert acked
        print(f"acked {len(acked)} messages, then {len(refused)} refusals with 507")
        assert disk_full_shown(cluster, "a")
        assert metric(cluster, "a", "kayos_shard_disk_full") == 1.0
        # Still full: refused again, with the defined error.
        status, body = produce(head, "fill", [(f"more-{i}", VALUE) for i in range(50)])
        assert status == 507, body
        # A person frees space: writes resume by themselves.
        ballast.unlink()

        def accepted() -> bool:
            status, body = produce(head, "fill", [("after", "freed")])
            assert status in (200, 507), body
            return status == 200

        wait_until(accepted, "writes to resume once space was freed")
        wait_until(lambda: not disk_full_shown(cluster, "a"), "status to clear disk_full")
        assert metric(cluster, "a", "kayos_shard_disk_full") == 0.0
        # Every acknowledged message is there, on a tail (so on every member).
        snap = read_snapshot(cluster.url(cluster.tails_of("fill")[0]), "fill", "audit")
        seen = {m["key"] for m in snap.messages}
        assert set(acked) <= seen, len(set(acked) - seen)
        assert "after" in seen
        status, groups = http_json(f"{head}/v1/shards/0/groups")
        assert status == 200, groups
    finally:
        cluster.stop()
    for node in cluster.ids:
        check = subprocess.run(
            [sys.executable, "-m", "kayos", "check", str(cluster.data_dir(node) / "shards" / "0")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, (node, check.stdout, check.stderr)
