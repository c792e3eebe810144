"""The simulated clients: idempotent producers and consumers of every shard, recording the history
``chaos.checker`` judges (docs/testing.md, "The simulator").

A producer makes one call at a time; each call takes the producer's next producer seq once, and
every resend carries it (docs/node-api.md, "Clients"): a request in flight to a node that no
longer heads its shard when a topology is installed is abandoned and re-sent at once; a request
reset or refused (a dead node) fails at once, the node is reported to the manager, and the call
waits for a newer topology (at most ``client_silence_ms``); a request that heard nothing for
``client_silence_ms`` is given up, reported and waits the same way; a refusal is re-sent after a
short pause. A call unanswered ``produce_budget_ms`` after it began is ``unknown``.

Consumers' requests (a snapshot to a tail, a group commit to the head) are not re-sent: an
unanswered one is ``unknown`` after ``client_timeout_ms``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chaos.history import Commit, Event, Outcome, Produce, Snapshot
from chaos.sim.config import SimConfig
from chaos.sim.core import CLIENT, MANAGER, Endpoint, World
from chaos.sim.node import Node
from chaos.sim.producers import CallRecord
from chaos.sim.store import Entry


@dataclass
class Call:
    """A producer call in flight: ``attempt`` numbers its sends (a late answer to an earlier one
    is ignored); ``sent_to`` is the node the current send went to ("" while it waits)."""

    op: int
    producer: int
    pseq: int
    shard: int
    items: tuple[tuple[str, str | None], ...]
    txn: bool
    invoked: int
    began: float
    attempt: int = 0
    sent_to: str = ""
    waiting: bool = False  # for a newer topology (after a reset, a refusal or silence)


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
        self.epoch = 0  # of the installed topology (the producers')
        self.events: list[Event] = []
        self.last_tick = 0  # the logical time of the history: one tick per call and answer
        self._op = 0
        self.pending: dict[int, tuple[Any, ...]] = {}
        # The chains consumers go by: the published ones, client_topology_lag_ms late.
        self.read_chains = chains
        self.producing = True
        self.reached: dict[tuple[int, str], int] = {}
        self.producer_ids = [world.rng.randbytes(16).hex() for _ in range(config.producers)]
        self.next_pseq = [0] * config.producers
        self.calls: dict[int, Call] = {}
        self.records: list[CallRecord] = []
        self.resends = 0
        # The manager's report inbox (``Manager.on_suspect``), set by the run.
        self.report_to: Callable[[str, str, str], None] = lambda reporter, node, cause: None
        world.on_crash.append(self.node_crashed)

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
        for producer in range(self.config.producers):
            self.world.at(rng.uniform(*self.config.produce_gap_ms), self.produce_loop, producer)
        for shard in range(self.config.shards):
            for group in self.config.groups:
                self.world.at(rng.uniform(*self.config.consume_gap_ms), self.consume, shard, group)

    # --- producing -------------------------------------------------------------------------------

    def produce_loop(self, producer: int) -> None:
        if not self.producing:
            return
        rng, config = self.world.rng, self.config
        op = self.next_op()
        shard = rng.randrange(config.shards)
        queue = f"q{shard}"
        keys = [f"k{i}" for i in range(config.keys_per_queue)]
        txn = rng.random() < config.txn_share
        chosen = rng.sample(keys, rng.randint(2, 3)) if txn else [rng.choice(keys)]
        items = tuple(
            (key, None if rng.random() < config.delete_share else f"{queue}:{op}:{key}")
            for key in chosen
        )
        self.next_pseq[producer] += 1
        pseq = self.next_pseq[producer]
        call = Call(op, producer, pseq, shard, items, txn, self.tick(), self.world.now)
        self.calls[op] = call
        self.attempt(call)

    def attempt(self, call: Call) -> None:
        """Sends the call (again) to its shard's head as the installed topology names it."""
        if self.world.now - call.began >= self.config.produce_budget_ms:
            self.finish(call, "unknown", 0, 0)
            return
        if call.attempt:
            self.resends += 1
        call.attempt += 1
        call.waiting = False
        head = self.nodes[self.chains[call.shard][0]]
        call.sent_to = head.id
        items = tuple((key, value, "", 0) for key, value in call.items)
        producer_id, token = self.producer_ids[call.producer], call.attempt
        self.world.request(
            CLIENT,
            head.id,
            lambda: self.on_reset(call.op, token, "refused"),
            head.on_produce,
            call.shard,
            call.op,
            token,
            items,
            producer_id,
            call.pseq,
            self.on_produced,
        )
        self.world.at(self.config.client_silence_ms, self.on_silent, call.op, token)

    def current(self, op: int, attempt: int) -> Call | None:
        call = self.calls.get(op)
        return call if call is not None and call.attempt == attempt else None

    def on_produced(self, op: int, attempt: int, status: str, first: int, last: int) -> None:
        call = self.current(op, attempt)
        if call is None:
            if op in self.pending:
                self.on_committed(op, status, first, last)
            return
        if status == "ok":
            self.finish(call, "ok", first, last)
        elif status == "too_old":
            self.finish(call, "unknown", 0, 0)
        else:  # refused, or failed (the head gave up waiting): again, the same producer seq
            call.sent_to = ""
            retry = self.world.rng.uniform(*self.config.retry_ms)
            self.world.at(retry, self.retry, op, attempt)

    def on_reset(self, op: int, attempt: int, cause: str) -> None:
        call = self.current(op, attempt)
        if call is None or not call.sent_to:
            return
        self.report(call.sent_to, cause)
        self.wait_for_topology(call)

    def on_silent(self, op: int, attempt: int) -> None:
        call = self.current(op, attempt)
        if call is None or not call.sent_to:
            return
        self.report(call.sent_to, "silence")
        self.wait_for_topology(call)

    def wait_for_topology(self, call: Call) -> None:
        call.sent_to, call.waiting = "", True
        self.world.at(self.config.client_silence_ms, self.retry, call.op, call.attempt)

    def retry(self, op: int, attempt: int) -> None:
        call = self.current(op, attempt)
        if call is not None:
            self.attempt(call)

    def report(self, node: str, cause: str) -> None:
        """``POST /v1/manager/suspect`` (fire and forget)."""
        self.world.send(CLIENT, MANAGER, self.report_to, CLIENT, node, cause)

    def node_crashed(self, node: str) -> None:
        """The node's connections are reset: requests in flight on them fail at once."""
        for call in sorted(self.calls.values(), key=lambda call: call.op):
            if call.sent_to == node:
                self.world.at(self.world.delay(), self.on_reset, call.op, call.attempt, "reset")

    def install(self, epoch: int, chains: tuple[tuple[str, ...], ...]) -> None:
        """A newer topology (the client's watch): requests in flight to a node that no longer
        heads their shard, and calls waiting for a topology, are sent again at once."""
        if epoch <= self.epoch:
            return
        self.epoch, self.chains = epoch, chains
        for call in sorted(self.calls.values(), key=lambda call: call.op):
            if call.waiting or (call.sent_to and call.sent_to != chains[call.shard][0]):
                self.attempt(call)

    def finish(self, call: Call, outcome: Outcome, first: int, last: int) -> None:
        del self.calls[call.op]
        queue = f"q{call.shard}"
        completed = self.tick()
        self.events.append(
            Produce(
                call.op,
                queue,
                call.items,
                call.txn,
                "all",
                outcome,
                first,
                last,
                call.invoked,
                completed,
                self.world.now / 1000,
            )
        )
        self.records.append(
            CallRecord(
                call.op,
                self.producer_ids[call.producer],
                call.pseq,
                call.shard,
                len(call.items),
                outcome,
                first,
                last,
                call.invoked,
            )
        )
        gap = self.world.rng.uniform(*self.config.produce_gap_ms)
        self.world.at(gap, self.produce_loop, call.producer)

    def pending_produces(self) -> bool:
        return bool(self.calls)

    # --- consuming -------------------------------------------------------------------------------

    def commit(self, shard: int, group: str, hwm: int) -> None:
        op = self.next_op()
        self.pending[op] = (shard, self.tick(), ("commit", f"q{shard}", group, hwm))
        head = self.nodes[self.chains[shard][0]]
        items = (("", None, group, hwm),)
        self.world.send(
            CLIENT, head.id, head.on_produce, shard, op, 0, items, "", 0, self.on_produced
        )
        self.world.at(self.config.client_timeout_ms, self.on_committed, op, "unknown", 0, 0)

    def on_committed(self, op: int, status: str, _first: int, _last: int) -> None:
        entry = self.pending.pop(op, None)
        if entry is None:
            return
        shard, invoked, (_, queue, group, hwm) = entry
        outcome: Outcome = "ok" if status == "ok" else "unknown"
        at_s = self.world.now / 1000
        self.events.append(Commit(op, queue, group, hwm, outcome, invoked, self.tick(), at_s))
        self.world.at(
            self.world.rng.uniform(*self.config.consume_gap_ms), self.consume, shard, group
        )

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
            self.commit(shard, group, boundary)
        else:
            self.world.at(again, self.consume, shard, group)
