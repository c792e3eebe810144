"""Helpers of the Spark tier: a cluster's endpoints as the source's option, fresh queue names on a
shard, rows written and read back through the plain client, and a bounded wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kayos.client import Client
from kayos.local.cluster import LocalCluster

# Bounds of the waits below: generous for 2 shared cores; only a failure reaches them.
WAIT_S = 120.0


def endpoints(cluster: LocalCluster) -> str:
    """The cluster's node URLs, comma-separated, as the source's ``kayos.endpoints`` option."""
    return ",".join(cluster.urls.values())


def queue_on_shard(cluster: LocalCluster, shard: int, stem: str) -> str:
    """A fresh queue name that lives in ``shard``."""
    for n in range(10_000):
        name = f"{stem}-{n}"
        if cluster.topology.shard_for(name) == shard:
            return name
    raise AssertionError(f"no queue name for shard {shard}")


def produce_rows(client: Client, queue: str, rows: list[tuple[str, str | None]]) -> int:
    """Produces ``rows`` with acks=all in batches; returns the last seq."""
    last = 0
    for i in range(0, len(rows), 5_000):
        _first, last = client.produce_batch(queue, rows[i : i + 5_000], acks="all")
    return last


def read_all(client: Client, queue: str) -> list[tuple[bytes, bytes | None, int]]:
    """Every live entry of the queue now, as ``(key, value, seq)``, through the plain client."""
    out: list[tuple[bytes, bytes | None, int]] = []
    after = 0
    while True:
        page = client.read(queue, after=after, limit=10_000)
        out += [(m.key, m.value, m.seq) for m in page.messages]
        if page.end:
            return out
        after = page.next


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Polls ``condition`` until it returns something truthy; fails the test after the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)  # a bounded poll of a condition, not a synchronisation by time
