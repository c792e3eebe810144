"""One simulated run per seed: a cluster, the manager, a workload, a schedule of faults, a verdict.

``run_seed(seed)`` builds the world from the seed alone, so a failing seed replays exactly
(``kayos chaos sim --seed S``). Phase 1 (safety) runs the workload under faults; phase 2
(liveness) heals every fault and requires, within ``SimConfig.heal_ms``, that every node is back
in every chain with the same log and that every consumer group reads to the end. The history the
client records is judged by ``chaos.checker`` (the properties both tiers share); the simulator adds
what only it can see: ``split_brain`` (two heads accepting writes for one shard in one epoch) and
``liveness``.

The parts of the world: the nodes (``chaos.sim.node``), the manager's leader
(``chaos.sim.manager``), the workload (``chaos.sim.client``), the network and clock
(``chaos.sim.core``); here are the faults, the phases and the verdict.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos import checker
from chaos.history import Commit, Event, Note, Produce
from chaos.sim import producers
from chaos.sim.client import Client
from chaos.sim.config import SimConfig
from chaos.sim.core import CLIENT, MANAGER, World
from chaos.sim.manager import Manager
from chaos.sim.node import PLANTS, Node
from chaos.sim.store import Store
from kayos.errors import InvalidRequest
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
    "partition_nodes",
)
SIM_PROPERTIES = ("split_brain", "liveness", *producers.PROPERTIES)


@dataclass(frozen=True)
class Fault:
    at_ms: float
    kind: str
    node: str = ""
    hold_ms: float = 0.0
    holds: tuple[float, ...] = ()
    pick: float = 0.0
    # A partition's kind: "drop" (silence) or "reject" (resets, refusals).
    cut: str = "drop"


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
        pick = rng.random()
        cut = "reject" if rng.random() < config.reject_share else "drop"
        faults.append(Fault(at, kind, node, hold, holds, pick, cut))
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
    node_gone: int = 0  # NodeGone the manager logged (proofs of death)
    node_gone_alive: int = 0  # of them, of a process in fact alive
    resends: int = 0  # producer requests sent again (same producer id and producer seq)
    window_hits: int = 0  # of them, answered from a head's producer window (not written again)
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
            **counts_json(self),
            "violations": self.violations,
            "replay": self.replay(),
        }


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
                window_entries=config.producer_window_entries,
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
        self.manager = Manager(self.world, self.nodes, view, config, self.client, plant)
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
                {
                    "kind": fault.kind,
                    "node": fault.node,
                    "hold_ms": round(fault.hold_ms, 1),
                    "cut": fault.cut if fault.kind.startswith("partition") else "",
                },
                self.client.last_tick,
                self.client.last_tick,
                world.now / 1000,
            )
        )
        if fault.kind == "kill":
            node.crash()
            world.at(fault.hold_ms, self.restart, node)
        elif fault.kind == "pause":
            node.pause()
            world.at(fault.hold_ms, node.resume)
        elif fault.kind.startswith("partition"):
            self.partition(fault)
        elif fault.kind == "reset":
            links = sorted(world.links.values(), key=lambda link: link.id)
            if links:
                world.close_link(links[int(fault.pick * len(links))], "reset")
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

    def partition(self, fault: Fault) -> None:
        """``partition``: the node from the other nodes and the manager; ``partition_pair``: it
        and the next one by id from the third and the manager, not from each other (a chain's
        tail and its upstream may keep their link); ``partition_nodes``: the node from the other
        nodes only (the manager still reaches it). Never from the clients."""
        ids = sorted(self.nodes)
        cut = [fault.node]
        if fault.kind == "partition_pair":
            cut.append(ids[(ids.index(fault.node) + 1) % len(ids)])
        others = [n for n in ids if n not in cut]
        if fault.kind != "partition_nodes":
            others.append(MANAGER)
        for node_id in cut:
            for other in others:
                self.world.partition(node_id, other, fault.cut)
            self.world.at(fault.hold_ms, self.heal_node, node_id)

    def restart(self, node: Node) -> None:
        if not node.up:
            node.start()

    def heal_node(self, node_id: str) -> None:
        for other in [*self.nodes, MANAGER]:
            self.world.heal(node_id, other)

    def heal_all(self) -> None:
        # In a fixed order: the set's order follows string hashing, which differs per process,
        # and a seed must replay the same run in any process.
        for pair in sorted(sorted(pair) for pair in self.world.cut):
            self.world.heal(*pair)
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
        violations += producers.check_logs(self.final_logs(), self.client.records)
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
            node_gone=self.manager.evidence.node_gone,
            node_gone_alive=self.manager.evidence.node_gone_alive,
            resends=self.client.resends,
            window_hits=sum(node.window_hits for node in self.nodes.values()),
            history=events,
        )

    def final_logs(self) -> dict[int, list[tuple[int, str, int]]]:
        """Each shard's log as its head (by the manager's view) holds it at the end."""
        return {
            shard.id: self.nodes[shard.chain[0]].replicas[shard.id].store.log()
            for shard in self.manager.view.shards
        }

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
    node_gone: int = 0
    node_gone_alive: int = 0
    resends: int = 0
    window_hits: int = 0

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
            **counts_json(self),
            "acked": self.acked,
            "lost": self.lost,
            "violations": self.violations,
            "seconds": round(self.seconds, 2),
            "seeds_per_s": round(self.seeds / self.seconds, 1) if self.seconds else None,
            "first_failure": self.first_failure.to_json() if self.first_failure else None,
        }


def counts_json(counts: Report | Summary) -> dict[str, Any]:
    """The manager's moves and the producers' resends of a run or of a series of runs."""
    return {
        "manager": {
            "splices": counts.splices,
            "catch_ups": counts.catch_ups,
            "node_gone": counts.node_gone,
            "node_gone_alive": counts.node_gone_alive,
        },
        "resends": counts.resends,
        "window_hits": counts.window_hits,
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
    acked = lost = count = splices = catch_ups = resends = window_hits = 0
    node_gone = node_gone_alive = 0
    first: Report | None = None
    for seed in seeds:
        report = run_seed(seed, plant=plant, config=config)
        count += 1
        faults.update(report.faults)
        acked += report.acked
        lost += report.lost
        splices += report.splices
        catch_ups += report.catch_ups
        node_gone += report.node_gone
        node_gone_alive += report.node_gone_alive
        resends += report.resends
        window_hits += report.window_hits
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
        node_gone=node_gone,
        node_gone_alive=node_gone_alive,
        resends=resends,
        window_hits=window_hits,
    )
