"""A head that lost entries it had acknowledged re-fetches them from the nodes that hold them
before it leads (docs/replication-protocol.md, "An upstream that lacks committed entries";
docs/node-api.md, "Self-repair"): a head back with an empty store, a head whose downstream is
repairing itself. A link too old to name the commit point it knows is refused, since the head
could not tell from it what it lost. In-process nodes on loopback; every wait is a bounded poll
of a condition."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kayos.errors import ProtocolError
from kayos.replication.logic import durablemark
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from tests.support.links import first_answer, until
from tests.support.replicas import SEED, chain_node, node_chain, stored_keys

pytestmark = pytest.mark.unit


@pytest.mark.asyncio
async def test_a_head_back_with_an_empty_store_refetches_instead_of_ordering_a_reset(
    tmp_path: Path,
) -> None:
    """The head comes back with an empty store (lost disk) and, sharing no history with the
    middle, would order it to reset. The middle's SUBSCRIBE names the commit point it knows, so
    the head sees it lost committed entries: it never sends the order, re-fetches them from the
    middle and only then leads (docs/replication-protocol.md, "An upstream that lacks committed
    entries"). Obeying the order would destroy acknowledged data on every member (issue 11,
    "Safety"); the middle's refusal of such an order stays the net below a head."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (topology, nodes):
        queue = "q"
        for i in range(5):
            await nodes["a"].produce(queue, [f"old-{i}".encode()], [b"v"], None, None, acks=-1)
        middle, tail = (nodes[n].replicas[0] for n in "bc")
        await until(lambda: middle.commit_point >= 5, "the middle knowing the commit point")
        kept = stored_keys(middle)
        await nodes["a"].stop()
        shutil.rmtree(tmp_path / "a")
        nodes["a"] = chain_node(topology, "a", tmp_path)
        await nodes["a"].start()

        def repaired() -> bool:
            head = nodes["a"].replicas.get(0)
            return head is not None and not head.repairing and head.durable >= 5

        await until(repaired, "the head re-fetching what it lost")
        head = nodes["a"].replicas[0]
        assert stored_keys(head) == kept
        assert head.repair_status() is not None
        await nodes["a"].produce(queue, [b"new"], [b"v"], None, None, acks=-1)
        assert middle.refused_rollbacks == 0, "the head ordered a rollback"
        assert middle.rolled_back_entries == 0
        assert middle.rolled_back_committed_entries == 0
        assert stored_keys(middle) == {*kept, b"q\x00new"}
        await until(
            lambda: stored_keys(tail) == {*kept, b"q\x00new"}, "the tail holding every entry"
        )


@pytest.mark.asyncio
async def test_a_head_repairs_from_a_downstream_that_is_repairing_itself(tmp_path: Path) -> None:
    """docs/node-api.md, "Self-repair": a head whose store opened below its durable mark asks its
    downstreams, then the other nodes, until it holds the mark's seq. Here both stores of a chain
    a -> b were cut short (a truncation past each one's last durable-mark write): a lost its last
    two seqs, which b holds; b lost two past its own mark, which nobody holds. b refused every
    SUBSCRIBE while it repaired, the repair link of its head included (downstream.py), and
    re-fetched from its upstream a, which refused it while it repaired: neither ever served,
    although b held every seq a needs. Now b serves its head's repair link."""
    print("seed", SEED)
    async with node_chain(tmp_path, "ab") as (topology, nodes):
        for i in range(12):
            await nodes["a"].produce("q", [f"k{i}".encode()], [b"v"], None, None, acks=-1)
        head, middle = (nodes[n].replicas[0] for n in "ab")
        last = head.durable
        await until(lambda: middle.commit_point >= last, "b knowing every seq committed")
        paths = {n: nodes[n].replicas[0].store_path for n in "ab"}
        for node in nodes.values():
            await node.stop()
        store = ShardStore.open(paths["a"])
        try:
            store.rollback_to(last - 2)  # a lost seqs it acknowledged: b holds them
        finally:
            store.close()
        durablemark.write(paths["a"], last)
        durablemark.write(paths["b"], last + 2)  # b lost two seqs past its mark: nobody holds them
        for n in "ab":
            nodes[n] = chain_node(topology, n, tmp_path)
            await nodes[n].start()

        def led() -> bool:
            replica = nodes["a"].replicas.get(0)
            return replica is not None and not replica.repairing and replica.durable >= last

        await until(led, "a re-fetching seqs it lost from b and leading", 15.0)
        head = nodes["a"].replicas[0]
        assert head.store.get(b"q\x00k11") is not None, "a lacks the last acknowledged entry"
        # a's new writes reach b's mark: b repairs from its upstream as before.
        for i in range(2):
            await nodes["a"].produce("q", [f"new{i}".encode()], [b"v"], None, None, acks=-1)
        await until(lambda: not nodes["b"].replicas[0].repairing, "b repaired from a", 15.0)


@pytest.mark.asyncio
async def test_a_version_4_link_is_refused_clearly(tmp_path: Path) -> None:
    """A rolling upgrade's mixed chain: a node one version behind (its SUBSCRIBE names no commit
    point, so a head could not tell it lost committed entries) is refused with protocol_error
    naming the version links need, never served (docs/replication-protocol.md, "Version")."""
    async with node_chain(tmp_path, "ab") as (topology, _):
        answer = await first_answer(
            topology.nodes["a"], fr.Hello(4, "b", 0, topology.epoch, "tail")
        )
        assert isinstance(answer, fr.ErrorFrame)
        assert answer.code == ProtocolError.code
        assert "replication links need protocol version 5; b speaks 4" in answer.message
