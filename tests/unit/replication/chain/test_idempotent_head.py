"""A head writes each call of an idempotent producer once (docs/node-api.md, "Idempotent
producers"): a resend while the first copy's commit is under way waits for it, one after it
answers the same seqs, every replica holds the window, a new head after a failover finds a call
the old head forwarded and never answered, and a rollback takes the windows back with the seqs.
In-process nodes on loopback over real stores; every wait is a bounded poll."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.node.runtime import Node
from kayos.replication.logic.producers import meta_key, unpack_window
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import frames as fr
from kayos.signing import sign
from kayos.storage import Put, ShardStore
from kayos.topology import ShardChain, Topology
from tests.support.links import one_shard_topology, until
from tests.support.replicas import hold_commits, node_chain, standalone_replica

pytestmark = pytest.mark.unit

SEED = 20261122  # the nodes' randomness (tests.support.replicas.SEED)
P = bytes(range(16))
QUEUE = "q"


@pytest.fixture
def grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every head write goes through the group commit, whose store commits a test can hold."""
    monkeypatch.setattr(limits, "inline_commit_entries_max", 0)


async def _produce(node: Node, key: bytes, call: int, *, acks: int = -1) -> tuple[int, int]:
    return await node.produce(
        QUEUE, [key], [b"v"], None, None, acks=acks, producer_id=P, producer_seq=call
    )


def _versions(replica: ShardReplica) -> list[tuple[int, bytes]]:
    """Every version the replica's store holds, superseded ones too: ``(seq, key)``."""
    with replica.store.snapshot() as snap:
        return [
            (e.seq, e.key)
            for page in snap.pages(0, snap.boundary, include_expired=True)
            for e in page
        ]


def _written_before_called(replica: ShardReplica) -> asyncio.Event:
    """Set when the head answers a resend from its window (the resend reached it)."""
    reached = asyncio.Event()
    real = replica.written_before

    async def watched(first: int, last: int) -> Any:
        reached.set()
        return await real(first, last)

    replica.written_before = watched  # type: ignore[method-assign]
    return reached


@pytest.mark.asyncio
async def test_a_resend_after_the_commit_answers_the_first_seqs_and_writes_nothing(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (_topology, nodes):
        head = nodes["a"].replicas[0]
        first = await _produce(nodes["a"], b"k1", 1)
        last_seq = head.store.last_seq
        for acks in (-1, 1, 0):
            expected = (0, 0) if acks == 0 else first
            assert await _produce(nodes["a"], b"k1", 1, acks=acks) == expected
        assert head.store.last_seq == last_seq
        assert await _produce(nodes["a"], b"k2", 2) == (first[1] + 1, first[1] + 1)
        # Every replica holds the window, committed with the batches.
        for name in "abc":
            replica = nodes[name].replicas[0]
            await until(lambda r=replica: r.durable >= first[1] + 1, f"{name} at the 2nd call")
            window = unpack_window(replica.store.meta.get(meta_key(P)))
            assert window == [(1, *first), (2, first[1] + 1, first[1] + 1)], name
        assert [key for _seq, key in _versions(nodes["c"].replicas[0])] == [b"q\x00k1", b"q\x00k2"]


async def _resend_while_held(
    node: Node, acks: int
) -> tuple[ShardReplica, asyncio.Event, asyncio.Task[Any], asyncio.Task[Any]]:
    """Call 1 of P at ``node``, its store commit held, and its resend once it reached the head:
    the head, the event that releases the commit, the first copy's call and the resend's."""
    head = node.replicas[0]
    release = hold_commits(head)
    reached = _written_before_called(head)
    original = asyncio.create_task(_produce(node, b"k1", 1, acks=acks))
    await until(lambda: head.progress.accepted >= 1, "the first copy taking its seq")
    resend = asyncio.create_task(_produce(node, b"k1", 1, acks=acks))
    await asyncio.wait_for(reached.wait(), 30)
    return head, release, original, resend


@pytest.mark.asyncio
@pytest.mark.usefixtures("grouped")
@pytest.mark.parametrize("acks", [1, -1])
async def test_a_resend_while_the_first_commit_is_under_way_waits_for_it(
    tmp_path: Path, acks: int
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (_topology, nodes):
        head, release, original, resend = await _resend_while_held(nodes["a"], acks)
        assert head.progress.accepted == 1  # the resend took no seq
        assert not original.done()
        assert not resend.done()
        release.set()
        assert await asyncio.wait_for(original, 30) == (1, 1)
        assert await asyncio.wait_for(resend, 30) == (1, 1)
        assert _versions(head) == [(1, b"q\x00k1")]


@pytest.mark.asyncio
@pytest.mark.usefixtures("grouped")
async def test_a_resend_of_a_first_copy_whose_commit_failed_fails_alike(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path, "a") as (_topology, nodes):
        head, release, original, resend = await _resend_while_held(nodes["a"], -1)
        head.store.options.disk_reserve_bytes = 1 << 62  # the held commit fails for space
        release.set()
        results = await asyncio.wait_for(
            asyncio.gather(original, resend, return_exceptions=True), 30
        )
        assert [type(r).__name__ for r in results] == ["DiskFullError", "DiskFullError"]
        # The new history forgot the lost call: once the disk has room it is written afresh.
        head.store.options.disk_reserve_bytes = 0
        await until(lambda: not head.starting_new_history, "the new history")
        assert await _produce(nodes["a"], b"k1", 1) == (1, 1)
        assert _versions(head) == [(1, b"q\x00k1")]


@pytest.mark.asyncio
@pytest.mark.usefixtures("grouped")
async def test_a_new_head_finds_a_call_the_old_head_forwarded_and_never_answered(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (topology, nodes):
        await _produce(nodes["a"], b"k0", 1)
        old_head = nodes["a"].replicas[0]
        hold_commits(old_head)  # a's own commit never lands: the client hears nothing
        unanswered = asyncio.create_task(_produce(nodes["a"], b"k1", 2))
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.durable >= 2, "the batch forwarded down the chain")
        await nodes["a"].stop()
        assert not unanswered.done() or unanswered.exception() is not None
        unanswered.cancel()
        spliced = _signed(_chained(topology, 2, ("b", "c")))
        for name in ("b", "c"):
            assert await nodes[name].reconfigure.offer(spliced) == (2, True)
        new_head = nodes["b"].replicas[0]
        assert new_head.role == "head"
        # The client's resend of call 2 at the new head: found, nothing written again.
        assert await _produce(nodes["b"], b"k1", 2) == (2, 2)
        assert await _produce(nodes["b"], b"k0", 1) == (1, 1)
        assert new_head.store.last_seq == 2
        assert await _produce(nodes["b"], b"k2", 3) == (3, 3)
        await until(lambda: tail.commit_point >= 3, "the tail at the new call")
        assert [seq for seq, _key in _versions(tail)] == [1, 2, 3]


@pytest.mark.asyncio
async def test_a_rollback_takes_the_windows_back_with_the_seqs(tmp_path: Path) -> None:
    """A member holds calls 1 and 2 of P, then rolls back to call 1's seq (they were never
    committed): as head afterwards it answers a resend of call 1 and writes call 2 afresh."""
    print("seed", SEED)
    path = tmp_path / "h"
    store = ShardStore.open(str(path))
    try:
        for call in (1, 2):
            window = [(c, c, c) for c in range(1, call + 1)]
            meta = {meta_key(P): b"".join(_entry(*entry) for entry in window)}
            store.commit([Put(f"q\x00k{call}".encode(), b"v")], meta=meta)
    finally:
        store.close()
    member = standalone_replica(one_shard_topology(["x", "h"]), path)  # h is the tail
    try:
        await member.rollback(1)
        assert unpack_window(member.store.meta.get(meta_key(P))) == [(1, 1, 1)]
    finally:
        member.close()
    head = standalone_replica(one_shard_topology(["h"]), path)
    try:
        assert await head.commit_ops(((b"q\x00k1",), (b"v",), None, None), (P, 1)) == (1, 1, 0)
        result = await head.commit_ops(((b"q\x00k2",), (b"v",), None, None), (P, 2))
        assert (result.first_seq, result.last_seq) == (2, 2)
        assert unpack_window(head.store.meta.get(meta_key(P))) == [(1, 1, 1), (2, 2, 2)]
    finally:
        head.close()


@pytest.mark.asyncio
async def test_bad_producers_are_refused_and_write_nothing(tmp_path: Path) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path, "a") as (_topology, nodes):
        node = nodes["a"]
        head = node.replicas[0]
        with pytest.raises(InvalidRequest, match="producer_id must be 16 bytes, got 15"):
            await node.produce(
                QUEUE, [b"k"], [b"v"], None, None, acks=1, producer_id=P[:15], producer_seq=1
            )
        for call in range(2, 2 + limits.producer_window_entries):
            await _produce(node, b"k", call, acks=1)
        last_seq = head.store.last_seq
        with pytest.raises(InvalidRequest, match="producer_seq_too_old"):
            await _produce(node, b"k", 1, acks=1)
        assert head.store.last_seq == last_seq


@pytest.mark.asyncio
async def test_a_version_6_client_is_answered_at_version_6_and_not_de_duplicated(
    tmp_path: Path,
) -> None:
    """docs/replication-protocol.md, "Handshake": the node's HELLO_OK names the lower version and
    decodes the client's 8-field PRODUCE at it."""
    print("seed", SEED)
    async with node_chain(tmp_path, "a") as (topology, nodes):
        address = topology.nodes["a"]
        reader, writer = await asyncio.open_connection(address.host, address.bin_port)
        decoder = fr.FrameDecoder(protocol_version=6)
        try:
            writer.write(fr.encode(fr.Hello(6, "old-client", None, 0, "client"), 6))
            # Nothing else until HELLO_OK (docs/replication-protocol.md, "Handshake").
            hello_ok = decoder.feed(await asyncio.wait_for(reader.read(65536), 30))
            assert hello_ok[0] == fr.HelloOk(6, "a", nodes["a"].epoch)
            produce = fr.Produce(7, QUEUE, (b"k",), (b"v",), None, None, fr.ACKS_HEAD, False)
            writer.write(
                fr.encode(produce, 6) + fr.encode(dataclasses.replace(produce, request_id=8), 6)
            )
            frames: list[fr.Frame] = hello_ok[1:]
            while len([f for f in frames if isinstance(f, fr.Produced | fr.ErrorFrame)]) < 2:
                data = await asyncio.wait_for(reader.read(65536), 30)
                assert data, "the node closed the connection"
                frames += decoder.feed(data)
        finally:
            writer.close()
        replies = [f for f in frames if isinstance(f, fr.Produced | fr.ErrorFrame)]
        assert replies == [fr.Produced(7, 1, 1), fr.Produced(8, 2, 2)]  # both written


def _entry(call: int, first: int, last: int) -> bytes:
    return call.to_bytes(8, "big") + first.to_bytes(8, "big") + last.to_bytes(8, "big")


def _chained(topology: Topology, epoch: int, chain: tuple[str, ...]) -> Topology:
    return Topology(epoch, topology.nodes, {0: ShardChain(0, chain)}, topology.identity)


def _signed(topology: Topology) -> dict[str, Any]:
    assert topology.identity is not None
    body = topology.to_json()
    return {"body": body, "mac": sign(topology.identity, "topology", body)}
