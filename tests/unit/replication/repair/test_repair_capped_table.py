"""A head repairing below its durable mark whose peers' takeover tables, full, no longer name any
master its store knows (campaign seed 11112411, docs/campaigns.md): the peers answered its repair
with the divergence verdict 0, which the repair link read as "holds no more than this replica", so
the head asked for ever while the peers held every acknowledged entry (shard 1 unavailable 130 s
and never converged). A verdict the table cap explains is a reset: the head drops its store,
keeps its mark, re-copies everything from the peer and leads. And while it repairs, nothing is
read from it, nor are its groups listed: a head alone is its shard's tail too, and it served a
snapshot from its older marks (the group's mark moved back by 31,000 seqs).

In-process nodes on loopback (``Node``); every wait is a bounded poll of a condition."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kayos.errors import UnavailableError
from kayos.node.runtime import Node
from tests.support.links import one_shard_topology, until
from tests.support.replicas import (
    REPAIR_SEED,
    cut_head_behind_capped_peers,
    repair_node,
    repaired,
    started,
    stored_keys,
)

pytestmark = pytest.mark.unit


@pytest.mark.asyncio
async def test_a_head_below_its_mark_resets_from_a_peer_whose_full_table_names_none_of_its_masters(
    tmp_path: Path,
) -> None:
    print("seed", REPAIR_SEED)
    topology = one_shard_topology(["a", "b", "c"])
    queue = "q"
    total, kept = await cut_head_behind_capped_peers(topology, tmp_path)

    nodes = await started(topology, tmp_path)
    try:
        head = nodes["a"].replicas[0]
        assert head.repairing
        assert head.store.last_seq < total
        await until(
            repaired(nodes, total), "the head re-copying what it lost from a peer and leading"
        )
        head = nodes["a"].replicas[0]
        assert stored_keys(head) == kept
        assert head.marked_committed >= total, "the reset lowered the head's durable mark"
        await nodes["a"].produce(queue, [b"new"], [b"v"], None, None, acks=-1)
        tail = nodes["c"].replicas[0]
        await until(
            lambda: stored_keys(tail) == {*kept, b"q\x00new"}, "the tail holding every entry"
        )
    finally:
        for node in nodes.values():
            await node.stop()


@pytest.mark.asyncio
async def test_a_head_alone_serves_no_read_while_it_repairs(tmp_path: Path) -> None:
    """A head alone is its shard's tail: while its store repairs, a snapshot, a group's lag and
    a retention policy read from it are refused (``unavailable``), not served from older marks."""
    print("seed", REPAIR_SEED)
    topology = one_shard_topology(["a"])
    node = repair_node(topology, "a", tmp_path)
    await node.start()
    try:
        await node.produce("q", [b"k"], [b"v"], None, None, acks=-1)
        await node.commit_group("q", "g", 1, None)
        page = await node.consume("q", "g", after=None, upto=None, limit=10, wait_ms=0)
        assert page.hwm == 1
        node.replicas[0].repairing = True
        with pytest.raises(UnavailableError, match="repairing"):
            await node.consume("q", "g", after=None, upto=None, limit=10, wait_ms=0)
        with pytest.raises(UnavailableError, match="repairing"):
            await node.group_info("q", "g")
        with pytest.raises(UnavailableError, match="repairing"):
            node.retention.get_policy("q")
        node.replicas[0].repairing = False
        assert (await node.group_info("q", "g"))["hwm"] == 1
    finally:
        await node.stop()


@pytest.mark.asyncio
async def test_a_repairing_head_lists_no_groups(tmp_path: Path) -> None:
    """``GET /v1/shards/{shard}/groups`` reads the head's marks (the client and the Kestrel
    front ask the head): while it repairs they are an older state's, refused like a consume."""
    print("seed", REPAIR_SEED)
    topology = one_shard_topology(["a"])
    node = Node(topology, "a", str(tmp_path / "a"), rng=random.Random(REPAIR_SEED))
    await node.start()
    try:
        await node.produce("q", [b"k"], [b"v"], None, None, acks=-1)
        await node.commit_group("q", "g", 1, None)
        assert node.list_groups(0) == [{"queue": "q", "group": "g", "hwm": 1}]
        node.replicas[0].repairing = True
        with pytest.raises(UnavailableError, match="repairing"):
            node.list_groups(0)
        node.replicas[0].repairing = False
        assert node.list_groups(0) == [{"queue": "q", "group": "g", "hwm": 1}]
    finally:
        await node.stop()
