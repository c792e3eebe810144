"""One simulated run per seed: a cluster, the manager, a workload, a schedule of faults, a verdict.

``run_seed(seed)`` builds the world from the seed alone, so a failing seed replays exactly
(``kayos chaos sim --seed S``). Phase 1 (safety) runs the workload under faults; phase 2
(liveness) heals every fault and requires, within ``SimConfig.heal_ms``, that every node is back
in every chain with the same log and that every consumer group reads to the end. The history the
client records is judged by ``chaos.checker`` (the properties both tiers share); the simulator adds
what only it can see: ``split_brain`` (two heads accepting writes for one shard in one epoch) and
``liveness``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos import checker
from chaos.history import Commit, Event, Note, Outcome, Produce, Snapshot
from chaos.sim import lease
from chaos.sim.core import CLIENT, MANAGER, Endpoint, World
from chaos.sim.node import PLANTS, Node
from chaos.sim.store import Entry, Store
from kayos.errors import InvalidRequest
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
from kayos.manager.events import Event as ManagerEvent
from kayos.manager.view import Config as ManagerConfig
from kayos.manager.view import ManagerView

FAULT_KINDS = (
    "kill",
    "pause",
    "partition",
    "reset",
    "power_loss",
    "slow_disk",
    "fsync_error",
    "manager_failover",
    "partition_pair",
)
SIM_PROPERTIES = ("split_brain", "liveness")


@dataclass(frozen=True)
class SimConfig:
    """The model's knobs (docs/testing.md, "The simulator"). Times are simulated milliseconds,
    scaled down from the real bounds (peer silence 3 s, detection 6 s) by ten, keeping their
    ratios, so a run covers many detections and rejoins in few events."""

    nodes: int = 3
    shards: int = 2
    fault_phase_ms: float = 4_000
    heal_ms: float = 8_000
    fault_gap_ms: tuple[float, float] = (80, 400)
    hold_ms: tuple[float, float] = (0, 1_500)
    produce_gap_ms: tuple[float, float] = (8, 40)
    consume_gap_ms: tuple[float, float] = (20, 120)
    client_timeout_ms: float = 400
    keys_per_queue: int = 6
    txn_share: float = 0.2
    delete_share: float = 0.05
    groups: tuple[str, ...] = ("g1", "g2")
    delay_ms: tuple[float, float] = (0.1, 2.0)
    slow_delay_ms: float = 20.0
    slow_share: float = 0.005
    datagram_loss: float = 0.01
    sync_ms: tuple[float, float] = (0.3, 6.0)
    slow_sync_ms: tuple[float, float] = (20.0, 200.0)
    peer_silence_ms: float = 300
    heartbeat_ms: float = 100
    tick_ms: float = 100
    detection_window_ms: int = 600
    suspect_after_ms: int = 300
    min_replicas: int = 2
    # The head lease (limits.head_lease_ms scaled like the rest: a third of the window).
    lease_ms: float = 200
    # Consumers learn a new chain this long after the manager publishes it (real clients learn
    # it from a wrong_role answer or their next refresh): a snapshot may go to a spliced tail.
    client_topology_lag_ms: float = 200


@dataclass(frozen=True)
class Fault:
    at_ms: float
    kind: str
    node: str = ""
    hold_ms: float = 0.0
    holds: tuple[float, ...] = ()
    pick: float = 0.0


def schedule(seed: int, config: SimConfig) -> list[Fault]:
    """The faults of a run: a pure function of the seed (its own stream, apart from the world's)."""
    rng = random.Random(seed * 7919 + 17)
    nodes = [f"n{i}" for i in range(1, config.nodes + 1)]
    faults: list[Fault] = []
    at = rng.uniform(*config.fault_gap_ms)
    while at < config.fault_phase_ms:
        kind = rng.choice(FAULT_KINDS)
        node = rng.choice(nodes)
        hold = rng.uniform(*config.hold_ms)
        holds = tuple(rng.uniform(*config.hold_ms) for _ in nodes)
        faults.append(Fault(at, kind, node, hold, holds, rng.random()))
        at += rng.uniform(*config.fault_gap_ms)
    return faults


@dataclass
class Report:
    seed: int
    plant: str | None
    ok: bool
    faults: dict[str, int]
    produce_calls: dict[str, int]
    acked: int
    lost: int
    delivered: int
    snapshots: int
    commits: int
    violations: list[dict[str, Any]]
    events: int
    sim_ms: float
    splices: int = 0  # SpliceChain orders the manager gave (chain changes, shard by shard)
    catch_ups: int = 0  # StartCatchUp orders (returned nodes sent to copy from a tail)
    history: list[Event] = field(default_factory=list, repr=False)

    def replay(self) -> str:
        plant = f" --plant {self.plant}" if self.plant else ""
        return f"kayos chaos sim --seed {self.seed} --seeds 1{plant}"

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "plant": self.plant,
            "ok": self.ok,
            "faults": self.faults,
            "produce_calls": self.produce_calls,
            "acked": self.acked,
            "lost": self.lost,
            "delivered": self.delivered,
            "snapshots": self.snapshots,
            "commits": self.commits,
            "events": self.events,
            "sim_ms": round(self.sim_ms, 1),
            "manager": {"splices": self.splices, "catch_ups": self.catch_ups},
            "violations": self.violations,
            "replay": self.replay(),
        }


class Manager(Endpoint):
    """The manager leader: feeds events to the real ``decide`` and carries its actions out."""

    def __init__(
        self,
        world: World,
        nodes: dict[str, Node],
        view: ManagerView,
        tick_ms: float,
        client: Client,
    ) -> None:
        self.id = MANAGER
        self.world = world
        self.nodes = nodes
        self.view = view
        self.tick_ms = tick_ms
        self.client = client
        self.heard: list[tuple[str, int]] = []
        # (node, nonce, arrival) heard since the last tick
        self.lease_asks: list[tuple[str, int, float]] = []
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
        for node_id, nonce, at in asks:
            state = self.view.node(node_id)
            live = state is not None and state.state not in ("down", "removed")
            grants = tuple((s.epoch, live and node_id in s.chain) for s in self.view.shards)
            for shard, (epoch, member) in enumerate(grants):
                if member:
                    self.holds.granted(node_id, shard, epoch, at)
            endpoint = self.nodes[node_id]
            self.world.send(MANAGER, node_id, endpoint.on_lease, nonce, grants)

    def decide(self, event: ManagerEvent) -> None:
        self.view, actions = decide(self.view, event)
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
                chains = tuple(s.chain for s in self.view.shards)
                self.client.chains = chains
                self.world.at(self.client.config.client_topology_lag_ms, self.client.learn, chains)

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

    def inbox(self, kind: str, node: str, at: float, args: tuple[Any, ...]) -> None:
        if kind in ("heartbeat", "returned"):
            reports = args[0]
            self.heard.append((node, int(at)))
            if kind == "heartbeat":
                self.lease_asks.append((node, args[1], at))
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
        hold = self.holds.hold_ms(shard, head, self.world.now)
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
        self.decide(ManagerLeaderChanged(self.now()))


class Client(Endpoint):
    """Producers and consumers, recording the history the checker judges."""

    def __init__(
        self,
        world: World,
        nodes: dict[str, Node],
        config: SimConfig,
        chains: tuple[tuple[str, ...], ...],
    ) -> None:
        self.id = CLIENT
        self.world = world
        self.nodes = nodes
        self.config = config
        self.chains = chains
        self.events: list[Event] = []
        self._tick = 0
        self._op = 0
        self.pending: dict[int, tuple[Any, ...]] = {}
        # The chains consumers go by: the published ones, client_topology_lag_ms late.
        self.read_chains = chains
        self.producing = True
        self.reached: dict[tuple[int, str], int] = {}

    def tick(self) -> int:
        self._tick += 1
        return self._tick

    def learn(self, chains: tuple[tuple[str, ...], ...]) -> None:
        self.read_chains = chains

    def next_op(self) -> int:
        self._op += 1
        return self._op

    def start(self) -> None:
        rng = self.world.rng
        for shard in range(self.config.shards):
            self.world.at(rng.uniform(*self.config.produce_gap_ms), self.produce_loop, shard)
            for group in self.config.groups:
                self.world.at(rng.uniform(*self.config.consume_gap_ms), self.consume, shard, group)

    # --- producing -------------------------------------------------------------------------------

    def produce_loop(self, shard: int) -> None:
        if not self.producing:
            return
        rng, config = self.world.rng, self.config
        op = self.next_op()
        queue = f"q{shard}"
        keys = [f"k{i}" for i in range(config.keys_per_queue)]
        txn = rng.random() < config.txn_share
        chosen = rng.sample(keys, rng.randint(2, 3)) if txn else [rng.choice(keys)]
        items = tuple(
            (key, None if rng.random() < config.delete_share else f"{queue}:{op}:{key}")
            for key in chosen
        )
        self.send(shard, op, ("produce", queue, items, txn))
        self.world.at(rng.uniform(*config.produce_gap_ms), self.produce_loop, shard)

    def send(self, shard: int, op: int, what: tuple[Any, ...]) -> None:
        invoked = self.tick()
        self.pending[op] = (shard, invoked, what)
        head = self.nodes[self.chains[shard][0]]
        if what[0] == "produce":
            items = tuple((key, value, "", 0) for key, value in what[2])
        else:
            items = (("", None, what[2], what[3]),)
        self.world.send(CLIENT, head.id, head.on_produce, shard, op, items, self.on_produced)
        self.world.at(self.config.client_timeout_ms, self.on_produced, op, False, 0, 0)

    def on_produced(self, op: int, ok: bool, first: int, last: int) -> None:
        entry = self.pending.pop(op, None)
        if entry is None:
            return
        shard, invoked, what = entry
        completed = self.tick()
        at_s = self.world.now / 1000
        outcome: Outcome = "ok" if ok else "unknown"
        if what[0] == "produce":
            _, queue, items, txn = what
            self.events.append(
                Produce(
                    op,
                    queue,
                    items,
                    txn,
                    "all",
                    outcome,
                    first if ok else 0,
                    last if ok else 0,
                    invoked,
                    completed,
                    at_s,
                )
            )
        else:
            _, queue, group, hwm = what
            self.events.append(Commit(op, queue, group, hwm, outcome, invoked, completed, at_s))
            self.world.at(
                self.world.rng.uniform(*self.config.consume_gap_ms), self.consume, shard, group
            )

    def pending_produces(self) -> bool:
        return any(what[0] == "produce" for _s, _i, what in self.pending.values())

    # --- consuming -------------------------------------------------------------------------------

    def consume(self, shard: int, group: str) -> None:
        op = self.next_op()
        invoked = self.tick()
        self.pending[op] = (shard, invoked, ("snapshot", group))
        tail = self.nodes[self.read_chains[shard][-1]]
        self.world.send(CLIENT, tail.id, tail.on_snapshot, shard, op, group, self.on_snapshot)
        self.world.at(self.config.client_timeout_ms, self.on_snapshot, op, None)

    def on_snapshot(self, op: int, result: tuple[int, int, list[Entry]] | None) -> None:
        entry = self.pending.pop(op, None)
        if entry is None:
            return
        shard, invoked, (_, group) = entry
        again = self.world.rng.uniform(*self.config.consume_gap_ms)
        if result is None:
            self.world.at(again, self.consume, shard, group)
            return
        hwm, boundary, entries = result
        queue = f"q{shard}"
        messages = tuple((e.seq, e.key, e.value) for e in entries)
        self.events.append(
            Snapshot(
                op,
                queue,
                group,
                shard,
                hwm,
                boundary,
                messages,
                True,
                invoked,
                self.tick(),
                self.world.now / 1000,
            )
        )
        self.reached[(shard, group)] = max(boundary, self.reached.get((shard, group), 0))
        if boundary > hwm:
            self.send(shard, self.next_op(), ("commit", queue, group, boundary))
        else:
            self.world.at(again, self.consume, shard, group)


class Sim:
    def __init__(self, seed: int, config: SimConfig, plant: str | None) -> None:
        if plant is not None and plant not in PLANTS:
            raise InvalidRequest(f"unknown plant {plant!r}; known: {', '.join(PLANTS)}")
        self.seed, self.config, self.plant = seed, config, plant
        self.world = World(
            seed,
            delay_ms=config.delay_ms,
            slow_delay_ms=config.slow_delay_ms,
            slow_share=config.slow_share,
            datagram_loss=config.datagram_loss,
            peer_silence_ms=config.peer_silence_ms,
        )
        self.heads: dict[tuple[int, int], set[str]] = {}
        ids = [f"n{i}" for i in range(1, config.nodes + 1)]
        self.nodes = {
            node_id: Node(
                self.world,
                node_id,
                config.shards,
                plant=plant,
                sync_ms=config.sync_ms,
                slow_sync_ms=config.slow_sync_ms,
                heartbeat_ms=config.heartbeat_ms,
                lease_ms=config.lease_ms,
                heads=self.heads,
            )
            for node_id in ids
        }
        for node in self.nodes.values():
            self.world.endpoints[node.id] = node
        chains = tuple(
            tuple(ids[(s + i) % len(ids)] for i in range(len(ids))) for s in range(config.shards)
        )
        self.client = Client(self.world, self.nodes, config, chains)
        mconfig = ManagerConfig(
            detection_window_ms=config.detection_window_ms,
            suspect_after_ms=config.suspect_after_ms,
            min_replicas=config.min_replicas,
        )
        view = ManagerView.bootstrap(mconfig, ids, chains)
        self.manager = Manager(self.world, self.nodes, view, config.tick_ms, self.client)
        self.world.endpoints[MANAGER] = self.manager
        self.world.endpoints[CLIENT] = self.client
        for node in self.nodes.values():
            node.manager_inbox = self.manager.inbox
        self.world.on_link_closed = self._link_closed
        for shard, members in enumerate(chains):
            for node_id in members:
                replica = self.nodes[node_id].replicas[shard]
                replica.store.chain, replica.store.epoch = members, view.epoch
        self.faults: Counter[str] = Counter()

    def _link_closed(self, node_id: str, link: Any) -> None:
        node = self.nodes.get(node_id)
        if node is not None and node.up:
            node.deliver(node.link_closed, (link,))

    # --- faults ----------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        world, node = self.world, self.nodes[fault.node]
        self.faults[fault.kind] += 1
        self.client.events.append(
            Note(
                self.client.next_op(),
                "fault",
                {"kind": fault.kind, "node": fault.node, "hold_ms": round(fault.hold_ms, 1)},
                self.client._tick,
                self.client._tick,
                world.now / 1000,
            )
        )
        if fault.kind == "kill":
            node.crash()
            world.at(fault.hold_ms, self.restart, node)
        elif fault.kind == "pause":
            node.pause()
            world.at(fault.hold_ms, node.resume)
        elif fault.kind == "partition":
            others = [n for n in self.nodes if n != node.id] + [MANAGER]
            for other in others:
                world.partition(node.id, other)
            world.at(fault.hold_ms, self.heal_node, node.id)
        elif fault.kind == "partition_pair":
            # Two nodes (this one and the next by id) cut from the rest and the manager, not from
            # each other nor the clients: a chain's tail and its upstream may keep their link.
            ids = sorted(self.nodes)
            pair = (node.id, ids[(ids.index(node.id) + 1) % len(ids)])
            for cut in pair:
                for other in [n for n in self.nodes if n not in pair] + [MANAGER]:
                    world.partition(cut, other)
                world.at(fault.hold_ms, self.heal_node, cut)
        elif fault.kind == "reset":
            links = sorted(world.links.values(), key=lambda link: link.id)
            if links:
                world.close_link(links[int(fault.pick * len(links))])
        elif fault.kind == "power_loss":
            for each, hold in zip(self.nodes.values(), fault.holds, strict=True):
                each.crash()
                world.at(hold, self.restart, each)
        elif fault.kind == "slow_disk":
            node.slow_disk_until = max(node.slow_disk_until, world.now + fault.hold_ms)
        elif fault.kind == "fsync_error":
            node.failing_syncs += 1
        elif fault.kind == "manager_failover":
            self.manager.failover()

    def restart(self, node: Node) -> None:
        if not node.up:
            node.start()

    def heal_node(self, node_id: str) -> None:
        for other in [*self.nodes, MANAGER]:
            self.world.heal(node_id, other)

    def heal_all(self) -> None:
        for pair in list(self.world.cut):
            self.world.heal(*sorted(pair))
        for node in self.nodes.values():
            node.slow_disk_until = 0.0
            if not node.up:
                node.start()
            elif node.paused:
                node.resume()

    # --- phases ----------------------------------------------------------------------------------

    def converged(self) -> bool:
        """Every node is in every chain, and every member holds, and the head has committed,
        every produced entry its head holds (consumers' marks may still be in flight)."""
        view = self.manager.view
        ids = set(self.nodes)
        for shard in view.shards:
            if set(shard.chain) != ids or shard.departed or shard.catching_up:
                return False
            head = self.nodes[shard.chain[0]].replicas[shard.id]
            target = _last_produced(head.store)
            if head.progress is None or head.progress.commit_point < target:
                return False
            for node_id in shard.chain:
                replica = self.nodes[node_id].replicas[shard.id]
                if replica.progress is None or replica.store.durable_last() < target:
                    return False
        return True

    def run(self) -> Report:
        world, config = self.world, self.config
        for node in self.nodes.values():
            node.start()
        self.client.start()
        for fault in schedule(self.seed, config):
            world.at(fault.at_ms, self.inject, fault)
        world.run_until(config.fault_phase_ms)
        self.heal_all()
        self.client.producing = False
        deadline = config.fault_phase_ms + config.heal_ms
        violations: list[dict[str, Any]] = []
        world.run_until(deadline, self._settled)
        targets: dict[int, int] = {}
        settled = self._settled()
        if settled:
            for shard in self.manager.view.shards:
                head = self.nodes[shard.chain[0]].replicas[shard.id]
                targets[shard.id] = _last_produced(head.store)
            world.run_until(deadline, lambda: self._drained(targets))
        if not settled or not self._drained(targets):
            violations.append(
                {
                    "property": "liveness",
                    "message": "the cluster did not converge and drain within the heal bound",
                    "detail": {
                        "converged": settled,
                        "targets": targets,
                        "reached": {f"{s}/{g}": v for (s, g), v in self.client.reached.items()},
                        "chains": [list(s.chain) for s in self.manager.view.shards],
                    },
                }
            )
        for (shard_id, epoch), heads in sorted(self.heads.items()):
            if len(heads) > 1:
                violations.append(
                    {
                        "property": "split_brain",
                        "message": (
                            f"shard {shard_id}: {sorted(heads)} accepted writes as head"
                            f" at epoch {epoch}"
                        ),
                        "detail": {"shard": shard_id, "epoch": epoch, "heads": sorted(heads)},
                    }
                )
        events = self.client.events
        verdict = checker.check(events)
        violations = [v.to_json() for v in verdict.violations] + violations
        calls = Counter(e.outcome for e in events if isinstance(e, Produce))
        return Report(
            seed=self.seed,
            plant=self.plant,
            ok=not violations,
            faults={kind: self.faults.get(kind, 0) for kind in FAULT_KINDS},
            produce_calls=dict(sorted(calls.items())),
            acked=verdict.acked_versions,
            lost=verdict.lost_versions,
            delivered=verdict.delivered_messages,
            snapshots=verdict.snapshots,
            commits=sum(1 for e in events if isinstance(e, Commit)),
            violations=violations,
            events=world.events_run,
            sim_ms=world.now,
            splices=self.manager.splices,
            catch_ups=self.manager.catch_ups,
            history=events,
        )

    def _settled(self) -> bool:
        return self.converged() and not self.client.pending_produces()

    def _drained(self, targets: dict[int, int]) -> bool:
        return all(
            self.client.reached.get((shard, group), 0) >= target
            for shard, target in targets.items()
            for group in self.config.groups
        )


def _last_produced(store: Store) -> int:
    for batch in reversed(store.batches + store.pending):
        for entry in reversed(batch):
            if not entry.group:
                return entry.seq
    return 0


def run_seed(seed: int, *, plant: str | None = None, config: SimConfig | None = None) -> Report:
    return Sim(seed, config or SimConfig(), plant).run()


@dataclass
class Summary:
    seeds: int
    plant: str | None
    failed: list[int]
    faults: dict[str, int]
    acked: int
    lost: int
    violations: dict[str, int]
    seconds: float
    splices: int
    catch_ups: int
    first_failure: Report | None

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "plant": self.plant,
            "ok": not self.failed,
            "failed_seeds": self.failed[:50],
            "failed": len(self.failed),
            "faults": self.faults,
            "manager": {"splices": self.splices, "catch_ups": self.catch_ups},
            "acked": self.acked,
            "lost": self.lost,
            "violations": self.violations,
            "seconds": round(self.seconds, 2),
            "seeds_per_s": round(self.seeds / self.seconds, 1) if self.seconds else None,
            "first_failure": self.first_failure.to_json() if self.first_failure else None,
        }


def run_seeds(
    seeds: range | list[int],
    *,
    plant: str | None = None,
    config: SimConfig | None = None,
    stop_at_first: bool = False,
) -> Summary:
    started = time.perf_counter()
    faults: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    failed: list[int] = []
    acked = lost = count = splices = catch_ups = 0
    first: Report | None = None
    for seed in seeds:
        report = run_seed(seed, plant=plant, config=config)
        count += 1
        faults.update(report.faults)
        acked += report.acked
        lost += report.lost
        splices += report.splices
        catch_ups += report.catch_ups
        for violation in report.violations:
            violations[violation["property"]] += 1
        if not report.ok:
            failed.append(seed)
            first = first or report
            if stop_at_first:
                break
    props = (*checker.PROPERTIES, *SIM_PROPERTIES)
    return Summary(
        seeds=count,
        plant=plant,
        failed=failed,
        faults={kind: faults.get(kind, 0) for kind in FAULT_KINDS},
        acked=acked,
        lost=lost,
        violations={p: violations.get(p, 0) for p in props},
        seconds=time.perf_counter() - started,
        splices=splices,
        catch_ups=catch_ups,
        first_failure=first,
    )
