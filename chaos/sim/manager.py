"""The simulated cluster manager's leader: the real ``kayos.manager.decide`` fed the nodes'
heartbeats and reports, its actions (splices, catch-up orders, published topologies) carried out
as messages, the head leases it grants (chaos/sim/lease.py) and its evidence of death
(chaos/sim/evidence.py: watches, probes, reports, ``NodeGone``).
"""

from __future__ import annotations

from typing import Any

from chaos.sim import lease
from chaos.sim.client import Client
from chaos.sim.config import SimConfig
from chaos.sim.core import MANAGER, Endpoint, World
from chaos.sim.evidence import Evidence, node_gone
from chaos.sim.node import Node
from kayos.manager import (
    CatchUpDone,
    HeadTookOver,
    ManagerLeaderChanged,
    NodeReturned,
    PublishTopology,
    ShardReport,
    SpliceChain,
    StartCatchUp,
    TimerTick,
    decide,
)
from kayos.manager.events import Action
from kayos.manager.events import Event as ManagerEvent
from kayos.manager.view import ManagerView


class Manager(Endpoint):
    """The manager leader: feeds events to the real ``decide`` and carries its actions out."""

    def __init__(
        self,
        world: World,
        nodes: dict[str, Node],
        view: ManagerView,
        config: SimConfig,
        client: Client,
        plant: str | None,
    ) -> None:
        self.id = MANAGER
        self.world = world
        self.nodes = nodes
        self.view = view
        self.tick_ms = tick_ms = config.tick_ms
        self.client = client
        self.heard: list[tuple[str, int]] = []
        # (node, incarnation, nonce, arrival) heard since the last tick
        self.lease_asks: list[tuple[str, int, int, float]] = []
        self.evidence = Evidence(world, config, plant, self.node_gone)
        client.report_to = self.on_suspect
        self.lease_ms = next(iter(nodes.values())).lease.lease_ms if nodes else 0.0
        self.holds = lease.Holds(0.0, self._heads(), self.lease_ms)
        self.splices = 0
        self.catch_ups = 0
        self.orders = 0
        self.order_of: dict[tuple[str, int], int] = {}
        world.at(tick_ms, self.tick)

    def now(self) -> int:
        return int(self.world.now)

    def tick(self) -> None:
        heard, self.heard = tuple(self.heard), []
        self.decide(TimerTick(self.now(), heard))
        self.grant_leases()
        self.world.at(self.tick_ms, self.tick)

    def grant_leases(self) -> None:
        """Answers the heartbeats this tick applied (the sim's committed round): per shard, its
        epoch and whether the node is a live member (chaos/sim/lease.py)."""
        asks, self.lease_asks = self.lease_asks, []
        for node_id, incarnation, nonce, at in asks:
            state = self.view.node(node_id)
            live = state is not None and state.state not in ("down", "removed")
            grants = tuple((s.epoch, live and node_id in s.chain) for s in self.view.shards)
            for shard, (epoch, member) in enumerate(grants):
                if member:
                    self.holds.granted(node_id, shard, epoch, at, incarnation)
            endpoint = self.nodes[node_id]
            self.world.send(MANAGER, node_id, endpoint.on_lease, nonce, grants)

    def decide(self, event: ManagerEvent) -> None:
        self.apply(*decide(self.view, event))

    def node_gone(self, node: str) -> bool:
        """``NodeGone`` logged (chaos/sim/evidence.py, ``node_gone``: modelled until the
        product's ``decide`` has it). True if it made a live node down."""
        state = self.view.node(node)
        self.apply(*node_gone(self.view, node))
        return state is not None and state != self.view.node(node)

    def apply(self, view: ManagerView, actions: list[Action]) -> None:
        self.view = view
        for action in actions:
            if isinstance(action, SpliceChain):
                self.splices += 1
                for node in self.nodes.values():
                    self.world.send(
                        MANAGER, node.id, node.on_chain, action.shard, action.chain, action.epoch
                    )
                if self.holds.spliced(action.shard, action.chain, action.epoch):
                    self.release(action.shard, None)
            elif isinstance(action, StartCatchUp):
                self.catch_ups += 1
                self.order_catch_up(action.node, action.shard, action.upstream, action.rollback_to)
            elif isinstance(action, PublishTopology):
                # The producers' watch installs it once a node adopted it; consumers learn it
                # client_topology_lag_ms late.
                chains = tuple(s.chain for s in self.view.shards)
                world, client = self.world, self.client
                world.at(world.delay() + world.delay(), client.install, self.view.epoch, chains)
                world.at(client.config.client_topology_lag_ms, client.learn, chains)

    def order_catch_up(self, node: str, shard: int, upstream: str, rollback: int | None) -> None:
        """Each order is numbered; a ``CatchUpDone`` answering an older one is dropped (a late
        report of an earlier catch-up rejoined a node about to roll back: long run, seed 1523)."""
        self.orders += 1
        self.order_of[(node, shard)] = self.orders
        for target in (upstream, node):
            endpoint = self.nodes[target]
            self.world.send(
                MANAGER, target, endpoint.on_catch_up, shard, node, upstream, rollback, self.orders
            )

    def on_suspect(self, reporter: str, node: str, cause: str) -> None:
        """A member's or a client's report that ``node``'s connection was reset or refused, or
        silent (``POST /v1/manager/suspect``). Nothing to prove of a node already down."""
        state = self.view.node(node)
        if state is not None and state.state not in ("down", "removed"):
            self.evidence.report(reporter, node, cause)

    def inbox(self, kind: str, node: str, at: float, args: tuple[Any, ...]) -> None:
        if kind == "suspect":
            self.on_suspect(node, *args)
            return
        if kind in ("heartbeat", "returned"):
            reports, incarnation = args[0], args[1]
            self.heard.append((node, int(at)))
            self.evidence.heard_from(node, incarnation)
            if kind == "heartbeat":
                self.lease_asks.append((node, incarnation, args[2], at))
            state = self.view.node(node)
            if kind == "returned" or (state is not None and state.state in ("down", "slow")):
                shard_reports = tuple(
                    ShardReport(i, report[0], report[1]) for i, report in enumerate(reports)
                )
                self.decide(NodeReturned(node, self.now(), shard_reports))
            self.anti_entropy(node, reports)
        elif kind == "took_over":
            shard, master, seq = args
            self.decide(HeadTookOver(shard, node, master, seq))
        elif kind == "caught_up":
            shard, order = args
            current = self.view.shard(shard)
            view_order = current.order_of(node) if current is not None else None
            if self.order_of.get((node, shard)) == order and view_order is not None:
                self.decide(CatchUpDone(node, shard, view_order))

    def _heads(self) -> list[tuple[int, str]]:
        return [(s.epoch, s.chain[0]) for s in self.view.shards]

    def release(self, shard: int, reported_epoch: int | None) -> None:
        """Tells the shard's new head what is left of the old heads' leases (sim/lease.py,
        ``Holds``): at once after the splice, and again on a heartbeat showing the change (the
        first may arrive before the chain; it is then dropped and the head holds it all)."""
        pending = self.holds.pending.get(shard)
        if pending is None:
            return
        head, epoch = pending
        current = self.view.shard(shard)
        if current is None or current.chain[0] != head:
            del self.holds.pending[shard]
            return
        if reported_epoch is not None:
            if reported_epoch < epoch:
                return
            del self.holds.pending[shard]
        endpoint = self.nodes[head]
        evidence = self.evidence
        hold = self.holds.hold_ms(shard, head, self.world.now, evidence.proven, evidence.heard)
        self.world.send(MANAGER, head, endpoint.on_write_hold, shard, epoch, hold)

    def anti_entropy(self, node: str, reports: tuple[Any, ...]) -> None:
        """Orders a node missed (a lost datagram, a pause, a restart) are sent again."""
        endpoint = self.nodes[node]
        for shard, report in zip(self.view.shards, reports, strict=True):
            _last, _table, epoch, catching, order = report
            if self.holds.pending.get(shard.id, ("", 0))[0] == node:
                self.release(shard.id, epoch)
            if epoch < shard.epoch:
                self.world.send(
                    MANAGER, node, endpoint.on_chain, shard.id, shard.chain, shard.epoch
                )
            current = self.order_of.get((node, shard.id))
            if node in shard.catching_up and (catching != shard.tail or order != current):
                self.order_catch_up(node, shard.id, shard.tail, None)
            if node == shard.tail:
                self.world.send(
                    MANAGER, node, endpoint.on_followers, shard.id, shard.catching_up, shard.epoch
                )

    def failover(self) -> None:
        # A new leader: it knows no grant of the old one, only that each ends before its
        # election plus the lease (sim/lease.py, ``Holds``).
        self.holds = lease.Holds(self.world.now, self._heads(), self.lease_ms)
        self.evidence.failover()
        self.decide(ManagerLeaderChanged(self.now()))
