"""A snapshot below the head is confirmed up to a head that holds its lease (CONFIRM/CONFIRMED,
``ShardReplica.confirm_chain``; docs/replication-protocol.md, "Confirming a snapshot").

One hop was not enough (docs/campaigns.md, "Findings"): a tail cut off from the manager together
with its upstream kept its link, and served a group a snapshot below a mark the new chain had
committed. Here a tail whose upstream is still linked to it, but no longer to the head, serves
nothing; nor does one whose head lost its lease. In-process managed nodes over real stores and
real loopback links; the lease is granted and ended through ``NodeLease`` as the manager's
answers would (no manager, no clock stepping)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.errors import UnavailableError
from kayos.node.runtime import Node
from kayos.replication.shard.replica import ShardReplica
from tests.support.links import until
from tests.support.replicas import QUEUE, SEED, grant, managed_chain, node_chain, snapshot

pytestmark = pytest.mark.unit


async def produced_and_level(nodes: dict[str, Node], tail: str) -> ShardReplica:
    """One acks=all write at a; returns once ``tail``'s replica serves it (the lease granted)."""
    grant(nodes["a"])
    await nodes["a"].produce(QUEUE, [b"k0"], [b"v"], None, None, acks=-1)
    replica = nodes[tail].replicas[0]
    await until(lambda: replica.commit_point >= 1 and not replica.catching_up, "the tail level")
    assert await snapshot(nodes[tail]) == [1]
    return replica


def end(node: Node) -> None:
    """The leader's answer that the node is in no chain any more: the lease ends at once."""
    assert not node.lease.granted(node.lease.ask(), node.epoch, False)


@pytest.mark.asyncio
async def test_the_tail_serves_only_while_the_head_holds_its_lease(tmp_path: Path) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "abc") as (_, nodes):
        tail = await produced_and_level(nodes, "c")
        middle = nodes["b"].replicas[0]
        # Transitive: the middle asked its own upstream after the tail asked it.
        assert tail.upstream_stream is not None
        assert middle.upstream_stream is not None
        assert middle.upstream_stream.confirm_nonce >= 1
        assert middle.upstream_stream.confirmed(middle.upstream_stream.confirm_nonce) is True

        end(nodes["a"])  # the manager's answer: the head was spliced out
        with pytest.raises(UnavailableError, match="did not confirm the chain up to a head"):
            await snapshot(nodes["c"])
        assert tail.upstream_stream is not None  # every link still up: only the lease said no

        grant(nodes["a"])
        assert await snapshot(nodes["c"]) == [1]


@pytest.mark.asyncio
async def test_a_tail_cut_off_with_its_upstream_serves_nothing(tmp_path: Path) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "abc") as (_, nodes):
        tail = await produced_and_level(nodes, "c")
        middle = nodes["b"].replicas[0]

        # b and c on one side, the head (with its lease) on the other: b's link to a is gone,
        # c's link to b stays. The old one-hop check (a PONG from b) would serve here.
        link = next(link for link in nodes["b"].links if link.replica is middle)
        link.stop()
        assert middle.upstream_stream is not None
        middle.upstream_stream.close()
        await until(lambda: middle.upstream_stream is None, "b cut from a")
        assert tail.upstream_stream is not None
        with pytest.raises(UnavailableError, match="its upstream b did not confirm"):
            await snapshot(nodes["c"])


@pytest.mark.asyncio
async def test_a_head_serving_its_own_snapshots_needs_its_lease(tmp_path: Path) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "a") as (_, nodes):
        head = nodes["a"]
        await head.produce(QUEUE, [b"k0"], [b"v"], None, None, acks=-1)
        end(head)
        with pytest.raises(UnavailableError, match="this head holds no lease"):
            await snapshot(head)
        grant(head)
        assert await snapshot(head) == [1]
        end(head)
        with pytest.raises(UnavailableError, match="this head holds no lease"):
            await snapshot(head)


@pytest.mark.asyncio
async def test_static_chains_need_no_lease(tmp_path: Path) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path, "ab") as (_, nodes):
        assert nodes["a"].lease.remaining_ms() is None
        await produced_and_level(nodes, "b")  # served with no answer from any manager
