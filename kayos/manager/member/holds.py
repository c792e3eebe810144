"""How long a new head must hold writes, as the manager leader knows it (docs/manager.md, "Head
leases", "The new head's write hold"). Pure: the driver keeps the memory and the clock.

A head that takes over a shard from another node holds writes for up to ``head_lease_ms`` after
adopting the change (kayos/replication/logic/lease.py, ``write_holds``): a lease the old head still
holds lets it confirm a snapshot the new chain's writes would make stale. The leader knows when
that lease can end at the latest. The old head measured it from the moment it handed out a nonce,
which was before its poll answer reached the leader; an answer at an epoch at or past the change
extends nothing at a node that has not adopted the change, and once it has, the node no longer
heads the shard. So only this leader's grants at epochs below the change count, and a lease from
an older leader's grant ends before this leader's election plus ``head_lease_ms`` (that grant's
entry was committed before the election). ``hold_ms`` is what is left of the latest of those.

A head whose lease is proven over (docs/manager.md, "Evidence and proof of death") holds nothing
back: a process its supervisor saw exit confirms nothing, and one that said goodbye ended its
lease first (a refused probe is no such proof: a firewall refuses a live node too). So the
leader keeps its grants per incarnation (``record_incarnation_grants``), counts none of an
incarnation whose lease is over (``counted_grants``), and a head whose last process is so counts
neither its grants nor older leaders' (``hold_ms``'s ``gone``).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from kayos import limits

__all__ = [
    "GrantTimes",
    "IncarnationGrants",
    "counted_grants",
    "hold_ms",
    "record_grants",
    "record_incarnation_grants",
    "shard_heads",
]

# Per node, per view epoch: the leader's clock (ms) at the latest poll answer whose nonce a grant
# at that epoch (``member`` true) answered.
GrantTimes = Mapping[str, Mapping[int, float]]


def record_grants(
    times: GrantTimes, granted: Iterable[tuple[str, int, float]], now_ms: float
) -> dict[str, dict[int, float]]:
    """``times`` with the grants just sent, (node, epoch, answer time ms) each, and without
    entries older than ``head_lease_ms`` before ``now_ms``: a lease from those has ended, so they
    bound nothing (this keeps the memory to about ten entries a node)."""
    out = {node: dict(by_epoch) for node, by_epoch in times.items()}
    for node, epoch, at_ms in granted:
        by_epoch = out.setdefault(node, {})
        by_epoch[epoch] = max(at_ms, by_epoch.get(epoch, at_ms))
    horizon = now_ms - limits.head_lease_ms
    pruned = {n: {e: at for e, at in b.items() if at > horizon} for n, b in out.items()}
    return {n: b for n, b in pruned.items() if b}


# Per node, per incarnation of the process that answered, per view epoch: as ``GrantTimes``.
IncarnationGrants = Mapping[str, Mapping[str, Mapping[int, float]]]


def record_incarnation_grants(
    times: IncarnationGrants, granted: Iterable[tuple[str, str, int, float]], now_ms: float
) -> dict[str, dict[str, dict[int, float]]]:
    """``record_grants`` keeping apart the incarnations that answered: (node, incarnation,
    epoch, answer time ms) each ("" for a node that names none)."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    keys = {(n, i) for n, by_inc in times.items() for i in by_inc}
    keys |= {(n, i) for n, i, _, _ in granted}
    for node, incarnation in sorted(keys):
        before = {node: times.get(node, {}).get(incarnation, {})}
        now = [(n, e, at) for n, i, e, at in granted if (n, i) == (node, incarnation)]
        kept = record_grants(before, now, now_ms).get(node)
        if kept:
            out.setdefault(node, {})[incarnation] = kept
    return out


def counted_grants(times: IncarnationGrants, dead: Collection[tuple[str, str]]) -> GrantTimes:
    """The grants that may still hold, per node and epoch: those of incarnations not proven
    gone (``dead``: (node, incarnation) pairs)."""
    out: dict[str, dict[int, float]] = {}
    for node, by_incarnation in times.items():
        for incarnation, by_epoch in by_incarnation.items():
            if (node, incarnation) in dead:
                continue
            counted = out.setdefault(node, {})
            for epoch, at in by_epoch.items():
                counted[epoch] = max(at, counted.get(epoch, at))
    return out


def shard_heads(
    shard: int,
    start: tuple[int, Mapping[int, str]],
    changes: Sequence[Mapping[str, Any]],
    epoch: int,
) -> list[tuple[int, str | None]] | None:
    """The shard's head at every epoch from ``start`` (the epoch and heads the leader began at)
    to ``epoch``, from the member's change records (``GET /v1/manager/changes``); None when the
    records do not hold every epoch in between (dropped, or past the history's bound)."""
    first, heads = start
    if epoch < first or epoch - first > limits.manager_change_history_epochs:
        return None
    by_epoch = {r.get("epoch"): r for r in changes}
    out: list[tuple[int, str | None]] = [(first, heads.get(shard))]
    for e in range(first + 1, epoch + 1):
        record = by_epoch.get(e)
        if record is None:
            return None
        chains = [s.get("chain") for s in record.get("shards", ()) if s.get("id") == shard]
        chain = chains[0] if chains else None
        out.append((e, chain[0] if chain else None))
    return out


def hold_ms(
    new_head: str,
    heads: Sequence[tuple[int, str | None]] | None,
    grants: GrantTimes,
    elected_ms: float,
    now_ms: float,
    lease_ms: float = limits.head_lease_ms,
    gone: Collection[str] = (),
) -> float:
    """Milliseconds ``new_head`` must still hold writes: until every earlier head's lease has
    ended. ``heads``: the shard's head per epoch since the leader began (``shard_heads``; None:
    unknown, so the whole ``lease_ms``). A head X that gave way at epoch C counts with its latest
    grant at an epoch below C; every older leader's grant counts as ``elected_ms``; a head in
    ``gone`` (its last process's lease proven over) counts not at all, and when every earlier
    head is gone nothing is held. (The simulator passes its own, scaled ``lease_ms``.)"""
    if heads is None:
        return lease_ms
    earlier = [
        (epoch, before)
        for (_, before), (epoch, after) in itertools.pairwise(heads)
        if before is not None and before not in (after, new_head)
    ]
    if earlier and all(before in gone for _, before in earlier):
        return 0.0
    latest = elected_ms
    for epoch, before in earlier:
        if before in gone:
            continue
        times = grants.get(before, {})
        latest = max([latest, *(at for e, at in times.items() if e < epoch)])
    return max(0.0, min(lease_ms, latest + lease_ms - now_ms))
