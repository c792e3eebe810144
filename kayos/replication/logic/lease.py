"""A node's read lease from the cluster manager: pure decisions and a thin holder.

A head serves a confirmation (docs/replication-protocol.md, "Confirming a snapshot") only while
its node holds a lease. The leader polls every node (``GET /v1/status``), which hands out a
nonce; once the leader has *committed* the round's Raft entry, it tells the node the nonce back
with the view's epoch and whether the node is still a chain member (``POST /v1/admin/lease``).
Such an answer extends the lease to the local time the nonce was handed out plus
``limits.head_lease_ms``, but only if its epoch is one the node holds (a later epoch may have
spliced the node out and back in: such an answer extends nothing), and an answer saying the
node is in no chain ends the lease at once. An answer at an epoch the node has not adopted yet
is kept (the newest few) and counts once the node adopts that epoch or a later one: the same
lease the answer would have given had it arrived just after the topology, which it may as well
have (the two travel on separate requests). The argument is in docs/manager.md,
"Head leases". Without a manager (static chains) the lease always holds: nothing can splice the
chain.

``decide(state, event) -> (state, notes)`` reads no clock: times come inside events, so
transcript tests drive it with plain numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kayos import limits
from kayos.clock import Clock, SystemClock
from kayos.topology import Topology

__all__ = [
    "Asked",
    "Ended",
    "EpochAdopted",
    "Granted",
    "LeaseEvent",
    "LeaseState",
    "NodeLease",
    "WriteHold",
    "adopt_holds",
    "boot_holds",
    "decide",
    "holds",
    "lease_won",
    "release",
    "unconfirmed",
    "write_holds",
]


@dataclass(frozen=True, slots=True)
class LeaseState:
    """``managed``: a manager can splice this node's chains (else the lease always holds);
    ``epoch``: the topology epoch the node holds; ``until_s``: the lease's end on the node's
    monotonic clock (None: no lease); ``asks``: nonces handed out, oldest first, with their
    times; ``nonce``: the last nonce handed out; ``ended``: the node is stopping, and holds no
    lease from then on, whatever the manager answers; ``early``: answers at epochs above
    ``epoch`` as (epoch, lease end), oldest first, kept until the node adopts their epoch."""

    managed: bool
    epoch: int
    until_s: float | None = None
    asks: tuple[tuple[int, float], ...] = ()
    nonce: int = 0
    ended: bool = False
    early: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Asked:
    """The node answers a status poll at ``at_s``: it hands out a nonce."""

    at_s: float


@dataclass(frozen=True, slots=True)
class Granted:
    """The leader's committed answer to the poll that got ``nonce``: the view's ``epoch`` and
    whether the node is still a member of some chain there."""

    nonce: int
    epoch: int
    member: bool


@dataclass(frozen=True, slots=True)
class EpochAdopted:
    """The node now holds topology ``epoch``."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Ended:
    """The node begins a clean stop: its lease ends for good, before it says goodbye to the
    manager's watch (docs/manager.md, "Evidence and proof of death")."""


LeaseEvent = Asked | Granted | EpochAdopted | Ended


def decide(state: LeaseState, event: LeaseEvent) -> tuple[LeaseState, tuple[str, ...]]:
    """The lease after ``event``, and notes for the log (a lease lost or refused)."""
    if isinstance(event, Asked):
        newest = state.asks[-1] if state.asks else None
        if newest is not None and event.at_s - newest[1] < limits.lease_nonce_interval_ms / 1000:
            return state, ()  # the newest nonce is reused: it starts earlier, never later
        nonce = state.nonce + 1
        asks = (*state.asks, (nonce, event.at_s))[-limits.lease_nonces_max :]
        return dataclasses.replace(state, asks=asks, nonce=nonce), ()
    if isinstance(event, EpochAdopted):
        return _adopted(state, event.epoch), ()
    if isinstance(event, Ended):
        notes = ("lease ended: the node is stopping",) if state.until_s is not None else ()
        return dataclasses.replace(state, until_s=None, asks=(), ended=True, early=()), notes
    if state.ended:
        return state, ()  # a stopping node takes no grant
    sent = next((at for nonce, at in state.asks if nonce == event.nonce), None)
    if sent is None:
        return state, ()  # a nonce never handed out, or one too old to be remembered
    later = tuple(ask for ask in state.asks if ask[0] > event.nonce)
    if not event.member:
        why = f"the manager's view at epoch {event.epoch} has this node in no chain"
        notes = (f"lease ended: {why}",) if state.until_s is not None else ()
        return dataclasses.replace(state, until_s=None, asks=later, early=()), notes
    until = sent + limits.head_lease_ms / 1000
    if event.epoch > state.epoch:
        # A member at an epoch this node has not adopted yet (its topology is on its way): the
        # node may have left a chain and come back in between, so this answer extends nothing
        # now; it is kept, and counts once the node holds that epoch (``_adopted``). Until then
        # the lease held ends on time (a new head of its shards holds writes until then).
        early = (*state.early, (event.epoch, until))[-limits.lease_early_grants_max :]
        return dataclasses.replace(state, asks=later, early=early), ()
    if state.until_s is not None:
        until = max(until, state.until_s)
    return dataclasses.replace(state, until_s=until, asks=later), ()


def _adopted(state: LeaseState, epoch: int) -> LeaseState:
    """The node holds topology ``epoch`` (or a later one it already held): the answers kept for
    epochs up to it extend the lease as if they arrived now."""
    epoch = max(state.epoch, epoch)
    due = [until for at, until in state.early if at <= epoch]
    if not due or state.ended:
        return dataclasses.replace(state, epoch=epoch)
    until = max([*due, *([state.until_s] if state.until_s is not None else [])])
    early = tuple((at, u) for at, u in state.early if at > epoch)
    return dataclasses.replace(state, epoch=epoch, until_s=until, early=early)


def holds(state: LeaseState, now_s: float) -> bool:
    """Whether the node holds a lease at ``now_s``."""
    if not state.managed:
        return True
    return not state.ended and state.until_s is not None and now_s < state.until_s


def _nothing() -> None:
    return None


class NodeLease:
    """The node's lease state and clock: the thin driver the HTTP face and replicas call."""

    def __init__(self, *, managed: bool, epoch: int, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.state = LeaseState(managed, epoch)
        self.notes: list[str] = []  # the last few, for the log and status
        # Called whenever an answer leaves the lease held (the node ends its restart's holds).
        self.on_held: Callable[[], None] = _nothing

    def _apply(self, event: LeaseEvent) -> None:
        self.state, notes = decide(self.state, event)
        if notes:
            self.notes = [*self.notes, *notes][-8:]

    def ask(self) -> int:
        """A nonce for a status answer (the manager's poll)."""
        self._apply(Asked(self.clock.monotonic_s()))
        return self.state.nonce

    def granted(self, nonce: int, epoch: int, member: bool) -> bool:
        """The leader's answer; whether the lease holds after it."""
        self._apply(Granted(nonce, epoch, member))
        held = self.holds()
        if held:
            self.on_held()
        return held

    def adopted(self, epoch: int) -> None:
        self._apply(EpochAdopted(epoch))

    def end(self) -> None:
        """The node is stopping: no lease from now on (``Ended``)."""
        self._apply(Ended())

    def holds(self) -> bool:
        return holds(self.state, self.clock.monotonic_s())

    def remaining_ms(self) -> int | None:
        """Milliseconds of lease left (None: no manager, it always holds)."""
        if not self.state.managed:
            return None
        if self.state.until_s is None:
            return 0
        return max(0, round((self.state.until_s - self.clock.monotonic_s()) * 1000))


def unconfirmed(shard: int, node: str, upstream: str | None) -> str:
    """The ``unavailable`` message of a snapshot refused because the chain did not confirm."""
    if upstream is None:
        return (
            f"shard {shard} on {node}: this head holds no lease from the cluster manager (no"
            f" committed answer from its leader at an epoch the node holds within"
            f" {limits.head_lease_ms} ms; it may have been spliced out); retry at the shard's"
            " current tail"
        )
    return (
        f"shard {shard} on {node}: its upstream {upstream} did not confirm the chain up to a head"
        " holding its lease from the manager (the chain may have changed, or part of it is cut"
        " off); retry at the shard's current tail"
    )


def write_holds(node: str, old: Topology, new: Topology) -> frozenset[int]:
    """Shards ``node`` heads in ``new`` whose head was another node in ``old`` (or whose chain
    that skipped epochs: another head may have come and gone in between, even if the chain
    looks the same again). Such a head takes no write
    until what may be left of the old head's lease has passed (``WriteHold``): at most
    ``limits.head_lease_ms``, less once the manager leader says so (``release``). A shard whose
    head stays takes no hold: the member just above a removed one cuts every CONFIRM path through
    it when it adopts the change, before the new chain can commit anything without it
    (docs/manager.md, "Head leases")."""
    held: set[int] = set()
    skipped = new.epoch > old.epoch + 1
    for shard_id, shard in new.shards.items():
        if shard.head != node:
            continue
        before = old.shards.get(shard_id)
        if before is None:
            continue  # a shard new to the topology: nothing was committed before it
        if before.head != node or skipped:
            held.add(shard_id)
    return frozenset(held)


@dataclass(frozen=True, slots=True)
class WriteHold:
    """A head's write hold on one shard: started on adopting topology ``epoch`` (the head
    changed), no write before ``until_s`` (monotonic s); ``told``: the manager leader's word
    (``release``) has shortened it to what may be left of the old heads' leases."""

    epoch: int
    until_s: float
    told: bool = False


def adopt_holds(
    node: str, old: Topology, new: Topology, holds: Mapping[int, WriteHold], now_s: float
) -> dict[int, WriteHold]:
    """The holds after ``node`` adopts ``new`` at ``now_s``: a full ``head_lease_ms`` for each
    shard of ``write_holds``; a shard the node no longer heads drops its hold; the others keep
    theirs (a hold set at an earlier epoch still runs)."""
    kept = {
        shard: hold
        for shard, hold in holds.items()
        if shard in new.shards and new.shards[shard].head == node
    }
    for shard in write_holds(node, old, new):
        kept[shard] = WriteHold(new.epoch, now_s + limits.head_lease_ms / 1000)
    return kept


def boot_holds(node: str, topology: Topology) -> dict[int, WriteHold]:
    """A managed node at start: a hold with no end on every shard it heads in the topology it
    starts with, until it holds its lease (``lease_won``). That topology may be stale: while
    the node was away the manager may have made another member the chain, or found this node's
    store lost and given the shard to the member holding its history (docs/manager.md rule 3);
    a lease proves the manager has seen this node back at an epoch it holds (an answer at a
    later epoch counts only once the node adopts it, and then it heads that epoch's chains)."""
    return {
        shard_id: WriteHold(topology.epoch, math.inf)
        for shard_id, shard in topology.shards.items()
        if shard.head == node
    }


def lease_won(holds: Mapping[int, WriteHold]) -> dict[int, WriteHold]:
    """The node holds its lease: the holds set at start are gone (a status shows none, as for
    a head that never changed); those of head changes run on (an old head's lease may still
    run)."""
    return {shard: hold for shard, hold in holds.items() if not math.isinf(hold.until_s)}


def release(
    holds: Mapping[int, WriteHold], shard: int, epoch: int, hold_ms: int, now_s: float
) -> dict[int, WriteHold]:
    """The manager leader's word (``POST /v1/admin/write-hold``): in its view at ``epoch`` this
    node heads ``shard``, and no lease of an earlier head of it lasts past ``hold_ms`` from when
    the leader said so, which is before ``now_s``. It shortens a hold started at an epoch at or
    below ``epoch``; a hold started later (a newer head change the leader had not seen) stays."""
    hold = holds.get(shard)
    if hold is None or hold.epoch > epoch:
        return dict(holds)
    until = min(hold.until_s, now_s + hold_ms / 1000)
    return {**holds, shard: WriteHold(hold.epoch, until, told=True)}
