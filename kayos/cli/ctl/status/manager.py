"""``kayos ctl status``'s manager half, the pure part: the manager's view as one member answered
it -> the summary's ``manager`` object, its alerts and its text (docs/operations.md, "Reading
``kayos ctl status``")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kayos.cli.ctl.status.common import EXIT_DEGRADED, EXIT_HEALTHY, NodeAnswer, Style, alert

# Manager alert kinds as `kayos ctl status` alerts: the shard cannot serve, or holds fewer copies
# than asked, or a member's disk is full (critical); a slow node kept in a chain (warning).
_MANAGER_SEVERITY = {
    "shard_no_live_member": "critical",
    "shard_below_min_replicas": "critical",
    "member_disk_full": "critical",
    "slow_node_kept": "warning",
    "shard_not_restorable": "warning",
}


def with_manager(
    summary: dict[str, Any], answer: NodeAnswer | None, asked: list[str]
) -> dict[str, Any]:
    """``summary`` with the manager's view beside the nodes': ``answer`` is one member's
    ``GET /v1/manager/status`` (the leader's when it answered), the reason none answered, or
    None when the cluster has no manager members (``asked`` empty). Its alerts join the
    summary's, and a manager no member of which answered is an alert of its own."""
    out = dict(summary)
    alerts = list(summary["alerts"])
    if answer is None:
        out["manager"] = None
        return out
    if isinstance(answer, str):
        out["manager"] = {"reachable": False, "asked": asked, "error": answer}
        alerts.append(
            alert(
                "critical",
                "manager_unreachable",
                f"no manager member answered at {', '.join(asked)}: {answer}",
            )
        )
    else:
        out["manager"] = _manager_view(answer, asked)
        alerts += _manager_alerts(answer, out["manager"]["shards"])
    out["alerts"] = alerts
    if out["health"] != "unreachable":
        out["health"] = "degraded" if alerts else "healthy"
        out["exit_code"] = EXIT_DEGRADED if alerts else EXIT_HEALTHY
    return out


def _manager_view(answer: dict[str, Any], asked: list[str]) -> dict[str, Any]:
    """The ``manager`` part of the summary from a member's status reply."""
    raw_view = answer.get("view")
    view: dict[str, Any] = raw_view if isinstance(raw_view, dict) else {}
    nodes = [
        {"id": n[0], "state": n[1]}
        for n in view.get("nodes", [])
        if isinstance(n, list) and len(n) >= 2
    ]
    shards = [
        {
            "id": s.get("id"),
            "chain": s.get("chain", []),
            "epoch": s.get("epoch"),
            "departed": s.get("departed", []),
            "catching_up": s.get("catching_up", []),
        }
        for s in view.get("shards", [])
        if isinstance(s, dict)
    ]
    return {
        "reachable": True,
        "asked": asked,
        "member": answer.get("member"),
        "leader": answer.get("leader"),
        "leader_url": answer.get("leader_url"),
        "epoch": answer.get("epoch"),
        "view_hash": answer.get("view_hash"),
        "nodes": nodes,
        "shards": shards,
        "alerts": answer.get("alerts", []),
        "restore": _restore(answer.get("restore")),
    }


def _restore(raw: Any) -> dict[str, Any] | None:
    """The manager's ``restore`` object (docs/manager.md rule 10); None from a member that has
    none (older code)."""
    if not isinstance(raw, dict):
        return None
    restoring = [r for r in raw.get("restoring", []) if isinstance(r, dict)]
    short = [r for r in raw.get("short", []) if isinstance(r, dict)]
    return {**raw, "restoring": restoring, "short": short}


# Why a short shard is not being restored, in words (docs/manager.md rule 10).
_SHORT_REASONS = {
    "grace": "waiting out the grace",
    "off": "replacement is off (replace_after_ms = 0)",
    "no_candidate": "no up, non-draining node without a replica: add a node",
    "no_source": "its tail is down: nothing to copy from",
    "limit": "waiting for a running restore to end",
}


def restore_lines(restore: Mapping[str, Any] | None) -> list[str]:
    """``render_manager``'s lines on restoring redundancy: shards being copied to a new member,
    to which node, for how long; shards short with the reason none is."""
    if not restore:
        return []
    lines = []
    for r in restore["restoring"]:
        lines.append(
            f"  restoring shard {r.get('shard')}: to {r.get('target')} from {r.get('upstream')}"
            f", for {r.get('for_s')} s"
        )
    for r in restore["short"]:
        reason = str(r.get("reason"))
        why = _SHORT_REASONS.get(reason, reason)
        if reason == "grace":
            why += f" ({r.get('restore_in_s')} s left)"
        lines.append(
            f"  short shard {r.get('shard')}: {r.get('replicas')} of"
            f" {restore.get('replication_factor')} replicas for {r.get('short_for_s')} s; {why}"
        )
    return lines


def _manager_alerts(answer: dict[str, Any], shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alerts a member's reply raises: no leader, members away from a chain (``shards`` as
    ``_manager_view`` has them), and the manager's own alerts."""
    alerts: list[dict[str, Any]] = []
    if answer.get("leader") is None:
        alerts.append(alert("critical", "manager_no_leader", "the manager has no leader"))
    for entry in shards:
        away = [str(n) for n in entry["departed"]]
        if away:
            # Not a copy short of the minimum (the manager alerts that), but short of the
            # members it had: full replication is back only once they rejoin.
            learning = {str(n) for n in entry["catching_up"]}
            where = ", ".join(f"{n} (catching up)" if n in learning else n for n in away)
            alerts.append(
                alert(
                    "warning",
                    "shard_members_away",
                    f"shard {entry['id']}: left the chain and not back yet: {where}",
                    shard=entry["id"],
                )
            )
    for raised in answer.get("alerts", []):
        if not isinstance(raised, dict):
            continue
        kind, shard, node = raised.get("kind"), raised.get("shard"), raised.get("node")
        where = f"shard {shard}" + (f", node {node}" if node else "")
        alerts.append(
            alert(
                _MANAGER_SEVERITY.get(str(kind), "warning"),
                str(kind),
                f"manager: {where}",
                shard=shard,
                node=node or None,
            )
        )
    return alerts


def render_manager(summary: Mapping[str, Any], style: Style) -> list[str]:
    """The manager's part of ``render``: leader, epoch, node states, chains as it sees them."""
    manager = summary.get("manager")
    if manager is None:
        return []
    if not manager["reachable"]:
        return [f"manager: {style('UNREACHABLE', fg='red', bold=True)}  {manager['error']}"]
    leader = manager["leader"] or style("NO LEADER", fg="red", bold=True)
    lines = [
        f"manager: leader {leader} ({manager['leader_url'] or '-'}), epoch {manager['epoch']}, "
        f"asked {manager['member']}"
    ]
    colours = {"up": "green", "suspect": "yellow", "slow": "yellow", "full": "red", "down": "red"}
    states = "  ".join(
        f"{n['id']} {style(n['state'], fg=colours.get(n['state'], 'red'))}"
        for n in manager["nodes"]
    )
    lines.append(f"  node states: {states}")
    for shard in manager["shards"]:
        extra = ""
        if shard["departed"]:
            extra += f"  departed {', '.join(shard['departed'])}"
        if shard["catching_up"]:
            extra += f"  catching up {', '.join(shard['catching_up'])}"
        chain = " -> ".join(shard["chain"])
        lines.append(f"  shard {shard['id']}: {chain}  (epoch {shard['epoch']}){extra}")
    return lines + restore_lines(manager.get("restore"))
