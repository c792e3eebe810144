"""``kayos ctl status``, the pure part: what the nodes answered -> a summary, its alerts, its text.

``summarise`` takes the topology one node served (``GET /v1/topology``) and, per node, either its
``GET /v1/status`` reply or the error met asking for it; it does no I/O and reads no clock, so the
unit tests feed it canned replies. The JSON it builds is the documented, stable schema of
``kayos ctl status --json`` (docs/operations.md, "kayos ctl status"): fields are only ever added.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from kayos import limits
from kayos.cli.ctl.status.common import (
    EXIT_DEGRADED,
    EXIT_HEALTHY,
    EXIT_UNREACHABLE,
    NodeAnswer,
    Style,
    alert,
)
from kayos.cli.ctl.status.manager import render_manager
from kayos.topology import Topology

# The version of the --json schema: raised only if a field changes meaning or goes away.
SCHEMA_VERSION = 1


def unreachable(urls: list[str], error: str, hint: str = "") -> dict[str, Any]:
    """The summary when no node served the topology: exit code 2. ``hint`` says where the URLs
    came from when the user did not name them (``ClusterAddress.hint``)."""
    return {
        "schema": SCHEMA_VERSION,
        "health": "unreachable",
        "exit_code": EXIT_UNREACHABLE,
        "source": None,
        "epoch": None,
        "nodes": [],
        "shards": [],
        "alerts": [
            alert(
                "critical",
                "cluster_unreachable",
                f"no node answered GET /v1/topology at {', '.join(urls)}{hint}: {error}",
            )
        ],
    }


def summarise(source: str, topology: Topology, answers: Mapping[str, NodeAnswer]) -> dict[str, Any]:
    """The cluster as the nodes describe it. ``source`` is the URL that served ``topology``;
    ``answers`` has one entry per node of the topology (a missing one counts as unreachable)."""
    alerts: list[dict[str, Any]] = []
    statuses: dict[str, dict[str, Any]] = {}
    nodes: list[dict[str, Any]] = []
    for node_id, addr in topology.nodes.items():
        answer = answers.get(node_id, "not asked")
        entry: dict[str, Any] = {"id": node_id, "url": addr.http_url, "reachable": False}
        if isinstance(answer, str):
            entry.update(error=answer, epoch=None, ready=None)
            alerts.append(
                alert("critical", "node_unreachable", f"node {node_id}: {answer}", node=node_id)
            )
        else:
            statuses[node_id] = answer
            entry.update(reachable=True, error=None)
            entry.update(epoch=answer.get("epoch"), ready=answer.get("ready"))
            entry.update(auth=answer.get("auth"))
            if answer.get("epoch") != topology.epoch:
                alerts.append(
                    alert(
                        "warning",
                        "epoch_mismatch",
                        f"node {node_id} runs epoch {answer.get('epoch')}, "
                        f"the topology is at {topology.epoch}",
                        node=node_id,
                    )
                )
            if not answer.get("ready"):
                message = f"node {node_id} is not ready"
                alerts.append(alert("warning", "node_not_ready", message, node=node_id))
        nodes.append(entry)
    shards = [_shard(topology, shard_id, statuses, alerts) for shard_id in sorted(topology.shards)]
    auth = auth_summary(statuses, alerts)
    return {
        "auth": auth,
        "schema": SCHEMA_VERSION,
        "health": "degraded" if alerts else "healthy",
        "exit_code": EXIT_DEGRADED if alerts else EXIT_HEALTHY,
        "source": source,
        "epoch": topology.epoch,
        "nodes": nodes,
        "shards": shards,
        "alerts": alerts,
    }


def auth_summary(
    statuses: Mapping[str, Mapping[str, Any]], alerts: list[dict[str, Any]]
) -> dict[str, Any]:
    """Whether the cluster runs open or with credentials (docs/security.md), and each node's
    table version; a node behind the newest missed a push (``credentials_behind``)."""
    versions = {
        node: status["auth"].get("table_version")
        for node, status in statuses.items()
        if isinstance(status.get("auth"), dict)
    }
    modes = {status["auth"].get("mode") for status in statuses.values() if status.get("auth")}
    newest = max((v for v in versions.values() if isinstance(v, int)), default=0)
    for node, version in sorted(versions.items()):
        if version != newest:
            message = (
                f"node {node} holds credentials table version {version}, others {newest}: "
                "run kayos ctl credentials push"
            )
            alerts.append(alert("warning", "credentials_behind", message, node=node))
    mode = modes.pop() if len(modes) == 1 else ("mixed" if modes else None)
    return {"mode": mode, "table_version": newest, "versions": versions}


def _shard(
    topology: Topology,
    shard_id: int,
    statuses: Mapping[str, dict[str, Any]],
    alerts: list[dict[str, Any]],
) -> dict[str, Any]:
    shard = topology.shards[shard_id]
    key = str(shard_id)
    members: list[dict[str, Any]] = []
    for node_id in shard.members:
        expected = shard.role_of(node_id)
        replica = statuses.get(node_id, {}).get("shards", {}).get(key)
        member: dict[str, Any] = {"node": node_id, "role": expected, "reachable": False}
        member.update(last_seq=None, committed_seq=None, catching_up=None)
        member.update(rolled_back_entries=None, rolled_back_committed_entries=None, repair=None)
        if node_id in statuses and replica is None:
            alerts.append(
                alert(
                    "critical",
                    "replica_missing",
                    f"shard {shard_id}: node {node_id} serves no replica of it",
                    shard=shard_id,
                    node=node_id,
                )
            )
        if replica is not None:
            member["reachable"] = True
            for name in ("last_seq", "committed_seq", "catching_up", "rolled_back_entries"):
                member[name] = replica.get(name)
            member["rolled_back_committed_entries"] = replica.get("rolled_back_committed_entries")
            member["repair"] = replica.get("repair")
            _member_alerts(shard_id, node_id, expected, replica, alerts)
        members.append(member)
    links = [
        _link(shard_id, upstream, downstream, statuses, alerts)
        for upstream, downstream in _edges(shard.chain, shard.fanout)
    ]
    # In sync: reachable, not catching up, and linked to the head by up links all the way.
    by_node = {member["node"]: member for member in members}
    down_into = {link["to"] for link in links if link["state"] != "up"}
    in_sync: list[str] = []
    for node_id in shard.members:
        upstream = shard.upstream_of(node_id)
        member = by_node[node_id]
        if (
            member["reachable"]
            and not member["catching_up"]
            and (upstream is None or (upstream in in_sync and node_id not in down_into))
        ):
            in_sync.append(node_id)
    fully = len(in_sync) == len(shard.members)
    if not fully:
        alerts.append(
            alert(
                "critical",
                "shard_under_replicated",
                f"shard {shard_id}: {len(in_sync)} of {len(shard.members)} members in sync "
                f"({', '.join(in_sync) or 'none'})",
                shard=shard_id,
            )
        )
    head = by_node[shard.head]
    return {
        "id": shard_id,
        "chain": list(shard.chain),
        "fanout": list(shard.fanout),
        "head": shard.head,
        "tails": list(shard.tails),
        "last_seq": head["last_seq"],
        "committed_seq": head["committed_seq"],
        "fully_replicated": fully,
        "in_sync": in_sync,
        "members": members,
        "links": links,
        "groups": _groups(shard.tails, key, statuses),
    }


def _groups(
    tails: tuple[str, ...], key: str, statuses: Mapping[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The shard's consumer groups and their lag as its first tail that reported them counts it
    (``GET /v1/status?groups=1``; a tail counts what consumers would read there), each with the
    ``node`` that answered."""
    for tail in tails:
        found = statuses.get(tail, {}).get("shards", {}).get(key, {}).get("groups")
        if isinstance(found, list):
            return [{**group, "node": tail} for group in found if isinstance(group, dict)]
    return []


def _member_alerts(
    shard_id: int, node_id: str, expected: str | None, replica: dict[str, Any], alerts: list[Any]
) -> None:
    where = {"shard": shard_id, "node": node_id}
    if replica.get("role") != expected:
        alerts.append(
            alert(
                "warning",
                "role_mismatch",
                f"shard {shard_id}: node {node_id} acts as {replica.get('role')}, "
                f"the topology says {expected}",
                **where,
            )
        )
    if replica.get("catching_up"):
        alerts.append(
            alert(
                "warning",
                "replica_catching_up",
                f"shard {shard_id}: node {node_id} is catching up from its upstream",
                **where,
            )
        )
    repair = replica.get("repair")
    if isinstance(repair, dict) and repair.get("state") in ("repairing", "damaged"):
        alerts.append(
            alert(
                "warning",
                "replica_repairing",
                f"shard {shard_id}: node {node_id}'s store is {repair['state']} "
                "(it re-makes the replica from its peers by itself)",
                **where,
            )
        )
    if replica.get("rolled_back_committed_entries"):
        alerts.append(
            alert(
                "critical",
                "committed_entries_rolled_back",
                f"shard {shard_id}: node {node_id} rolled back "
                f"{replica['rolled_back_committed_entries']} committed entries (a bug)",
                **where,
            )
        )
    if replica.get("disk_full"):
        alerts.append(
            alert(
                "critical",
                "disk_full",
                f"shard {shard_id}: node {node_id} cannot commit: its disk is full (writes are "
                "refused with disk_full until space is freed; docs/retention.md)",
                **where,
            )
        )


def _edges(chain: tuple[str, ...], fanout: tuple[str, ...]) -> list[tuple[str, str]]:
    pairs = list(itertools.pairwise(chain))
    return pairs + [(chain[-1], tail) for tail in fanout]


def _link(
    shard_id: int,
    upstream: str,
    downstream: str,
    statuses: Mapping[str, dict[str, Any]],
    alerts: list[dict[str, Any]],
) -> dict[str, Any]:
    """One chain link as both its ends see it: up only if every end that answered says so."""
    reports: list[tuple[str, dict[str, Any]]] = []
    for reporter, peer in ((upstream, downstream), (downstream, upstream)):
        replica = statuses.get(reporter, {}).get("shards", {}).get(str(shard_id), {})
        found = next((x for x in replica.get("links", ()) if x.get("peer") == peer), None)
        if found is not None:
            reports.append((reporter, found))
    heard = [r["last_heard_s"] for _, r in reports if r.get("last_heard_s") is not None]
    lags = [int(r.get("lag_entries") or 0) for _, r in reports]
    state = "down" if any(not r.get("up") for _, r in reports) else "up"
    if not reports:
        state = "unknown"
    down_at = [reporter for reporter, r in reports if not r.get("up")]
    link: dict[str, Any] = {
        "from": upstream,
        "to": downstream,
        "state": state,
        # The staler of the two ends' "last heard": a link is as fresh as its quieter direction.
        "last_heard_s": max(heard) if heard else None,
        "lag_entries": max(lags) if lags else None,
        "reported_by": [reporter for reporter, _ in reports],
        "down_at": down_at,
    }
    where = {"shard": shard_id, "link": [upstream, downstream]}
    if state == "down":
        alerts.append(
            alert(
                "critical",
                "link_down",
                f"shard {shard_id}: link {upstream} -> {downstream} is down "
                f"(as seen by {', '.join(down_at)}; last heard {_seconds(link)})",
                **where,
            )
        )
    elif state == "up" and lags and max(lags) > limits.ctl_link_lag_alert_entries:
        alerts.append(
            alert(
                "warning",
                "link_lagging",
                f"shard {shard_id}: {downstream} is {max(lags)} entries behind {upstream} "
                f"(alert above {limits.ctl_link_lag_alert_entries})",
                **where,
            )
        )
    return link


def _seconds(link: Mapping[str, Any]) -> str:
    heard = link["last_heard_s"]
    return "never" if heard is None else f"{heard:.1f}s ago"


def render(summary: Mapping[str, Any], style: Style) -> str:
    """The summary as text for a person. ``style(text, fg=..., bold=...)`` colours a piece
    (``click.style`` on a terminal, a function returning the text unchanged otherwise)."""
    health = summary["health"]
    colour = {"healthy": "green", "degraded": "yellow", "unreachable": "red"}[health]
    alerts = summary["alerts"]
    lines = [
        f"cluster: {style(health.upper(), fg=colour, bold=True)}"
        + (f" (epoch {summary['epoch']}, from {summary['source']})" if summary["source"] else "")
        + (f", {len(alerts)} alert{'s' if len(alerts) != 1 else ''}" if alerts else "")
    ]
    auth = summary.get("auth") or {}
    if auth.get("mode") == "open":
        lines.append(
            "auth: "
            + style("OPEN", fg="yellow")
            + " (no client credentials: anyone who reaches a node may use it)"
        )
    elif auth.get("mode"):
        lines.append(f"auth: {auth['mode']} (credentials table version {auth['table_version']})")
    if summary["nodes"]:
        lines.append("nodes:")
        width = max(len(node["id"]) for node in summary["nodes"])
        for node in summary["nodes"]:
            if node["reachable"]:
                state = style("up", fg="green")
                extra = f"epoch {node['epoch']}" + ("" if node["ready"] else ", not ready")
            else:
                state = style("UNREACHABLE", fg="red", bold=True)
                extra = node["error"]
            lines.append(f"  {node['id']:<{width}}  {node['url']}  {state}  {extra}")
    for shard in summary["shards"]:
        path = " -> ".join(shard["chain"])
        if shard["fanout"]:
            path += " -> {" + ", ".join(shard["fanout"]) + "}"
        replicated = (
            style("fully replicated", fg="green")
            if shard["fully_replicated"]
            else style(
                f"UNDER-REPLICATED ({len(shard['in_sync'])}/{len(shard['members'])} in sync)",
                fg="red",
                bold=True,
            )
        )
        lines.append(
            f"shard {shard['id']}: {path}  last seq {_or_dash(shard['last_seq'])}, "
            f"committed {_or_dash(shard['committed_seq'])}  {replicated}"
        )
        for link in shard["links"]:
            state = link["state"]
            shown = style(
                state.upper() if state != "up" else state,
                fg={"up": "green", "down": "red", "unknown": "yellow"}[state],
                bold=state != "up",
            )
            lines.append(
                f"  {link['from']} -> {link['to']}  {shown}  heard {_seconds(link)}  "
                f"lag {_or_dash(link['lag_entries'])} entries"
            )
        lines += [f"  {_group_text(group)}" for group in shard.get("groups", ())]
        for member in shard["members"]:
            if member["catching_up"]:
                lines.append(f"  {member['node']}: {style('catching up', fg='yellow')}")
            if member.get("repair"):
                lines.append(f"  {member['node']}: {repair_text(member['repair'], style)}")
    lines += render_manager(summary, style)
    if alerts:
        lines.append("alerts:")
        for alert in alerts:
            fg = "red" if alert["severity"] == "critical" else "yellow"
            tag = style(alert["severity"].upper(), fg=fg, bold=True)
            lines.append(f"  {tag} {alert['code']}: {alert['message']}")
    return "\n".join(lines)


def _group_text(group: Mapping[str, Any]) -> str:
    """A group's lag on one line: ``group orders/billing: mark 120, lag 30 messages, 4.2 s``."""
    about = "" if group.get("lag_exact", True) else "about "
    seconds = group.get("lag_seconds")
    age = "age unknown" if seconds is None else f"{seconds:.1f} s"
    return (
        f"group {group.get('queue')}/{group.get('group')}: mark {group.get('hwm')}, "
        f"lag {about}{group.get('lag_messages')} messages, {age} (at {group.get('node')})"
    )


def repair_text(repair: Mapping[str, Any], style: Style) -> str:
    """A replica's ``repair`` (docs/node-api.md, "Self-repair") on one line."""
    state = str(repair.get("state"))
    text = style(f"repair {state}", fg="green" if state == "repaired" else "yellow")
    if repair.get("kept_seq") is not None:
        text += f", kept seqs 1..{repair['kept_seq']}"
    if repair.get("refetched_entries"):
        text += f", re-fetched {repair['refetched_entries']} entries"
    if repair.get("problem"):
        text += f" ({repair['problem']})"
    return text


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


# --- the manager's view (docs/manager.md) ---------------------------------------------------------
