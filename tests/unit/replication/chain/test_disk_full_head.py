"""A head whose own commit fails for space (docs/retention.md, "Disk full": the margin was not
enough): the producer gets DiskFullError, every later write too while the disk stays full, the
head retries its new history and writes resume by themselves once space is there, with nothing
acknowledged lost and the failed batch on no replica. In-process nodes on loopback; every wait is
a bounded poll."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from kayos.errors import DiskFullError
from kayos.node.runtime import Node
from tests.support.links import one_shard_topology, until

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from pathlib import Path

SEED = 20261124


def _keys(nodes: dict[str, Node], queue: str) -> dict[str, set[bytes]]:
    out = {}
    for name, node in nodes.items():
        with node.replicas[0].store.snapshot() as snap:
            out[name] = {
                e.key for page in snap.pages(0, snap.boundary, include_expired=True) for e in page
            }
    return out


@pytest.mark.asyncio
async def test_a_head_commit_failing_for_space_refuses_writes_then_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    print("seed", SEED)
    topology = one_shard_topology(["a", "b", "c"])
    nodes = {
        n: Node(topology, n, str(tmp_path / n), rng=random.Random(SEED + i))
        for i, n in enumerate("abc")
    }
    for node in nodes.values():
        await node.start()
    try:
        head = nodes["a"]
        replica = head.replicas[0]
        await until(lambda: replica.downstream_streams, "the chain to link")
        await head.produce("q", [b"k1"], [b"v1"], None, None, acks=-1)
        # The head's own check passes (as if the space went between it and the write) and the
        # store's reserve refuses the write.
        monkeypatch.setattr(replica, "_check_space", lambda payload: None)
        replica.store.options.disk_reserve_bytes = 1 << 62
        with pytest.raises(DiskFullError):
            await head.produce("q", [b"lost"], [b"x"], None, None, acks=-1)
        assert replica.disk_full
        assert head.status()["shards"]["0"]["disk_full"] is True
        with pytest.raises(DiskFullError):
            await head.produce("q", [b"refused"], [b"x"], None, None, acks=-1)
        # Space comes back: the head's retry starts its new history, writes resume.
        replica.store.options.disk_reserve_bytes = 0
        await until(lambda: not replica.starting_new_history, "the new history", 30)
        await head.produce("q", [b"k2"], [b"v2"], None, None, acks=-1)
        assert not replica.disk_full

        def k2_everywhere() -> dict[str, set[bytes]] | None:
            keys = _keys(nodes, "q")
            return keys if all(b"q\x00k2" in k for k in keys.values()) else None

        stored = await until(k2_everywhere, "k2 on every replica")
        for keys in stored.values():
            assert b"q\x00k1" in keys
            assert b"q\x00lost" not in keys
            assert b"q\x00refused" not in keys
    finally:
        for node in nodes.values():
            await node.stop()
