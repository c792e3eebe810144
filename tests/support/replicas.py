"""Replication in-process, for the unit tier: events fed to the pure chain logic (``run``); chains
of ``Node``s on loopback (free ports) over real stores, a lone ``ShardReplica``, the manager's
lease granted by hand, and what a store holds; a group's mark held at a tail while the middle's
commits are held (a slow disk); and a head cut short below its durable mark whose peers' full
takeover tables name none of its masters (campaign seed 11112411, docs/campaigns.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kayos import limits
from kayos.clock import SystemClock
from kayos.node.marks import read_mark
from kayos.node.runtime import HWM_META, Node
from kayos.replication.logic import chain, durablemark
from kayos.replication.logic.chain import Progress, step
from kayos.replication.shard.local_meta import TAKEOVER_META_KEY, pack_takeover
from kayos.replication.shard.replica import ShardReplica
from kayos.storage import ShardStore
from kayos.storage.maintenance.check import data_file_of
from kayos.topology import ShardChain, Topology
from tests.support.links import one_shard_topology, until


def run(progress: Progress, *events: chain.Event) -> tuple[Progress, list[chain.Action]]:
    """Steps ``progress`` through ``events``; the state after and every action, in order."""
    actions: list[chain.Action] = []
    for event in events:
        progress, more = step(progress, event)
        actions.extend(more)
    return progress, actions


# --- chains of in-process nodes -------------------------------------------------------------

SEED = 20261122  # the nodes' randomness; tests print it
WAIT_S = 30.0
# The randomness of ``standalone_replica``, node h's replica outside any node.
STANDALONE_SEED = 20261124


def chain_node(topology: Topology, node_id: str, base: Path, *, managed: bool = False) -> Node:
    """Node ``node_id`` of ``topology`` with its data under ``base`` (not started)."""
    return Node(topology, node_id, str(base / node_id), rng=random.Random(SEED), managed=managed)


@contextlib.asynccontextmanager
async def node_chain(
    base: Path, ids: str = "abc", *, managed: bool = False
) -> AsyncIterator[tuple[Topology, dict[str, Node]]]:
    """Nodes a -> b -> c of one shard (or ``ids``; ``managed``: their heads need a lease from the
    manager); ``nodes`` may be changed (a node restarted) inside."""
    topology = one_shard_topology(list(ids))
    nodes = {n: chain_node(topology, n, base, managed=managed) for n in ids}
    for node in nodes.values():
        await node.start()
        if managed:
            grant(node)  # the manager's first round: a node that starts holds writes till then
    try:
        yield topology, nodes
    finally:
        for node in nodes.values():
            await node.stop()


def stored_keys(replica: ShardReplica) -> set[bytes]:
    """Every live key the replica's store holds, expired ones included."""
    with replica.store.snapshot() as snap:
        return {
            e.key
            for page in snap.pages(0, snap.boundary, include_expired=True, as_of=snap.boundary)
            for e in page
            if not e.deleted
        }


def standalone_replica(topology: Topology, store_path: Path) -> ShardReplica:
    """Node h's replica of shard 0 over the store at ``store_path``, with no ``Node`` around it."""
    return ShardReplica(
        node_id="h",
        topology=topology,
        shard=topology.shards[0],
        store_path=str(store_path),
        clock=SystemClock(),
        rng=random.Random(STANDALONE_SEED),
    )


QUEUE = "q"  # the queue of ``snapshot``


def managed_chain(base: Path, ids: str) -> Any:
    """``node_chain`` of managed nodes: each head needs the manager's lease (``grant``)."""
    return node_chain(base, ids, managed=True)


def grant(node: Node) -> None:
    """The leader's committed answer to a poll, as ``POST /v1/admin/lease`` applies it."""
    assert node.lease.granted(node.lease.ask(), node.epoch, True)


@contextlib.asynccontextmanager
async def granting(node: Node) -> AsyncIterator[None]:
    """The head's lease granted now and again every manager round while the block runs, as the
    leader does: a snapshot that waits for a commit point may outlast one lease."""

    async def grant_every_round() -> None:
        while True:
            grant(node)
            await asyncio.sleep(limits.manager_poll_interval_ms / 1000)

    task = asyncio.create_task(grant_every_round())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def snapshot(node: Node) -> list[int]:
    """The seqs of a new snapshot of ``QUEUE`` for group g at ``node``."""
    page = await node.consume(QUEUE, "g", after=None, upto=None, limit=10, wait_ms=0)
    return [int(seq) for seq in page.seqs]


# --- a group's mark held at the tail while the middle's commits are held --------------------

GROUP = "g"
KEY = f"{HWM_META}{QUEUE}/{GROUP}"


def wait_before_commits(replica: ShardReplica, wait: Callable[[], Awaitable[Any]]) -> None:
    """Every store commit of ``replica`` that starts from now on first awaits ``wait()``."""
    real = replica.timed_commit

    async def held(*args: Any, **kwargs: Any) -> Any:
        await wait()
        return await real(*args, **kwargs)

    replica.timed_commit = held  # type: ignore[method-assign]


def hold_commits(replica: ShardReplica) -> asyncio.Event:
    """Holds every store commit of ``replica`` that starts from now on until the returned event
    is set (what it took in is forwarded meanwhile, as a member with a slow disk does)."""
    release = asyncio.Event()
    wait_before_commits(replica, release.wait)
    return release


async def marked(nodes: dict[str, Node]) -> ShardReplica:
    """Two acks=all writes at a and the group's mark 1 committed; returns c's replica once it
    serves a snapshot from that mark."""
    grant(nodes["a"])
    await nodes["a"].produce(QUEUE, [b"k0", b"k1"], [b"v0", b"v1"], None, None, acks=-1)
    await nodes["a"].commit_group(QUEUE, GROUP, 1, None)
    tail = nodes["c"].replicas[0]
    await until(lambda: read_mark(tail, KEY)[0] == 1, "c holds the mark 1")
    page = await nodes["c"].consume(QUEUE, GROUP, after=None, upto=None, limit=10, wait_ms=0)
    assert page.hwm == 1
    return tail


async def cut_middle(nodes: dict[str, Node], *, for_good: bool) -> None:
    """Ends the middle's link to the head (``for_good``: and stops it subscribing again)."""
    middle = nodes["b"].replicas[0]
    if for_good:
        next(link for link in nodes["b"].links if link.replica is middle).stop()
    stream = middle.upstream_stream
    assert stream is not None
    stream.close()


@dataclass
class Held:
    """The mark 2 committed at the head, forwarded by the middle, durable on the tail; the
    middle's store commits held until ``release`` is set; ``commit`` the group commit's call."""

    tail: ShardReplica
    middle: ShardReplica
    release: asyncio.Event
    commit: asyncio.Task[int]


@contextlib.asynccontextmanager
async def mark_2_held(nodes: dict[str, Node]) -> AsyncIterator[Held]:
    """The mark 1 committed (``marked``), then the mark 2 at the head, forwarded, durable on the
    tail while the middle's commits are held (released on exit)."""
    tail = await marked(nodes)
    middle = nodes["b"].replicas[0]
    release = hold_commits(middle)
    commit = asyncio.create_task(nodes["a"].commit_group(QUEUE, GROUP, 2, None))
    try:
        await until(lambda: read_mark(tail, KEY)[0] == 2, "c holds the mark 2")
        yield Held(tail, middle, release, commit)
    finally:
        release.set()
        if not commit.done():
            commit.cancel()
        await asyncio.gather(commit, return_exceptions=True)


# --- a head cut short behind peers whose takeover tables are full ------------------------------

REPAIR_SEED = 20261125
BEFORE = 10  # committed entries the cut head keeps
CUT_AWAY = limits.takeover_table_entries_max + 16  # committed entries cut from the head's file


def repair_node(topology: Topology, node_id: str, base: Path) -> Node:
    """Node ``node_id`` of ``topology`` with its data under ``base`` (not started)."""
    return Node(topology, node_id, str(base / node_id), rng=random.Random(REPAIR_SEED))


def full_table_of_other_masters(first_seq: int) -> list[tuple[bytes, int]]:
    """A full table whose masters all began after ``first_seq - 1``: what a peer holds after
    more changes of head than the table keeps, since the cut head's last master."""
    cap = limits.takeover_table_entries_max
    return [(bytes([7, i]) + bytes(14), first_seq + i) for i in range(cap)]


def _size(path: str) -> int:
    return os.path.getsize(path)


def _set_table(path: str, table: list[tuple[bytes, int]]) -> None:
    store = ShardStore.open(path)
    try:
        store.commit([], meta={TAKEOVER_META_KEY: pack_takeover(table)})
    finally:
        store.close()


async def cut_head_behind_capped_peers(topology: Topology, base: Path) -> tuple[int, set[bytes]]:
    """Nodes a -> b -> c (``topology``'s nodes) take ``BEFORE`` entries, then ``CUT_AWAY`` more,
    and stop; a's file is cut back to the first part, its mark still naming all of it, and b's
    and c's tables go through more changes of head than a table keeps since. Returns the last
    seq and the keys the tail held."""
    chain3 = Topology(
        topology.epoch, topology.nodes, {0: ShardChain(0, ("a", "b", "c"), ())}, topology.identity
    )
    nodes = {n: repair_node(chain3, n, base) for n in "abc"}
    for node in nodes.values():
        await node.start()
    try:
        queue = "q"
        for i in range(BEFORE):
            await nodes["a"].produce(queue, [f"k{i}".encode()], [b"v"], None, None, acks=-1)
        head = nodes["a"].replicas[0]
        head_path = head.store_path
        size_before = _size(data_file_of(head_path))
        for i in range(BEFORE, BEFORE + CUT_AWAY):
            await nodes["a"].produce(queue, [f"k{i}".encode()], [b"v"], None, None, acks=-1)
        total = head.store.last_seq
        tail = nodes["c"].replicas[0]
        await until(lambda: tail.commit_point >= total, "the tail knowing every seq committed")
        kept = stored_keys(tail)
        peer_paths = {n: nodes[n].replicas[0].store_path for n in "bc"}
    finally:
        for node in nodes.values():
            await node.stop()

    os.truncate(data_file_of(head_path), size_before)
    durablemark.write(head_path, total)
    for path in peer_paths.values():
        _set_table(path, full_table_of_other_masters(BEFORE + 1))
    return total, kept


async def started(topology: Topology, base: Path) -> dict[str, Node]:
    """Nodes a, b and c at ``topology``, started."""
    nodes = {n: repair_node(topology, n, base) for n in "abc"}
    for node in nodes.values():
        await node.start()
    return nodes


def repaired(nodes: dict[str, Node], total: int) -> Callable[[], bool]:
    """Whether a's replica leads again, holding ``total``."""

    def check() -> bool:
        replica = nodes["a"].replicas.get(0)
        return replica is not None and not replica.repairing and replica.durable >= total

    return check
