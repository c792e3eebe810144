"""What the leader's watches and probes prove (docs/manager.md, "Evidence and proof of death"),
pure: the lines of a watch, the incarnations heard, the probes' rate limit, which outcome is
proof that a node's process is gone (a refusal, a goodbye, an exit report), and which proof also
ends its lease (a goodbye, an exit report, a successor heard; never a refusal, which a firewall
gives a live node too). ``kayos.manager.member.watch`` does the I/O; times come in as arguments.

The memory is the leader's own (lost on a leader change: a new leader opens its watches again and
counts older leaders' grants by its election, docs/manager.md "The new head's write hold").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.manager import ManagerView, NodeGone, check_incarnation

__all__ = ["Evidence", "Line", "Outcome", "parse_line", "tick_incarnations"]


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a node's watch: its incarnation, and whether it is the goodbye of a clean
    stop."""

    incarnation: str
    bye: bool = False


def parse_line(raw: bytes) -> Line | None:
    """A watch line (``{"incarnation", "beat"}`` or ``{"bye": true, "incarnation"}``), or None
    for anything else (a node that answers something else is no proof of anything)."""
    try:
        data = json.loads(raw)
        incarnation = check_incarnation(data["incarnation"])
    except (ValueError, TypeError, KeyError, InvalidRequest):
        return None
    return Line(incarnation, data.get("bye") is True)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a connection to a node's watch went: ``refused`` (nothing listens on its port),
    ``line`` (it answered; ``line`` is the first), ``silent`` (no answer within the bound, or an
    answer that is no watch), ``ended`` (a stream that had answered ended or was reset)."""

    kind: Literal["refused", "line", "silent", "ended"]
    line: Line | None = None


# Proof that ends a process's lease too: its own goodbye (it ended its lease first) and its
# supervisor's report of its exit. A refused probe splices the node out but ends no lease: a
# firewall rejecting connections refuses a live node exactly as a dead one (docs/manager.md).
LEASE_ENDING_CAUSES = ("stopped", "exited")


@dataclass(slots=True)
class Evidence:
    """The leader's memory of the nodes' processes: the incarnation last heard from each, the
    incarnations whose lease is proven over (``dead``, with the node: gone by a goodbye, an exit
    report or a successor heard), the nodes whose last heard incarnation is so (``gone``, until a
    new one is heard), when each node was last probed, the watch beats heard since the last
    round, and whether a lease was proven over since ``take_ended`` was last asked (the write
    holds told since may be shortened again)."""

    incarnations: dict[str, str] = field(default_factory=dict)
    dead: set[tuple[str, str]] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    probed_ms: dict[str, int] = field(default_factory=dict)
    beats: dict[str, int] = field(default_factory=dict)
    ended: bool = False

    def take_ended(self) -> bool:
        """Whether a lease was proven over since the last call."""
        ended, self.ended = self.ended, False
        return ended

    def heard(self, node: str, incarnation: str) -> bool:
        """The node answered under ``incarnation`` ("" from a node that names none). A new one
        proves the one heard before gone (a restart): returns True then."""
        known = self.incarnations.get(node)
        if not incarnation or incarnation == known:
            return False
        self.incarnations[node] = incarnation
        self.gone.discard(node)
        if known:
            self.dead.add((node, known))
            self.ended = True
            return True
        return False

    def beat(self, node: str, incarnation: str, at_ms: int) -> bool:
        """A watch line at ``at_ms``: the node is heard (``heard``'s answer)."""
        self.beats[node] = max(at_ms, self.beats.get(node, at_ms))
        return self.heard(node, incarnation)

    def take_beats(self) -> dict[str, int]:
        """The beats heard since the last call, (node -> time of its last one)."""
        beats, self.beats = self.beats, {}
        return beats

    def may_probe(self, node: str, now_ms: int) -> bool:
        """Whether ``node`` may be probed now (at most once per
        ``limits.manager_probe_interval_ms_min``); if so, the probe is counted as made."""
        last = self.probed_ms.get(node)
        if last is not None and now_ms - last < limits.manager_probe_interval_ms_min:
            return False
        self.probed_ms[node] = now_ms
        return True

    def proof(self, node: str, cause: str, now_ms: int, incarnation: str = "") -> NodeGone | None:
        """The ``NodeGone`` to log for proof of ``cause`` (``refused``: the leader's own probe
        found nothing listening, about whatever process answered before; ``stopped``,
        ``exited``: about the process ``incarnation``), or None when the proof is about a process
        the leader has since heard replaced (stale: the node runs another one now). A goodbye or
        an exit report also ends the process's lease (``dead``, ``gone``); a refusal does not."""
        known = self.incarnations.get(node, "")
        name = known if cause == "refused" else incarnation
        ends_lease = cause in LEASE_ENDING_CAUSES
        if name and known and name != known:
            if ends_lease:
                self.dead.add((node, name))
            return None
        if ends_lease:
            if name:
                self.dead.add((node, name))
            self.gone.add(node)
            self.ended = True
        return NodeGone(node, now_ms, cause, name)


def tick_incarnations(
    view: ManagerView, heard: Mapping[str, int], incarnations: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """(node, incarnation) for each node heard this round whose incarnation, as the leader last
    heard it, differs from the view's: what the round's tick carries into the view."""
    held = {n.id: n.incarnation for n in view.nodes}
    return tuple(
        (node, incarnations[node])
        for node in sorted(heard)
        if node in held and incarnations.get(node) and incarnations[node] != held[node]
    )
