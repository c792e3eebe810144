"""Head leases and CONFIRM chains in the simulator (docs/manager.md, "Head leases";
docs/replication-protocol.md, "Confirming a snapshot").

The model follows the real rules on the simulated clock: a node hands out a nonce with each
heartbeat; the manager answers it after its next tick has applied that heartbeat (the sim's
"committed round") with each shard's epoch and whether the node is a member; an answer at an
epoch the replica holds extends its lease to the nonce's time plus ``lease_ms``, one at a later
epoch is kept and counts once the replica adopts that epoch, one saying it is no member ends it.
A head that takes a shard over from another node takes no write for
``lease_ms``, or for what the manager says is left of the old heads' leases (``Holds``).
A snapshot below the head is served only once a CONFIRM travelled up, link by link, to a head
whose lease holds, and the answer came back.

The sim keeps one lease per shard replica (its chain messages carry per-shard epochs, where the
real topology is one epoch for all shards): the same argument, shard by shard.

The plant ``no_lease`` turns it off (the tail serves from its own state at once, as before), so
the simulator can show what the lease prevents.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from chaos.sim.core import Link
from chaos.sim.evidence import Proofs, hold_after_proof

# chaos/sim/node.py and chaos/sim/replica.py import this module: their Node and Replica are not
# imported back (no cycle).
Node = Any
Replica = Any

# Nonces a node remembers, and CONFIRMs a replica waits on at once (both bounded).
NONCES_MAX = 64
CONFIRMS_MAX = 64
# Lease answers at epochs a replica has not adopted yet that it keeps
# (limits.lease_early_grants_max).
EARLY_MAX = 4

Done = Callable[[bool], None]


class Lease:
    """A node's nonces (volatile: a crash forgets them) and the lease length."""

    def __init__(self, lease_ms: float) -> None:
        self.lease_ms = lease_ms
        self.nonce = 0
        self.asks: dict[int, float] = {}

    def ask(self, now: float) -> int:
        self.nonce += 1
        self.asks[self.nonce] = now
        while len(self.asks) > NONCES_MAX:
            del self.asks[min(self.asks)]
        return self.nonce


def off(node: Node) -> bool:
    return bool(node.plant == "no_lease")


def granted(node: Node, nonce: int, grants: tuple[tuple[int, bool], ...]) -> None:
    """The manager's answer to the heartbeat that carried ``nonce``: per shard (epoch, member)."""
    at = node.lease.asks.get(nonce)
    if at is None:
        return
    node.lease.asks = {n: t for n, t in node.lease.asks.items() if n > nonce}
    for replica, (epoch, member) in zip(node.replicas, grants, strict=True):
        until = at + node.lease.lease_ms
        if not member:
            replica.lease_until = -math.inf
            replica.early_grants = []
        elif epoch <= replica.store.epoch:
            replica.lease_until = max(replica.lease_until, until)
        else:
            # Kept until the replica adopts ``epoch`` (``adopted``): the lease the answer gives
            # had it come just after the topology.
            replica.early_grants = [*replica.early_grants, (epoch, until)][-EARLY_MAX:]


def adopted(replica: Replica) -> None:
    """``replica`` now holds its store's epoch: the answers kept for epochs up to it count."""
    epoch = replica.store.epoch
    for at, until in replica.early_grants:
        if at <= epoch:
            replica.lease_until = max(replica.lease_until, until)
    replica.early_grants = [(at, u) for at, u in replica.early_grants if at > epoch]


def hold_writes(replica: Replica, members: tuple[str, ...], epoch: int) -> None:
    """Before ``replica`` adopts ``members`` at ``epoch``: a head that took the shard over from
    another node (or skipped epochs of a changed chain) holds writes ``lease_ms``, keyed by
    ``epoch``, until the manager says less (``released``). A head that stays head holds
    nothing; a replica that stops heading drops its hold."""
    node = replica.node
    if off(node) or not members or members[0] != node.id:
        replica.writes_held_until, replica.hold_epoch = -math.inf, 0
        return
    before = replica.store.chain
    skipped = epoch > replica.store.epoch + 1
    if (before and before[0] != node.id) or (skipped and tuple(before) != members):
        replica.writes_held_until = node.world.now + node.lease.lease_ms
        replica.hold_epoch = epoch


def released(replica: Replica, epoch: int, hold_ms: float) -> None:
    """The manager's word: at shard epoch ``epoch`` this replica heads the shard and no earlier
    head's lease lasts past ``hold_ms`` from now. Shortens a hold started at or below
    ``epoch`` (kayos/replication/logic/lease.py, ``release``)."""
    if replica.hold_epoch == 0 or replica.hold_epoch > epoch:
        return
    now = replica.node.world.now
    replica.writes_held_until = min(replica.writes_held_until, now + hold_ms)


class Holds:
    """The manager leader's memory for write holds (kayos/manager/member/holds.py): its election
    time, per (node, shard) the arrival time of the latest granted heartbeat at each shard epoch
    and the incarnation it answered, each shard's heads since it began to lead, and the releases
    still to deliver."""

    def __init__(self, now: float, heads: list[tuple[int, str]], lease_ms: float) -> None:
        self.lease_ms = lease_ms
        self.elected = now
        # shard, node, epoch: (at, incarnation)
        self.grants: dict[int, dict[str, dict[int, tuple[float, int]]]] = {}
        self.heads: list[list[tuple[int, str]]] = [[head] for head in heads]
        self.pending: dict[int, tuple[str, int]] = {}

    def granted(self, node: str, shard: int, epoch: int, at: float, incarnation: int) -> None:
        times = self.grants.setdefault(shard, {}).setdefault(node, {})
        if epoch not in times or at >= times[epoch][0]:
            times[epoch] = (at, incarnation)

    def spliced(self, shard: int, chain: tuple[str, ...], epoch: int) -> bool:
        """Records the shard's chain at ``epoch``; True if its head changed."""
        history = self.heads[shard]
        changed = bool(chain) and history[-1][1] != chain[0]
        history.append((epoch, chain[0] if chain else history[-1][1]))
        if changed:
            self.pending[shard] = (chain[0], epoch)
        return changed

    def hold_ms(
        self,
        shard: int,
        new_head: str,
        now: float,
        proven: Proofs,
        incarnations: dict[str, int],
    ) -> float:
        """What the leader tells the new head (``hold_after_proof``: a head proven dead holds no
        lease)."""
        heads: list[tuple[int, str | None]] = list(self.heads[shard])
        grants = self.grants.get(shard, {})
        return hold_after_proof(
            new_head, heads, grants, proven, incarnations, self.elected, now, self.lease_ms
        )


def writes_held(replica: Replica) -> bool:
    return bool(replica.node.world.now < replica.writes_held_until)


def confirm(replica: Replica, done: Done) -> None:
    """Calls ``done(held)`` once the chain above ``replica`` is confirmed up to a head holding
    its lease (or at once: a head answers from its lease, a member with no link says no). No
    answer at all when a message is lost with its link: the asker's own bound ends the wait."""
    node, p = replica.node, replica.progress
    if off(node):
        done(True)
        return
    if p is None:
        done(False)
        return
    if not p.has_upstream:
        done(node.world.now < replica.lease_until)
        return
    link = replica.up_link
    if link is None or not replica.linked:
        done(False)
        return
    replica.confirm_token += 1
    token = replica.confirm_token
    replica.confirming[token] = done
    while len(replica.confirming) > CONFIRMS_MAX:
        del replica.confirming[min(replica.confirming)]
    upstream = replica.peer(link.upstream)
    node.world.send_on(link, node.id, upstream.on_confirm, replica.shard, link, token)


def on_confirm(replica: Replica, link: Link, token: int) -> None:
    """A downstream's CONFIRM on ``link``: answered once the chain above confirms."""
    if replica.down.get(link.downstream) is not link:
        return  # not a current downstream link: no answer

    def answer(held: bool) -> None:
        downstream = replica.peer(link.downstream)
        replica.node.world.send_on(
            link, replica.node.id, downstream.on_confirmed, replica.shard, link, token, held
        )

    confirm(replica, answer)


def on_confirmed(replica: Replica, link: Link, token: int, held: bool) -> None:
    if link is not replica.up_link:
        return
    done = replica.confirming.pop(token, None)
    if done is not None:
        done(held)
