"""Redundancy restored by itself (docs/manager.md rule 10): pure, part of ``decide``.

A shard holding fewer replicas than the replication factor (its chain and its learners) for
``replace_after_ms`` is copied to a node that holds no replica of it: an up, non-draining node,
the least loaded (``placement.restore_target``), at most ``limits.manager_restores_max`` copies at
once across the cluster, the shards with the fewest replicas first. The copy is a catch-up like a
move's (``StartCatchUp`` from the tail, with an order number); on ``CatchUpDone`` the node joins
as tail. Members the replacement stands in for are forgotten: a forgotten node that comes back is
a spare, not a member to catch up (the shard would hold one replica too many).

``restore_status`` is what ``GET /v1/manager/status`` (and ``kayos ctl status``) shows of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kayos import limits
from kayos.manager.events import Action, StartCatchUp
from kayos.manager.placement import restore_target
from kayos.manager.view import (
    ManagerView,
    ShardView,
    new_order,
    replicas_of,
    restore_candidates,
    restore_due,
)

# Node states a replacement can copy from: the tail serves the store file while it lives.
_SOURCE_STATES = ("up", "suspect", "slow", "full")


def restore_redundancy(view: ManagerView, out: list[Action]) -> ManagerView:
    """Notes which shards are short (and since when), drops finished or failed replacements, and
    starts the replacements that are due, within the bound."""
    view = _noted(view)
    running = sum(1 for shard in view.shards if shard.restoring)
    due = [s for s in view.shards if restore_due(view, s) and _has_source(view, s)]
    due.sort(key=lambda s: (replicas_of(s), s.short_since, s.id))
    for shard in due:
        if running >= limits.manager_restores_max:
            break
        target = restore_target(view, shard.id)
        if target is None:
            continue  # alerted shard_not_restorable (view.derive_alerts)
        view = _start(view, shard, target, out)
        running += 1
    return view


def _noted(view: ManagerView) -> ManagerView:
    """Each shard's ``restoring`` (kept while its target is still copying: joined, or gone
    down, it ends) and ``short_since`` (set when it first counts short, cleared once it is not;
    a shard whose replacement still copies is short until the copy joins, so a replacement whose
    target went down is followed by another at once, the grace being over)."""
    factor = view.config.replication_factor
    shards = []
    for shard in view.shards:
        restoring = tuple(r for r in shard.restoring if r[0] in shard.catching_up)
        since: int | None = None
        if replicas_of(shard) < factor or restoring:
            since = view.now_ms if shard.short_since is None else shard.short_since
        shards.append(replace(shard, restoring=restoring, short_since=since))
    return replace(view, shards=tuple(shards))


def _has_source(view: ManagerView, shard: ShardView) -> bool:
    tail = view.node(shard.tail)
    return tail is not None and tail.state in _SOURCE_STATES


def _start(view: ManagerView, shard: ShardView, target: str, out: list[Action]) -> ManagerView:
    """Sends ``target`` to copy the shard from its tail. The departed members that are not up
    (down, slow, full) and that the shard no longer has room for once the copy counts are
    forgotten, the earliest departed first: they would rejoin past the replication factor."""
    view, shard, order = new_order(view, shard, target)
    shard = make_room(view, replace(shard, catching_up=(*shard.catching_up, target)))
    shard = replace(shard, restoring=((target, view.now_ms),))
    out.append(StartCatchUp(target, shard.id, shard.tail, None, order))
    return view.with_shard(shard)


def make_room(view: ManagerView, shard: ShardView) -> ShardView:
    """The shard without the departed members that are not up (down, slow, full) and that it
    has no room for beyond its replicas (``replicas_of``), the earliest departed first: they
    would rejoin past the replication factor."""
    room = view.config.replication_factor - replicas_of(shard)
    states = {n.id: n.state for n in view.nodes}
    away = [n for n in shard.departed if states.get(n) != "up"]
    forgotten = set(away[: max(0, len(away) - max(0, room))])
    return replace(shard, departed=tuple(n for n in shard.departed if n not in forgotten))


def rebase(view: ManagerView, at_ms: int) -> ManagerView:
    """The shards' restore times moved onto a new leader's clock (``at_ms`` is its now): the
    time each shard has been short, and each copy has run, is kept as of the last entry."""

    def moved(t: int) -> int:
        return at_ms - (view.now_ms - t)

    shards = tuple(
        replace(
            s,
            short_since=None if s.short_since is None else moved(s.short_since),
            restoring=tuple((n, moved(t)) for n, t in s.restoring),
        )
        for s in view.shards
    )
    return replace(view, shards=shards)


def restore_status(view: ManagerView) -> dict[str, Any]:
    """What runs and what waits: each replacement (shard, target, upstream, seconds running),
    and each short shard with none (replicas held, seconds short, and why it is not restored:
    ``grace`` (restore_in_s), ``off``, ``no_candidate``, ``no_source`` or ``limit``)."""
    factor = view.config.replication_factor
    restoring = [
        {
            "shard": s.id,
            "target": target,
            "upstream": s.tail,
            "for_s": round((view.now_ms - at) / 1000, 1),
        }
        for s in view.shards
        for target, at in s.restoring
    ]
    short = []
    for s in view.shards:
        if s.short_since is None or s.restoring:
            continue
        entry: dict[str, Any] = {
            "shard": s.id,
            "replicas": replicas_of(s),
            "short_for_s": round((view.now_ms - s.short_since) / 1000, 1),
            "reason": _reason(view, s),
        }
        if entry["reason"] == "grace":
            left = view.config.replace_after_ms - (view.now_ms - s.short_since)
            entry["restore_in_s"] = round(left / 1000, 1)
        short.append(entry)
    return {
        "replication_factor": factor,
        "replace_after_s": view.config.replace_after_ms / 1000,
        "restores_max": limits.manager_restores_max,
        "restoring": restoring,
        "short": short,
    }


def _reason(view: ManagerView, shard: ShardView) -> str:
    if view.config.replace_after_ms == 0:
        return "off"
    if not restore_due(view, shard):
        return "grace"
    if not restore_candidates(view, shard):
        return "no_candidate"
    if not _has_source(view, shard):
        return "no_source"
    return "limit"
