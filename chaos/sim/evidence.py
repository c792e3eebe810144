"""The manager leader's evidence about its nodes in the simulator (docs/manager.md, the manager's
evidence and proof of death; docs/testing.md, "The simulator"): its watch of each node, its own
probes, the reports of members and clients, and what a proof of death does.

- **The watch** is open on the incarnation the leader last heard from the node. A crash ends it
  at once (the kernel resets the connection; under a ``drop`` partition the reset is lost, and the
  watch is only silent), a ``reject`` partition between the leader and the node resets it within
  one beat; a pause or a ``drop`` partition leaves it silent, and only the detection window acts.
- **A probe** follows the end of a watch and every report (at most once per node per
  ``probe_interval_ms_min``): refused (a dead process, a ``reject`` partition) -> ``NodeGone``;
  no answer (paused, ``drop``) -> nothing; an answer with the incarnation last heard -> the watch
  is open again; with another -> the old incarnation is proven dead (a restart: nothing spliced).
- **Reports** (``POST /v1/manager/suspect``) from members and clients only make the leader probe.
- **What voids a lease.** A refusal is not proof that the process is dead: a firewall rule
  (``REJECT --reject-with tcp-reset``) refuses the leader's probe of a live node that clients may
  still reach, and that node, sole member or head, still serves snapshots under its lease (seed
  166: a mark committed by the new head, then an older one read at the old). So ``NodeGone``
  after a refused probe splices the node out at once, but its lease still counts for the new
  head's hold; only a new incarnation (the node itself answered: the old process is gone) voids
  the old incarnation's lease. The planted bug ``refused_skips_hold`` takes a refused probe as
  voiding the lease too (the first design's rule); ``trust_reported_refusal`` takes a member's
  or a client's reported refusal as proof at once, with no probe of its own, and skips the hold.

**Modelled here until the product has them** (the lead switches each to the product's own once
it is merged): ``node_gone`` is ``decide`` given ``NodeGone(node)``: an ``up``, ``suspect`` or
``slow`` node is made ``down`` at once through ``decide``'s own silence rule (so the splice that
follows is the product's rule 2); ``hold_after_proof`` is the leader's hold for a new head
(kayos/manager/member/holds.py) with the grants to an incarnation whose lease is void left out,
and 0 when every head it replaces has a void lease.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from chaos.sim.config import SimConfig
from chaos.sim.core import MANAGER, World
from kayos.manager import TimerTick, decide
from kayos.manager.events import Action
from kayos.manager.member import holds
from kayos.manager.view import ManagerView

# (node, incarnation) pairs.
Proofs = Collection[tuple[str, int]]
# Per node, per view epoch: (the leader's time of the granted answer, the incarnation granted).
GrantsByIncarnation = Mapping[str, Mapping[int, tuple[float, int]]]


def node_gone(view: ManagerView, node: str) -> tuple[ManagerView, list[Action]]:
    """``decide(view, NodeGone(node))`` as docs/manager.md gives it: a node that is ``up``,
    ``suspect`` or ``slow`` is ``down`` at once, and rule 2 splices it out; any other changes
    nothing. (The caller has checked the incarnation: a stale one is ignored.)"""
    state = view.node(node)
    if state is None or state.state not in ("up", "suspect", "slow"):
        return view, []
    silent = replace(state, last_heard_ms=view.now_ms - view.config.detection_window_ms)
    return decide(view.with_node(silent), TimerTick(view.now_ms, ()))


def hold_after_proof(
    new_head: str,
    heads: Sequence[tuple[int, str | None]],
    grants: GrantsByIncarnation,
    proven: Proofs,
    incarnations: Mapping[str, int],
    elected_ms: float,
    now_ms: float,
    lease_ms: float,
) -> float:
    """What is left of the earlier heads' leases for ``new_head`` (``holds.hold_ms``), where a
    head proven dead holds no lease: its grants count not, and when every head ``new_head``
    replaces is proven dead (its last heard incarnation), the hold is 0."""
    replaced = {
        before
        for (_, before), (_, after) in itertools.pairwise(heads)
        if before is not None and before not in (after, new_head)
    }
    if replaced and all((node, incarnations.get(node, -1)) in proven for node in replaced):
        return 0.0
    counted = {
        node: {epoch: at for epoch, (at, inc) in by_epoch.items() if (node, inc) not in proven}
        for node, by_epoch in grants.items()
    }
    return holds.hold_ms(new_head, heads, counted, elected_ms, now_ms, lease_ms)


class Evidence:
    """The leader's watches, probes and proofs. ``heard`` (each node's incarnation last heard)
    and ``proven`` (incarnations whose lease is void: proven dead) outlive a leader change, as
    the view and the log's entries do; watches and probe times do not."""

    def __init__(
        self,
        world: World,
        config: SimConfig,
        plant: str | None,
        gone: Callable[[str], bool],
    ) -> None:
        self.world = world
        self.config = config
        self.plant = plant
        self.gone = gone
        self.watching: dict[str, int] = {}
        self.heard: dict[str, int] = {}
        self.proven: set[tuple[str, int]] = set()
        self.probed_at: dict[str, float] = {}
        self.node_gone = 0  # NodeGone entries that made a node down (up in the view)
        self.node_gone_alive = 0  # of them, of a process in fact alive (a reject partition)
        world.on_crash.append(self.crashed)
        world.on_cut.append(self.cut)

    def heard_from(self, node: str, incarnation: int) -> None:
        """A heartbeat (a poll's answer) or a return: a new incarnation proves the old one dead;
        a node without a watch gets one (refused at once across a ``reject`` partition)."""
        before = self.heard.get(node)
        if before is not None and incarnation < before:
            return  # a message of a dead process, delayed (the sim's incarnations count up)
        if before is not None and before != incarnation:
            self.proven.add((node, before))
        # Heard again: a proof of this incarnation's death was false (a reject partition, or
        # the planted bug's trust in a report); it counted for the splice it caused, no later.
        self.proven.discard((node, incarnation))
        self.heard[node] = incarnation
        if self.watching.get(node) != incarnation:
            self.watching[node] = incarnation
            if self.world.refuses(MANAGER, node):
                self.ended(node, incarnation)

    def crashed(self, node: str) -> None:
        incarnation = self.watching.get(node)
        if incarnation is not None and self.world.cut_kind(MANAGER, node) != "drop":
            self.world.at(self.world.delay(), self.ended, node, incarnation)

    def cut(self, a: str, b: str, kind: str) -> None:
        node = b if a == MANAGER else a if b == MANAGER else None
        if node is None or kind != "reject" or node not in self.watching:
            return
        beat = self.world.rng.uniform(0, self.config.watch_beat_ms)
        self.world.at(beat + self.world.delay(), self.ended, node, self.watching[node])

    def ended(self, node: str, incarnation: int) -> None:
        """The watch on ``incarnation`` ended (EOF or reset): the leader probes at once."""
        if self.watching.get(node) != incarnation:
            return
        del self.watching[node]
        self.probe(node, at_once=True)

    def report(self, reporter: str, node: str, cause: str) -> None:
        """A member's or a client's report (``POST /v1/manager/suspect``)."""
        if node == reporter or node not in self.heard:
            return
        if self.plant == "trust_reported_refusal" and cause == "refused":
            self.gone_refused(node, self.heard[node], void_lease=True)
            return
        self.probe(node)

    def probe(self, node: str, *, at_once: bool = False) -> None:
        """Connects to the node itself: at once when its watch ended, else (a report) at most
        once per ``probe_interval_ms_min``."""
        since = self.world.now - self.probed_at.get(node, -math.inf)
        if not at_once and since < self.config.probe_interval_ms_min:
            return
        self.probed_at[node] = self.world.now
        self.world.at(self.world.delay(), self.probe_arrives, node)

    def probe_arrives(self, node: str) -> None:
        world = self.world
        if world.refuses(MANAGER, node):
            world.at(world.delay(), self.probe_refused, node)
            return
        endpoint = world.endpoints[node]
        if world.is_cut(MANAGER, node) or endpoint.paused:
            return  # no answer within probe_timeout_ms: nothing is proven
        incarnation = getattr(endpoint, "incarnation", 0)
        world.send(node, MANAGER, self.probe_answered, node, incarnation)

    def probe_refused(self, node: str) -> None:
        incarnation = self.heard.get(node)
        if incarnation is not None:
            self.gone_refused(node, incarnation, void_lease=self.plant == "refused_skips_hold")

    def probe_answered(self, node: str, incarnation: int) -> None:
        self.heard_from(node, incarnation)

    def gone_refused(self, node: str, incarnation: int, *, void_lease: bool) -> None:
        """``NodeGone(node, refused, incarnation)``: ignored unless it names the incarnation
        last heard. ``void_lease``: the incarnation's lease counts no more (only the plants)."""
        if self.heard.get(node) != incarnation:
            return
        if void_lease:
            self.proven.add((node, incarnation))
        if self.gone(node):
            self.node_gone += 1
            self.node_gone_alive += self.world.endpoints[node].reachable()

    def failover(self) -> None:
        """A new leader: no watches yet (each opens when it hears the node), no probe times."""
        self.watching = {}
        self.probed_at = {}
