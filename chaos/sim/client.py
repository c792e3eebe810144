"""The simulated clients: producers and consumers of every shard, recording the history
``chaos.checker`` judges. Each request is a datagram to the head (a produce, a group commit) or to
a tail (a snapshot), answered or timed out (outcome unknown).
"""

from __future__ import annotations

from typing import Any

from chaos.history import Commit, Event, Outcome, Produce, Snapshot
from chaos.sim.config import SimConfig
from chaos.sim.core import CLIENT, Endpoint, World
from chaos.sim.node import Node
from chaos.sim.store import Entry


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
        self.last_tick = 0  # the logical time of the history: one tick per call and answer
        self._op = 0
        self.pending: dict[int, tuple[Any, ...]] = {}
        # The chains consumers go by: the published ones, client_topology_lag_ms late.
        self.read_chains = chains
        self.producing = True
        self.reached: dict[tuple[int, str], int] = {}

    def tick(self) -> int:
        self.last_tick += 1
        return self.last_tick

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
