"""Learners and self-repair on a node (docs/node-api.md, "Learners" and "Self-repair").

A learner is a shard replica outside the shard's chain that copies it from one member (HELLO role
``learner``) before the cluster manager makes the node a member: ``POST /v1/admin/catch-up`` starts
one. A head whose store lost a suffix (salvaged, or bytes cut after its last valid header)
re-fetches it from its downstream over a ``repair`` link before it serves (``repair_then_lead``).
``Node`` keeps the state; this module holds the logic so that the node's module stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import shutil
from dataclasses import dataclass
from typing import Any, Protocol

from kayos.checks import check_u64
from kayos.clock import Clock
from kayos.errors import InvalidRequest, KayosError, StaleEpochError
from kayos.replication.link.snapshot_link import SnapshotProgress, fetch_snapshot
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.shard.snapshot import store_is_empty
from kayos.signing import open_signed
from kayos.topology import Topology

log = logging.getLogger("kayos.node")

CATCH_UP_FIELDS = frozenset({"epoch", "shard", "upstream"})


@dataclass(slots=True)
class Learner:
    """A learner's replica and link exist once its store is open: while it copies the store file
    by snapshot (docs/replication-protocol.md, "Store snapshots") only ``snapshot`` does."""

    upstream: str
    task: asyncio.Task[None] | None = None
    replica: ShardReplica | None = None
    link: UpstreamLink | None = None
    snapshot: SnapshotProgress | None = None


class Reconfiguring(Protocol):
    """What of ``kayos.node.replicas.reconfigure.Reconfigurer`` this module uses."""

    lock: asyncio.Lock


class Node(Protocol):
    """What of ``kayos.node.runtime.Node`` this module uses (no import back into it)."""

    node_id: str
    topology: Topology
    data_dir: str
    clock: Clock
    rng: random.Random
    replicas: dict[int, ShardReplica]
    learners: dict[int, Learner]
    copy_rate_mb_per_s_max: float

    @property
    def epoch(self) -> int: ...

    @property
    def reconfigure(self) -> Reconfiguring: ...


@dataclass(frozen=True, slots=True)
class CatchUpOrder:
    epoch: int
    shard: int
    upstream: str


def parse_catch_up(identity: Any, message: Any) -> CatchUpOrder:
    """A signed catch-up message (``{"body": {...}, "mac"}``), checked: its MAC (401 otherwise),
    then its fields (400)."""
    body = open_signed(identity, "catch-up", message, CATCH_UP_FIELDS)
    upstream = body["upstream"]
    if not isinstance(upstream, str):
        raise InvalidRequest("upstream must be a node id")
    return CatchUpOrder(
        check_u64(body["epoch"], "epoch"),
        check_u64(body["shard"], "shard", high=2**32 - 1),
        upstream,
    )


FOLLOWERS_FIELDS = frozenset({"epoch", "shard", "followers"})


@dataclass(frozen=True, slots=True)
class FollowersOrder:
    epoch: int
    shard: int
    followers: frozenset[str]


def parse_followers(identity: Any, message: Any) -> FollowersOrder:
    """A signed followers message (the manager's catch-up list of a shard), checked: its MAC
    (401 otherwise), then its fields (400)."""
    body = open_signed(identity, "followers", message, FOLLOWERS_FIELDS)
    names = body["followers"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidRequest("followers must be a list of node ids")
    return FollowersOrder(
        check_u64(body["epoch"], "epoch"),
        check_u64(body["shard"], "shard", high=2**32 - 1),
        frozenset(names),
    )


async def keep_followers(node: Node, order: FollowersOrder) -> dict[str, Any]:
    """Ends the count of every catch-up follower of the shard not in the manager's list
    (docs/replication-protocol.md, "Counting a catch-up follower")."""
    replica = node.replicas.get(order.shard)
    if replica is None:
        raise InvalidRequest(f"{node.node_id} holds no member replica of shard {order.shard}")
    kept = await replica.keep_followers(order.epoch, set(order.followers))
    return {"shard": order.shard, "counted_followers": list(kept)}


async def start_catch_up(node: Node, order: CatchUpOrder) -> dict[str, Any]:
    """Opens (or keeps) the node's store of the shard as a learner of ``order.upstream``. One
    order or topology change at a time (the reconfigure lock): the manager re-sends an order
    whose answer timed out, and a topology may be closing the shard's replica, and a second
    store open on one directory in one process had its salvage check delete the first one's
    derived index (campaign seed 12)."""
    async with node.reconfigure.lock:
        return await _start_catch_up(node, order)


async def _start_catch_up(node: Node, order: CatchUpOrder) -> dict[str, Any]:
    if order.epoch < node.epoch:
        raise StaleEpochError(
            f"catch-up decided at epoch {order.epoch}; this node is at {node.epoch}"
        )
    shard = node.topology.shards.get(order.shard)
    if shard is None:
        raise InvalidRequest(f"the topology has no shard {order.shard}")
    if order.upstream not in shard.members:
        raise InvalidRequest(f"{order.upstream} is not a member of shard {order.shard}")
    if node.node_id in shard.members or order.shard in node.replicas:
        raise InvalidRequest(f"{node.node_id} is a member of shard {order.shard}: no learner")
    current = node.learners.get(order.shard)
    if current is not None:
        if current.upstream == order.upstream:
            return {"shard": order.shard, "state": "learning"}
        await close_learner(node, order.shard)
    path = os.path.join(node.data_dir, "shards", str(order.shard))
    os.makedirs(path, exist_ok=True)
    learner = Learner(order.upstream)
    if await asyncio.to_thread(store_is_empty, path):
        # Holds nothing: copy the upstream's store file, then follow it from its last seq.
        learner.snapshot = SnapshotProgress(order.upstream)
        learner.task = asyncio.create_task(_snapshot_then_learn(node, learner, order, path))
        node.learners[order.shard] = learner
        log.info("shard %s: copying the store of %s by snapshot", order.shard, order.upstream)
        return {"shard": order.shard, "state": "learning"}
    await open_learner(node, learner, order, path, copied=False)
    node.learners[order.shard] = learner
    return {"shard": order.shard, "state": "learning"}


async def open_learner(
    node: Node, learner: Learner, order: CatchUpOrder, path: str, *, copied: bool
) -> None:
    """Opens the learner's replica of ``order.shard`` at ``path`` (``copied``: its store was just
    copied by snapshot) and makes its link to ``order.upstream``, run as the learner's task
    unless it has one already (a snapshot's, which goes on to run the link itself)."""
    shard = node.topology.shards[order.shard]
    replica = await asyncio.to_thread(
        functools.partial(
            ShardReplica,
            node_id=node.node_id,
            topology=node.topology,
            shard=shard,
            store_path=path,
            clock=node.clock,
            rng=node.rng,
            learner_upstream=order.upstream,
            copied=copied,
        )
    )
    current = node.topology
    if current.epoch != replica.epoch and order.shard in current.shards:
        # A topology came while the store opened: follow_topology saw no replica to give it to,
        # and a learner left at the old epoch has its every link refused (bench grow found it).
        replica.topology = current
        replica.shard = current.shards[order.shard]
    replica.copy_rate_mb_per_s_max = node.copy_rate_mb_per_s_max
    learner.replica = replica
    learner.link = UpstreamLink(replica)
    if learner.task is None:
        learner.task = asyncio.create_task(_learn(node, learner, order, path))
    log.info("shard %s: learning from %s from seq %s", order.shard, order.upstream, replica.durable)


async def _snapshot_then_learn(
    node: Node, learner: Learner, order: CatchUpOrder, path: str
) -> None:
    await _copy_then_open(node, learner, order, path)
    await _learn(node, learner, order, path)


async def _learn(node: Node, learner: Learner, order: CatchUpOrder, path: str) -> None:
    """Runs the learner's link; a link that stops because the store shares no history with the
    upstream (its reset would replay the log from seq 1) has the store wiped and the upstream's
    store file copied instead, then the link runs again."""
    while True:
        assert learner.link is not None
        await learner.link.run()
        if not learner.link.reset_by_copy:
            return
        replica = learner.replica
        log.warning(
            "shard %s: the learner's store shares no history with %s: wiping it and copying "
            "the store file",
            order.shard,
            order.upstream,
        )
        learner.link = None
        learner.replica = None
        if replica is not None:
            await replica.settle()
            replica.close()
        await asyncio.to_thread(_wipe, path)
        learner.snapshot = SnapshotProgress(order.upstream)
        await _copy_then_open(node, learner, order, path)


def _wipe(path: str) -> None:
    """Empties a learner's shard directory: its store and the files beside it (its durable mark,
    derived index, time index), each rebuilt from the copy."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, exist_ok=True)


async def _copy_then_open(node: Node, learner: Learner, order: CatchUpOrder, path: str) -> None:
    """Copies the upstream's store file into the empty ``path`` by snapshot (entry by entry if
    that fails every attempt), then opens the learner's replica and link on it."""
    assert learner.snapshot is not None
    copied = await fetch_snapshot(
        node_id=node.node_id,
        topology=node.topology,
        shard_id=order.shard,
        peer=order.upstream,
        directory=path,
        clock=node.clock,
        rng=node.rng,
        progress=learner.snapshot,
    )
    if not copied:
        log.warning(
            "shard %s: no snapshot from %s after %d attempts (%s): copying entry by entry",
            order.shard,
            order.upstream,
            learner.snapshot.attempts,
            learner.snapshot.problem,
        )
    await open_learner(node, learner, order, path, copied=copied)


async def close_learner(node: Node, shard_id: int) -> None:
    """Stops a learner and closes its store (kept on disk: a member's replica opens it next)."""
    learner = node.learners.pop(shard_id, None)
    if learner is None:
        return
    if learner.link is not None:
        learner.link.stop()
    if learner.task is not None:
        learner.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await learner.task
    if learner.replica is None:
        return  # stopped mid snapshot: its file is deleted (here or by the next open)
    await learner.replica.settle()
    with contextlib.suppress(KayosError):
        await learner.replica.persist_commit_point()
    await learner.replica.persist_time_index(force=True)
    learner.replica.close()


def learner_status(learner: Learner) -> dict[str, Any]:
    replica = learner.replica
    snapshot = _snapshot_status(learner.snapshot)
    if replica is None:
        return {
            "role": "learner",
            "upstream": learner.upstream,
            "durable_seq": 0,
            "last_seq": 0,
            "catching_up": True,
            "upstream_linked": False,
            "snapshot": snapshot,
        }
    health = replica.link_health.get(replica.upstream or "")
    upstream_seq = health.peer_seq if health is not None else 0
    return {
        "role": "learner",
        "upstream": replica.upstream,
        "durable_seq": replica.durable,
        "upstream_durable_seq": max(upstream_seq, replica.durable),
        "last_seq": replica.durable,
        "committed_seq": replica.commit_point,
        "catching_up": replica.catching_up or upstream_seq > replica.durable,
        "upstream_linked": replica.upstream_stream is not None,
        "rolled_back_entries": replica.rolled_back_entries,
        "rolled_back_committed_entries": replica.rolled_back_committed_entries,
        "refetched_entries": replica.refetched_entries,
        "refetched_bytes": replica.refetched_bytes,
        "copy_mode": "file" if learner.snapshot is not None else "log",
        "repair": replica.repair_status(),
        "snapshot": snapshot,
        "copies": [report.to_json() for report in replica.copies.values()],
    }


def _snapshot_status(progress: SnapshotProgress | None) -> dict[str, Any] | None:
    if progress is None:
        return None
    return {
        "copy_mode": progress.copy_mode,
        "attempts": progress.attempts,
        "received_bytes": progress.received_bytes,
        "verified_bytes": progress.verified_bytes,
        "start_offset": progress.start_offset,
        "total_bytes": progress.total_bytes,
        "last_seq": progress.last_seq,
        "seconds": round(progress.seconds, 3),
        "mb_per_s": round(progress.mb_per_s, 1),
        "done": progress.done,
        "problem": progress.problem,
    }


async def repair_then_lead(replica: ShardReplica, link: UpstreamLink | None) -> None:
    """A head whose store lost a suffix never starts with a short log (its downstreams would be
    told to roll back acknowledged entries): it re-fetches from its first downstream over
    ``link`` (a ``repair`` link that ends once caught up), then adds its takeover entry and
    serves. Without a link (a store that verified, or no downstream) it starts at once."""
    if link is not None:
        log.warning(
            "shard %s: head's store lost a suffix (%s): re-fetching from %s before serving",
            replica.shard_id,
            replica.repair_problem,
            link.peer,
        )
        await link.run()
    await replica.become_head()
    if replica.repairing:
        replica.repairing = False
        log.warning(
            "shard %s: head repaired at seq %s (re-fetched %s entries); serving",
            replica.shard_id,
            replica.durable,
            replica.refetched_entries,
        )


async def follow_topology(node: Node, topology: Topology) -> None:
    """A new topology: a learner of a shard the node now is a member of (or that is gone) is
    closed, its store kept for the member's replica; the others follow the new epoch (their
    link handshakes at it when it next connects)."""
    for shard_id, learner in list(node.learners.items()):
        shard = topology.shards.get(shard_id)
        if shard is None or node.node_id in shard.members:
            await close_learner(node, shard_id)
            continue
        if learner.replica is not None:
            learner.replica.topology = topology
            learner.replica.shard = shard
