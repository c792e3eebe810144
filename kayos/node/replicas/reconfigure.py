"""Topology changes at a node (docs/node-api.md, "Topology changes").

The cluster manager publishes a new topology, signed, with a higher epoch, when it splices a dead
or slow node out of a chain or puts one back. A node checks the signature, writes the message to
``DATA/topology.json`` (so a restart comes up at that epoch) and only then applies it: every shard
where this node's chain position (role, upstream, downstreams) changed has its replica re-made
(links closed, store settled and closed, reopened as a node restart opens it), shards it joined
are opened, shards it left are closed (their store stays on disk), and the other replicas keep
running untouched.

``plan_changes`` is the pure decision; ``Reconfigurer`` is the driver that carries it out, one
topology at a time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiohttp
from prometheus_client import Histogram

from kayos import limits, tlsconfig
from kayos.clock import Clock
from kayos.errors import InvalidRequest, KayosError, Unauthenticated, UnavailableError
from kayos.identity import ClusterIdentity
from kayos.node.replicas import learners
from kayos.node.replicas import repair as peer_repair
from kayos.node.replicas.changing import ShardsChanging
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.logic.lease import (
    NodeLease,
    WriteHold,
    adopt_holds,
    boot_holds,
    lease_won,
    release,
)
from kayos.replication.shard.replica import ShardReplica
from kayos.signing import check_signed
from kayos.topology import Role, ShardChain, Topology


class LostReporter(Protocol):
    """Where a link's failure goes (``kayos.node.reports.SuspectReports``)."""

    def peer_lost(self, peer: str, error: BaseException | None = None) -> None: ...


class Node(Protocol):
    """What the driver needs of ``kayos.node.runtime.Node`` (which imports this module)."""

    node_id: str
    data_dir: str
    topology: Topology
    replicas: dict[int, ShardReplica]
    clock: Clock
    rng: random.Random
    commit_seconds: Histogram
    copy_rate_mb_per_s_max: float
    ready: bool
    links: list[UpstreamLink]
    learners: dict[int, learners.Learner]
    lease: NodeLease

    @property
    def reports(self) -> LostReporter: ...

    @property
    def epoch(self) -> int: ...

    @property
    def reconfigure(self) -> Reconfigurer: ...

    def spawn(self, coro: Any) -> asyncio.Task[Any]: ...


log = logging.getLogger("kayos.node")

TOPOLOGY_FILE = "topology.json"

Change = Literal["keep", "remake", "open", "close"]


@dataclass(frozen=True, slots=True)
class Position:
    """A node's place in one shard's chain."""

    role: Role
    upstream: str | None
    downstreams: tuple[str, ...]


def position_of(shard: ShardChain | None, node: str) -> Position | None:
    if shard is None:
        return None
    role = shard.role_of(node)
    if role is None:
        return None
    return Position(role, shard.upstream_of(node), shard.downstreams_of(node))


def plan_changes(node: str, old: Topology, new: Topology) -> dict[int, Change]:
    """What happens to each shard ``node`` is or becomes a member of when ``new`` replaces
    ``old``: ``keep`` (same position: the replica runs on, untouched), ``remake`` (another role,
    upstream or set of downstreams), ``open`` (joined), ``close`` (left). Shards the node is in
    neither time are absent."""
    plan: dict[int, Change] = {}
    for shard_id in sorted(set(old.shards) | set(new.shards)):
        before = position_of(old.shards.get(shard_id), node)
        after = position_of(new.shards.get(shard_id), node)
        if before is None and after is None:
            continue
        if before is None:
            plan[shard_id] = "open"
        elif after is None:
            plan[shard_id] = "close"
        else:
            plan[shard_id] = "keep" if before == after else "remake"
    return plan


_CHANGE_KINDS: dict[Change, str] = {
    "remake": "shard_remade",
    "open": "shard_opened",
    "close": "shard_closed",
}


def change_kinds(node: str, old: Topology, new: Topology, plan: dict[int, Change]) -> list[str]:
    """What adopting ``new`` over ``old`` does at ``node``, one kind per event: ``topology``
    (once), ``shard_remade``, ``shard_opened`` or ``shard_closed`` per shard of ``plan`` that
    is not kept, and ``became_head`` per shard ``node`` heads in ``new`` and did not in ``old``
    (a failover or a move that made it head)."""
    kinds = ["topology"]
    kinds += [_CHANGE_KINDS[change] for change in plan.values() if change != "keep"]
    for shard_id, shard in new.shards.items():
        before = old.shards.get(shard_id)
        if shard.head == node and (before is None or before.head != node):
            kinds.append("became_head")
    return kinds


# --- signed topology messages --------------------------------------------------------------------


def check_message(
    message: Any, identity: ClusterIdentity | None, node_id: str, own: Topology
) -> Topology:
    """The topology a signed message ``{"body": to_json(), "mac": hex}`` carries, with this
    node's identity. ``Unauthenticated`` unless its MAC verifies; ``InvalidRequest`` if it is
    malformed, does not name this node, or moves this node's own address (its ports are bound)."""
    if not isinstance(message, dict) or not isinstance(message.get("body"), dict):
        raise InvalidRequest('a signed topology is {"body": {...}, "mac": "<hex>"}')
    body = message["body"]
    check_signed(identity, "topology", body, message.get("mac"))
    topology = Topology.from_json(body).with_identity(identity)
    address = topology.nodes.get(node_id)
    if address is None:
        raise InvalidRequest(f"the topology of epoch {topology.epoch} does not name {node_id}")
    if address != own.nodes[node_id]:
        raise InvalidRequest(
            f"the topology of epoch {topology.epoch} moves {node_id} to {address}; a node's "
            "address changes only with a restart"
        )
    return topology


def save_message(data_dir: str, message: dict[str, Any]) -> None:
    """Writes the signed message to ``DATA/topology.json`` atomically: a temporary file, fsynced,
    renamed over the old one, and the directory fsynced (a crash leaves the old or the new)."""
    path = os.path.join(data_dir, TOPOLOGY_FILE)
    temporary = path + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(json.dumps(message, sort_keys=True).encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_message(data_dir: str) -> Any:
    """The message in ``DATA/topology.json`` as parsed JSON; None when there is none (or it is
    unreadable: logged, and the node starts from the other sources)."""
    path = os.path.join(data_dir, TOPOLOGY_FILE)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limits.topology_bytes_max + 1)
    except FileNotFoundError:
        return None
    if len(raw) > limits.topology_bytes_max:
        log.error("%s is over topology_bytes_max: ignored", path)
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        log.error("%s is not JSON (%s): ignored", path, exc)
        return None


async def peer_messages(topology: Topology, node_id: str) -> list[Any]:
    """Every peer's ``GET /v1/topology`` that carries a ``mac``, as signed messages, asked all at
    once within ``limits.topology_peer_query_ms_max`` (a peer that does not answer by then is
    left out)."""
    peers = [node for name, node in topology.nodes.items() if name != node_id]
    if not peers:
        return []
    timeout = aiohttp.ClientTimeout(total=limits.topology_peer_query_ms_max / 1000)

    async def ask(session: aiohttp.ClientSession, url: str) -> Any:
        async with session.get(url + "/v1/topology") as response:
            if response.status != 200:
                return None
            raw = await response.content.read(limits.topology_bytes_max + 1)
            if len(raw) > limits.topology_bytes_max:
                return None
            data = json.loads(raw)
            if not isinstance(data, dict) or "mac" not in data:
                return None
            mac = data.pop("mac")
            return {"body": data, "mac": mac}

    found: list[Any] = []
    connector = aiohttp.TCPConnector(ssl=tlsconfig.http_ssl())
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        answers = await asyncio.gather(
            *(ask(session, node.http_url) for node in peers), return_exceptions=True
        )
    for answer in answers:
        if answer is not None and not isinstance(answer, BaseException):
            found.append(answer)
    return found


def newest(
    candidates: list[Any], identity: ClusterIdentity | None, node_id: str, own: Topology
) -> tuple[Topology, dict[str, Any]] | None:
    """The highest-epoch candidate message that verifies, with its topology; the ones that do
    not verify are logged and skipped."""
    best: tuple[Topology, dict[str, Any]] | None = None
    for message in candidates:
        try:
            topology = check_message(message, identity, node_id, own)
        except (InvalidRequest, Unauthenticated) as exc:
            log.warning("a signed topology was ignored: %s", exc)
            continue
        if best is None or topology.epoch > best[0].epoch:
            best = (topology, message)
    return best


# --- the driver ----------------------------------------------------------------------------------


class TopologyWatch:
    """Requests waiting for the node to adopt a topology newer than an epoch (``GET
    /v1/topology?after=E&wait_ms=W``, docs/node-api.md "Topology changes"): at most
    ``waiters_max`` at once, all woken by each adoption and by the node's stop."""

    def __init__(self, waiters_max: int = limits.topology_watchers_max) -> None:
        self.waiters_max = waiters_max
        self.waiting = 0
        self.closed = False
        self._changed = asyncio.Event()  # set, and replaced, at each adoption

    def adopted(self) -> None:
        """The node runs a new topology: every waiter looks again."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """The node is stopping: every waiter answers now, and later ones do not wait."""
        self.closed = True
        self._changed.set()

    async def wait_past(
        self,
        epoch: Callable[[], int],
        after: int,
        wait_s: float,
        gone: Callable[[], bool] = lambda: False,
    ) -> None:
        """Returns once ``epoch()`` is above ``after``, ``wait_s`` has passed, the node stops
        or ``gone()`` (the asker hung up: looked at every
        ``limits.topology_watch_hangup_check_ms``); ``UnavailableError`` at once when
        ``waiters_max`` requests wait already."""
        if epoch() > after or wait_s <= 0 or self.closed:
            return
        if self.waiting >= self.waiters_max:
            raise UnavailableError(
                f"{self.waiting} topology watchers wait here already; ask again later"
            )
        self.waiting += 1
        check_s = limits.topology_watch_hangup_check_ms / 1000
        try:
            async with asyncio.timeout(wait_s):
                while epoch() <= after and not self.closed and not gone():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(check_s):
                            await self._changed.wait()
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1


class Reconfigurer:
    """Opens, re-makes and closes a node's replicas as topologies arrive. One change at a time
    (a lock): two topologies arriving together are applied one after the other, and one whose
    epoch is not above the node's by the time its turn comes changes nothing."""

    def __init__(self, node: Node) -> None:
        self.node = node
        # Also held by a catch-up order while it opens a learner: a shard directory has one
        # store open at a time (a replica closing, a learner opening).
        self.lock = asyncio.Lock()
        self._link_tasks: dict[int, tuple[UpstreamLink | None, asyncio.Task[None]]] = {}
        # The signed message the node's topology came in (None: the command line's file).
        self.message: dict[str, Any] | None = None
        # Shards whose replica is being re-made: writes wait for it (bounded), other requests
        # get ``unavailable``.
        self.changing = ShardsChanging()
        # Per shard this node heads, a write hold: the head changed, and the old head may still
        # hold a lease (``lease.write_holds``; the leader may shorten it, ``release_hold``).
        self.write_holds: dict[int, WriteHold] = {}
        # Requests waiting for this node to adopt a newer topology (GET /v1/topology?after=).
        self.watch = TopologyWatch()
        # What this node's adopted topologies changed here since it started, by kind
        # (``change_kinds``), and the write holds they started: ``/metrics`` counters.
        self.changes: collections.Counter[str] = collections.Counter()
        self.holds_taken = 0

    def held_until_s(self, shard_id: int) -> float:
        hold = self.write_holds.get(shard_id)
        return hold.until_s if hold is not None else -math.inf

    def hold_status(self, shard_id: int) -> dict[str, Any] | None:
        """The shard's ``write_hold`` in the status: null when it has none."""
        hold = self.write_holds.get(shard_id)
        if hold is None:
            return None
        left_s = max(0.0, hold.until_s - self.node.clock.monotonic_s())
        left_ms = None if math.isinf(left_s) else round(left_s * 1000)  # a restart's: no end
        return {"epoch": hold.epoch, "remaining_ms": left_ms, "told": hold.told}

    def hold_until_lease(self) -> None:
        """At start, before any replica opens: a managed node takes no write on a shard it heads
        until it holds its lease (``lease.boot_holds``)."""
        node = self.node
        if node.lease.state.managed:
            self.write_holds = boot_holds(node.node_id, node.topology)

    def lease_held(self) -> None:
        """The node holds its lease: the holds from its start end (``lease.lease_won``)."""
        if not any(math.isinf(h.until_s) for h in self.write_holds.values()):
            return
        self.write_holds = lease_won(self.write_holds)
        for shard_id, replica in self.node.replicas.items():
            replica.writes_held_until_s = self.held_until_s(shard_id)

    def release_hold(self, shard_id: int, epoch: int, hold_ms: int) -> int | None:
        """The leader's ``POST /v1/admin/write-hold``: shortens the shard's hold (``release``);
        the milliseconds of it left (None: no hold on the shard)."""
        now_s = self.node.clock.monotonic_s()
        self.write_holds = release(self.write_holds, shard_id, epoch, hold_ms, now_s)
        replica = self.node.replicas.get(shard_id)
        if replica is not None:
            replica.writes_held_until_s = self.held_until_s(shard_id)
        if shard_id not in self.write_holds:
            return None
        left_s = self.held_until_s(shard_id) - now_s
        return limits.head_lease_ms if math.isinf(left_s) else max(0, round(left_s * 1000))

    async def choose_at_start(self) -> None:
        """Adopts the newest of the command line's topology, ``DATA/topology.json`` and the
        peers' signed ones (each MAC checked), before any store is opened."""
        node = self.node
        identity = node.topology.identity
        if identity is None:
            return
        candidates = []
        saved = await asyncio.to_thread(load_message, node.data_dir)
        if saved is not None:
            candidates.append(saved)
        candidates += await peer_messages(node.topology, node.node_id)
        best = newest(candidates, identity, node.node_id, node.topology)
        if best is None or best[0].epoch <= node.topology.epoch:
            return
        topology, message = best
        if message is not saved:
            await asyncio.to_thread(save_message, node.data_dir, message)
        log.info(
            "%s starts at topology epoch %s (its file says %s)",
            node.node_id,
            topology.epoch,
            node.topology.epoch,
        )
        node.topology = topology
        self.message = message
        self.watch.adopted()

    async def offer(self, message: Any) -> tuple[int, bool]:
        """``POST /v1/admin/topology``: ``(epoch after, applied)``."""
        node = self.node
        topology = check_message(message, node.topology.identity, node.node_id, node.topology)
        async with self.lock:
            if topology.epoch <= node.epoch:
                return node.epoch, False
            if not node.ready:
                raise UnavailableError(f"{node.node_id} is starting; send the topology again")
            await asyncio.to_thread(save_message, node.data_dir, message)
            await self._apply(topology, message)
            return node.epoch, True

    async def _apply(self, new: Topology, message: dict[str, Any]) -> None:
        node = self.node
        plan = plan_changes(node.node_id, node.topology, new)
        log.info(
            "%s: topology epoch %s -> %s: %s",
            node.node_id,
            node.epoch,
            new.epoch,
            {shard: change for shard, change in plan.items() if change != "keep"} or "no change",
        )
        # Out of service first, in one step with the switch: no request reaches a replica in its
        # old position under the new topology.
        leaving: list[ShardReplica] = []
        # Remade replicas whose store this process opened (salvage walk included) and has checked
        # on every read since: reopened without walking the file again (a walk takes about 1 s
        # per 100 MiB, and the chain waits for it: the spliced tail of a 256 MiB shard took
        # 1.3-1.8 s after the detection window to acknowledge again).
        verified: set[int] = set()
        for shard_id, change in plan.items():
            if change in ("remake", "close"):
                self.changing.add(shard_id)
                replica = node.replicas.pop(shard_id)
                if change == "remake" and not replica.repairing and replica.damage_seen is None:
                    verified.add(shard_id)
                replica.fail_pending(
                    UnavailableError(
                        f"shard {shard_id} changed at {node.node_id} (topology epoch {new.epoch}); "
                        "retry at the shard's head"
                    )
                )
                leaving.append(replica)
            elif change == "open":
                self.changing.add(shard_id)
        self.changes.update(change_kinds(node.node_id, node.topology, new, plan))
        if node.lease.state.managed:
            holds, now_s = self.write_holds, node.clock.monotonic_s()
            self.write_holds = adopt_holds(node.node_id, node.topology, new, holds, now_s)
            self.holds_taken += sum(h.epoch == new.epoch for h in self.write_holds.values())
        node.lease.adopted(new.epoch)
        node.topology = new
        self.message = message
        self.watch.adopted()
        # A learner of a shard this node now is a member of closes first: the member's replica
        # opens the same store and goes on from what it copied. The others follow the epoch.
        await learners.follow_topology(node, new)
        for shard_id, change in plan.items():
            kept = node.replicas.get(shard_id)
            if change == "keep" and kept is not None:
                kept.topology = new
                kept.shard = new.shards[shard_id]
                kept.writes_held_until_s = self.held_until_s(shard_id)
        try:
            for replica in leaving:
                await self.close_replica(replica)
            failed: list[Exception] = []
            for shard_id, change in plan.items():
                if change in ("remake", "open"):
                    try:
                        await self.open_replica(new.shards[shard_id], verified=shard_id in verified)
                    except Exception as exc:
                        # The shard stays out of service here (requests: unavailable), the others
                        # open; the manager sees this node's status lack the shard.
                        log.exception("shard %s: cannot open it at epoch %s", shard_id, new.epoch)
                        failed.append(exc)
                        continue
                    self.changing.discard(shard_id)
            if failed:
                raise failed[0]
        finally:
            for shard_id, change in plan.items():
                if change == "close":
                    self.changing.discard(shard_id)

    async def reopen_damaged(self) -> None:
        """Re-makes each replica whose reads met a damaged chunk (never served): the open
        salvages its store (docs/storage-format.md, "Salvage") and re-fetches the rest from a
        peer, as after a restart (docs/node-api.md, "Self-repair")."""
        node = self.node
        for shard_id, replica in list(node.replicas.items()):
            if replica.damage_seen is None:
                continue
            async with self.lock:
                shard = node.topology.shards.get(shard_id)
                if node.replicas.get(shard_id) is not replica or shard is None:
                    continue
                self.changing.add(shard_id)
                del node.replicas[shard_id]
                replica.fail_pending(
                    UnavailableError(f"shard {shard_id} is being repaired at {node.node_id}")
                )
                log.warning("shard %s: re-opening its damaged store to repair it", shard_id)
                try:
                    await self.close_replica(replica)
                    await self.open_replica(shard)
                finally:
                    self.changing.discard(shard_id)

    async def open_replica(self, shard: ShardChain, *, verified: bool = False) -> ShardReplica:
        """Opens this node's replica of ``shard`` as a start does: a head records its takeover
        entry, any other member starts its link to its upstream. ``verified``: the store was open
        in this process a moment ago, undamaged, so its salvage walk is skipped."""
        node = self.node
        path = os.path.join(node.data_dir, "shards", str(shard.id))
        await asyncio.to_thread(functools.partial(os.makedirs, path, exist_ok=True))
        replica = await asyncio.to_thread(
            functools.partial(
                ShardReplica,
                node_id=node.node_id,
                topology=node.topology,
                shard=shard,
                store_path=path,
                clock=node.clock,
                rng=node.rng,
                copied=verified,
            )
        )
        replica.commit_observer = node.commit_seconds.labels(str(shard.id)).observe
        replica.copy_rate_mb_per_s_max = node.copy_rate_mb_per_s_max
        replica.lease_holds = node.lease.holds
        replica.writes_held_until_s = self.held_until_s(shard.id)
        if await asyncio.to_thread(peer_repair.below_mark, replica):
            # Its store holds less than its durable mark: it re-fetches that much, from its
            # downstreams first, then from the other nodes' learners, before it serves.
            peers = peer_repair.peers_of(replica, node.topology)
            task = node.spawn(peer_repair.repair_from_peers(replica, peers))
            self._link_tasks[shard.id] = (None, task)
        elif replica.role == "head" and replica.repairing and replica.downstreams:
            # Its store lost a suffix: it re-fetches from its downstream before it serves.
            link = UpstreamLink(
                replica, peer=replica.downstreams[0], role="repair", until_caught_up=True
            )
            repair = node.spawn(learners.repair_then_lead(replica, link))
            self._link_tasks[shard.id] = (link, repair)
        elif replica.role == "head":
            await learners.repair_then_lead(replica, None)
        else:
            link = UpstreamLink(replica)
            link.on_failure = node.reports.peer_lost
            node.links.append(link)
            self._link_tasks[shard.id] = (link, node.spawn(link.run()))
        node.replicas[shard.id] = replica
        # The leader's word on the hold may have come while the replica opened (and found no
        # replica to shorten): it takes the hold as it stands now.
        replica.writes_held_until_s = self.held_until_s(shard.id)
        return replica

    async def close_replica(self, replica: ShardReplica) -> None:
        """Closes one replica as a stop does: its links end, its store commits land, its commit
        point and time index are written, its store is closed (and kept on disk)."""
        linked = self._link_tasks.pop(replica.shard_id, None)
        if linked is not None:
            link, task = linked
            if link is not None:
                with contextlib.suppress(ValueError):
                    self.node.links.remove(link)
                link.stop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        replica.close_downstream_links()
        await replica.settle()
        with contextlib.suppress(KayosError):
            await replica.persist_commit_point()
        with contextlib.suppress(KayosError):
            await replica.persist_time_index(force=True)
        replica.close()
