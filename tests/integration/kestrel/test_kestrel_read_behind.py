"""Read-behind on a real cluster (docs/kestrel-compat.md §10): a ``kayos kestrel --cluster``
process with a small max_memory_size_bytes serves a queue many times that size, imported with
``kayos import-kestrel``'s code path, to a memcache client (python-memcached): exact FIFO order,
open/abort/close and a disconnect across the boundary, the memory part within its bound."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.kestrel import KestrelFront
from kestrel_compat.backends.kayos_backend import KayosBackend
from kestrel_compat.migration.importer import IMPORTED, import_queue
from kestrel_compat.migration.plan import plan

pytestmark = pytest.mark.integration

memcache: Any = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")

ITEMS = 2000
ITEM_BYTES = 1000
BOUND_BYTES = 128 * 1024  # 131 items in memory; the queue is 15x that


def item(index: int) -> bytes:
    return (b"%06d" % index).ljust(ITEM_BYTES, b".")


def import_items(directory: Path, seed: str) -> None:
    directory.mkdir()
    with open(directory / "big", "wb") as handle:
        for index in range(ITEMS):
            data = item(index)
            handle.write(struct.pack("<biqq", 2, 16 + len(data), 1_000 + index, 0) + data)

    async def run() -> str:
        backend = await KayosBackend.connect(seed)
        try:
            (files,), _ = plan(directory)
            return (await import_queue(backend, directory, files, existing=set())).result
        finally:
            await backend.close()

    assert asyncio.run(run()) == IMPORTED


def queue_stats(client: Any, queue: str) -> dict[str, int]:
    ((_, stats),) = client.get_stats()
    prefix = f"queue_{queue}_"
    return {
        key[len(prefix) :]: int(value)
        for key, value in stats.items()
        if key.startswith(prefix) and value.lstrip("-").isdigit()
    }


def test_a_queue_many_times_max_memory_size_is_served_in_order(
    tmp_path: Path, start_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    seed = cluster.url(cluster.ids[0])
    import_items(tmp_path / "kestrel", seed)
    config = tmp_path / "kestrel.toml"
    config.write_text(f"[default]\nmax_memory_size_bytes = {BOUND_BYTES}\n")
    front = KestrelFront(tmp_path / "front.log", cluster=seed, config=config)
    front.start()
    try:
        client = memcache.Client([front.address], dead_retry=0, socket_timeout=30)
        stats = queue_stats(client, "big")
        assert stats["items"] == ITEMS
        assert stats["bytes"] == ITEMS * ITEM_BYTES
        assert 0 < stats["mem_bytes"] <= BOUND_BYTES
        # Sets while the queue is behind go behind, after everything already queued.
        for index in range(ITEMS, ITEMS + 50):
            assert client.set("big", item(index))
        served: list[bytes] = []
        most_in_memory = 0
        while len(served) < 300:
            value = client.get("big/close/open")
            assert value is not None, f"END after {len(served)} items"
            served.append(value)
            if len(served) % 25 == 0:
                most_in_memory = max(most_in_memory, queue_stats(client, "big")["mem_bytes"])
        # An abort at the head returns the item; a disconnect returns the open one too.
        assert client.get("big/abort") is None
        assert client.get("big/open") == served.pop()
        client.disconnect_all()
        reader = memcache.Client([front.address], dead_retry=0, socket_timeout=30)
        while (value := reader.get("big/close/open")) is not None:
            served.append(value)
            if len(served) % 250 == 0:
                most_in_memory = max(most_in_memory, queue_stats(reader, "big")["mem_bytes"])
        assert reader.get("big/close") is None
        assert served == [item(index) for index in range(ITEMS + 50)]
        assert most_in_memory <= BOUND_BYTES + ITEM_BYTES
        final = queue_stats(reader, "big")
        assert (final["items"], final["mem_items"], final["open_transactions"]) == (0, 0, 0)
        reader.disconnect_all()
    finally:
        front.stop()
