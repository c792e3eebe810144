"""The leader's driver (docs/manager.md, "The driver loop"): while this member leads, poll every
node, watch every node, log what was seen, carry out what ``decide`` asked. The choosing is pure
and lives in ``kayos.manager.member.plan`` and ``evidence``; this is the thin asyncio part: it
asks, logs, sends, and sleeps until the next round. Proof that a node is gone (from the watches,
``kayos.manager.member.watch``, or a supervisor's report) is logged at once, beside the rounds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from kayos import limits
from kayos.errors import KayosError
from kayos.identity import ClusterIdentity
from kayos.manager import (
    Action,
    Alert,
    ClearAlert,
    Event,
    ManagerLeaderChanged,
    ManagerView,
    NodeGone,
    PublishTopology,
)
from kayos.manager.member.codec import action_to_data
from kayos.manager.member.evidence import Evidence
from kayos.manager.member.holds import (
    counted_grants,
    hold_ms,
    record_incarnation_grants,
    shard_heads,
)
from kayos.manager.member.plan import (
    Answer,
    CatchUpOrder,
    FollowersNote,
    Memory,
    lease_grants,
    node_addresses,
    plan_round,
    sends_for,
    signed,
    topology_of,
)
from kayos.manager.member.watch import Watches
from kayos.topology import NodeAddr, Topology

log = logging.getLogger("kayos.manager.driver")


Poster = Callable[[str, Any], Awaitable[Any]]
Getter = Callable[[str], Awaitable[Any]]
Submit = Callable[[list[Event]], Awaitable[tuple[ManagerView, tuple[Action, ...]]]]


@dataclass(slots=True)
class Driver:
    """Runs while this member leads. ``get(url)`` / ``post(url, body)`` do the HTTP (raising a
    Kayos error on failure); ``submit(events)`` logs an entry and returns the view after it and
    the actions; ``view()`` is the member's current view; ``clock_ms`` the leader's monotonic
    clock."""

    identity: ClusterIdentity
    nodes: Mapping[str, NodeAddr]
    get: Getter
    post: Poster
    submit: Submit
    view: Callable[[], ManagerView]
    clock_ms: Callable[[], int]
    memory: Memory = field(default_factory=Memory)
    rounds: int = 0
    # The topology file: what the view does not hold (each queue's shard count) comes from it.
    base: Topology | None = None
    # The member's chain change records (``ManagerLog.changes``); None: no write-hold releases
    # are sent, so a new head holds writes the whole ``head_lease_ms``.
    changes: Callable[[], tuple[list[dict[str, Any]], int]] | None = None
    # Write holds (kayos/manager/member/holds.py): when this member began to lead, the epoch and
    # heads it began at, the heads last seen (and the epoch they were seen at), grant times per
    # node incarnation, and per shard the head still to be told.
    elected_ms: int = 0
    start: tuple[int, dict[int, str]] = (0, {})
    heads: dict[int, str] = field(default_factory=dict)
    heads_epoch: int = 0
    grant_times: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    releases: dict[int, tuple[str, int]] = field(default_factory=dict)
    # Releases answered within the last ``head_lease_ms`` (shard -> head, epoch, when): sent again
    # when a lease is later proven over (a supervisor's exit report after the refused probe).
    released: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    releasing: dict[int, asyncio.Lock] = field(default_factory=dict)
    # Lease grants on their way, one per node at most (``_grant``).
    granting: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # Status polls on their way, one per node at most (``_collect``), and the last answers.
    polling: dict[str, asyncio.Task[Answer]] = field(default_factory=dict)
    poll_sent: dict[str, int] = field(default_factory=dict)
    last_answers: dict[str, Answer] = field(default_factory=dict)
    # Sends (topology, catch-up orders) a round or a proof stopped waiting for (``_send_all``).
    sending: set[asyncio.Task[None]] = field(default_factory=set)
    # What the watches and probes proved (kayos/manager/member/evidence.py), and the watches.
    evidence: Evidence = field(default_factory=Evidence)
    watches: Watches | None = None

    async def lead(self, is_leader: Callable[[], bool]) -> None:
        """Logs ManagerLeaderChanged, re-sends everything, watches every node, then polls until
        leadership is lost."""
        self.elected_ms = self.clock_ms()
        view, actions = await self.submit([ManagerLeaderChanged(self.clock_ms())])
        self.heads = {s.id: s.chain[0] for s in view.shards}
        self.heads_epoch = view.epoch
        self.start = (view.epoch, dict(self.heads))
        log.info("became leader at epoch %d: logged ManagerLeaderChanged", view.epoch)
        self.memory = Memory()
        self.evidence = Evidence()
        self.watches = Watches(
            self.evidence,
            lambda: node_addresses(self.view(), self.nodes),
            self.view,
            self.clock_ms,
            self.log_gone,
            self.identity,
        )
        try:
            self.watches.sync()
            await self.carry_out(view, actions)
            while is_leader():
                started = self.clock_ms()
                await self.round()
                spent = self.clock_ms() - started
                await asyncio.sleep(max(0, limits.manager_poll_interval_ms - spent) / 1000)
        finally:
            for task in [*self.granting.values(), *self.polling.values(), *self.sending]:
                task.cancel()
            await self.watches.close()

    async def round(self) -> None:
        view = self.view()
        addresses = node_addresses(view, self.nodes)
        ids = [n.id for n in view.nodes if n.id in addresses]
        if self.watches is not None:
            self.watches.sync()
        by_node = await self._collect(ids)
        for node, answer in by_node.items():
            incarnation = answer.status.get("incarnation") if answer.status is not None else None
            if isinstance(incarnation, str):
                self.evidence.heard(node, incarnation)
        beats = self.evidence.take_beats()
        if self.evidence.take_ended():
            self._again_released()
        plan = plan_round(
            view, by_node, self.clock_ms(), self.memory, beats, self.evidence.incarnations
        )
        self.memory = plan.memory
        self.rounds += 1
        after, actions = await self.submit(plan.events)
        sends = sends_for(after, actions)
        topology_to = sorted(set(plan.send_topology) | set(sends.topology_to))
        grants = lease_grants(after, by_node)
        granted = [
            (n, _incarnation(by_node[n]), b["epoch"], by_node[n].at_ms)
            for n, b in grants
            if b["member"]
        ]
        self.grant_times = record_incarnation_grants(self.grant_times, granted, self.clock_ms())
        self.last_answers = {n: a for n, a in by_node.items() if a.status is not None}
        self._note_heads(after)
        self._grant(grants)
        await self.carry_out(after, actions, topology_to, [*plan.send_catch_up, *sends.catch_ups])
        await asyncio.gather(
            *(self._send_followers(note) for note in plan.send_followers),
            *(self._release(after, shard, by_node) for shard in sorted(self.releases)),
        )

    async def _collect(self, ids: list[str]) -> dict[str, Answer]:
        """Every node's answer that arrived by now or within the round's wait (half a poll
        interval): a poll is sent to each node with none on its way, and one that takes longer
        counts in the round it arrives in (a frozen node does not slow the rounds)."""
        for node in ids:
            if node not in self.polling:
                self.polling[node] = asyncio.create_task(self._ask(node))
                self.poll_sent[node] = self.clock_ms()
        waiting = [self.polling[node] for node in ids]
        await asyncio.wait(waiting, timeout=limits.manager_poll_interval_ms / 2000)
        answers: dict[str, Answer] = {}
        now = self.clock_ms()
        for node in ids:
            task = self.polling[node]
            if task.done():
                del self.polling[node]
                answers[node] = task.result()
            else:
                answers[node] = Answer(None, now, now - self.poll_sent.get(node, now))
        return answers

    def _note_heads(self, after: ManagerView) -> None:
        """A shard whose head changed since the heads last seen gets a write-hold release for
        its new head. Views come from entries logged concurrently (rounds, proofs of death):
        one older than the heads last seen changes nothing."""
        if after.epoch < self.heads_epoch:
            return
        for shard in after.shards:
            if self.heads.get(shard.id, shard.chain[0]) != shard.chain[0]:
                self.releases[shard.id] = (shard.chain[0], after.epoch)
        self.heads = {s.id: s.chain[0] for s in after.shards}
        self.heads_epoch = after.epoch

    async def log_gone(self, event: NodeGone) -> None:
        """Proof that a node is gone (a watch's probe, a goodbye, a supervisor's report): logged
        as an entry of its own at once, then its actions carried out (the new topology to every
        live node), then each new head told its write hold (0 for a head whose lease is proven over:
        a goodbye, an exit report), and the holds told lately told again if its lease is."""
        after, actions = await self.submit([event])
        log.info("logged %s: epoch %d", event, after.epoch)
        self._note_heads(after)
        if self.evidence.take_ended():
            self._again_released()
        await self.carry_out(after, actions)
        await asyncio.gather(
            *(self._release(after, shard, self.last_answers) for shard in sorted(self.releases))
        )

    def _again_released(self) -> None:
        """A lease was proven over: every write hold told within the last ``head_lease_ms`` is
        told again (it can only be shortened: 0 once every head it waited for is gone)."""
        now = self.clock_ms()
        self.released = {
            shard: told
            for shard, told in self.released.items()
            if now - told[2] < limits.head_lease_ms
        }
        for shard, (node, epoch, _) in self.released.items():
            self.releases.setdefault(shard, (node, epoch))

    def suspect(self, node: str) -> bool:
        """A report that ``node``'s connection was reset or refused: probe it (rate limited);
        whether a probe was started."""
        return self.watches is not None and self.watches.probe(node)

    async def exited(self, node: str, incarnation: str) -> ManagerView:
        """A supervisor's report that ``node``'s process ``incarnation`` exited: logged as
        ``NodeGone`` unless the leader heard that process replaced (stale: nothing logged)."""
        event = self.evidence.proof(node, "exited", self.clock_ms(), incarnation)
        if event is None:
            log.info("%s: exit report of incarnation %s is stale", node, incarnation)
            return self.view()
        await self.log_gone(event)
        return self.view()

    def _grant(self, grants: list[tuple[str, Any]]) -> None:
        """Sends the lease grants without the round waiting on them: a paused node answers only
        when it runs again, and waiting made every round as slow as it (the slow-node bench's
        removal took 0.5 s longer). At most one grant per node is in flight; one skipped while
        the last is still on its way only lets that node's lease end sooner."""
        for node, body in grants:
            if node in self.granting:
                continue
            message = signed(self.identity, "lease", body)
            task = asyncio.create_task(self._send(node, "/v1/admin/lease", message))
            self.granting[node] = task
            task.add_done_callback(functools.partial(self._granted, node))

    def _granted(self, node: str, task: asyncio.Task[None]) -> None:
        if self.granting.get(node) is task:
            del self.granting[node]

    async def _release(self, view: ManagerView, shard: int, answers: Mapping[str, Answer]) -> None:
        """Tells the shard's new head how long it must still hold writes (``holds.hold_ms``),
        once it holds the change; until then, each round again (it holds the whole
        ``head_lease_ms`` meanwhile, so a lost message costs time, never safety). One at a time
        per shard: a round and a proof of death may both want to send it, and the second goes
        (if still needed) once the first is answered."""
        async with self.releasing.setdefault(shard, asyncio.Lock()):
            if shard in self.releases:
                await self._release_once(view, shard, answers)

    async def _release_once(
        self, view: ManagerView, shard: int, answers: Mapping[str, Answer]
    ) -> None:
        node, epoch = self.releases[shard]
        if view.epoch < epoch:
            return  # a view older than the change (an entry logged beside it): the next round
        shard_view = view.shard(shard)
        if self.changes is None or shard_view is None or shard_view.chain[0] != node:
            self.releases.pop(shard, None)  # headed by another node now: a newer release
            return
        records, _ = self.changes()
        heads = shard_heads(shard, self.start, records, epoch)
        grants = counted_grants(self.grant_times, self.evidence.dead)
        left = hold_ms(
            node, heads, grants, self.elected_ms, self.clock_ms(), gone=self.evidence.gone
        )
        body = {"epoch": epoch, "shard": shard, "hold_ms": math.ceil(left)}
        status = answers[node].status if node in answers else None
        address = node_addresses(view, self.nodes).get(node)
        if status is None or address is None:
            return  # silent this round (a request would wait its whole bound): the next one
        seen = status.get("epoch")
        adopted = type(seen) is int and seen >= epoch
        try:
            reply = await self.post(
                f"{address.http_url}/v1/admin/write-hold", signed(self.identity, "write-hold", body)
            )
        except KayosError as exc:
            log.info("sending the write hold of shard %s to %s failed: %s", shard, node, exc)
            return
        log.info("write hold of shard %s at %s: %s, answered %s", shard, node, body, reply)
        held = reply.get("held_ms") if isinstance(reply, dict) else None
        if (held is not None or adopted) and self.releases.get(shard) == (node, epoch):
            del self.releases[shard]
            self.released[shard] = (node, epoch, self.clock_ms())

    async def _send_followers(self, note: FollowersNote) -> None:
        body = {"epoch": note.epoch, "shard": note.shard, "followers": list(note.followers)}
        log.info("telling %s the catch-up list of shard %s: %s", note.node, note.shard, body)
        await self._send(note.node, "/v1/admin/followers", signed(self.identity, "followers", body))

    async def _ask(self, node: str) -> Answer:
        started = self.clock_ms()
        try:
            address = node_addresses(self.view(), self.nodes)[node]
            status = await self.get(f"{address.http_url}/v1/status")
        except KayosError:
            status = None
        now = self.clock_ms()
        ok = status if isinstance(status, dict) else None
        return Answer(ok, now, now - started)

    async def carry_out(
        self,
        view: ManagerView,
        actions: tuple[Action, ...] | list[Action],
        topology_to: list[str] | None = None,
        catch_ups: list[CatchUpOrder] | None = None,
    ) -> None:
        for action in actions:
            if isinstance(action, Alert | ClearAlert):
                log.warning("%s", action_to_data(action))
            elif not isinstance(action, PublishTopology):
                log.info("%s", action_to_data(action))
        if topology_to is None or catch_ups is None:
            sends = sends_for(view, actions)
            topology_to, catch_ups = sends.topology_to, sends.catch_ups
        body = topology_of(view, self.nodes, self.base).to_json()
        message = signed(self.identity, "topology", body)
        jobs = [self._send(node, "/v1/admin/topology", message) for node in topology_to]
        for order in catch_ups:
            order_body = {"epoch": view.epoch, "shard": order.shard, "upstream": order.upstream}
            message = signed(self.identity, "catch-up", order_body)
            jobs.append(self._send(order.node, "/v1/admin/catch-up", message))
        await self._send_all(jobs)

    async def _send_all(self, jobs: list[Coroutine[Any, Any, None]]) -> None:
        """Waits for the sends at most half a poll interval; the rest go on in the background
        (cancelled when leadership ends). A paused node answers only when it runs again: a
        round that waited its whole request bound on it came round too late to renew the other
        nodes' leases (a healthy head's lease lapsed while a frozen one was spliced out)."""
        tasks = [asyncio.create_task(job) for job in jobs]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=limits.manager_poll_interval_ms / 2000)
        self.sending |= pending
        for task in pending:
            task.add_done_callback(self.sending.discard)

    async def _send(self, node: str, path: str, message: dict[str, Any]) -> None:
        address = node_addresses(self.view(), self.nodes).get(node)
        if address is None:
            return
        try:
            await self.post(f"{address.http_url}{path}", message)
        except KayosError as exc:
            # The next rounds send it again (a node behind the view's epoch, a catch-up not
            # acted on): logged, not fatal.
            log.info("sending %s to %s failed: %s", path, node, exc)


def _incarnation(answer: Answer) -> str:
    """The incarnation an answer names ("" from a node that names none)."""
    found = answer.status.get("incarnation") if answer.status is not None else None
    return found if isinstance(found, str) else ""
