"""What the answers of ``kayos ctl queue describe`` mean (docs/operations.md): pure functions of the
topology and the nodes' replies, so the summary is tested without a cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kayos.topology import ShardChain, Topology

DESCRIBE_SCHEMA = 1

# One node's answer to a request: its JSON object, or why there is none.
Answer = dict[str, Any] | str


def _member(node: str, role: str | None, status: Answer, shard: int) -> dict[str, Any]:
    if isinstance(status, str):
        return {"node": node, "role": role, "reachable": False, "error": status}
    mine = status.get("shards", {}).get(str(shard)) or status.get("shards", {}).get(shard)
    if not isinstance(mine, dict):
        return {"node": node, "role": role, "reachable": True, "error": "holds no replica"}
    return {
        "node": node,
        "role": mine.get("role", role),
        "reachable": True,
        "last_seq": mine.get("last_seq"),
        "committed_seq": mine.get("committed_seq"),
        "error": None,
    }


def _groups(queue: str, listed: Answer, infos: Mapping[str, Answer]) -> list[dict[str, Any]]:
    if isinstance(listed, str):
        return []
    found = []
    for entry in listed.get("groups", []):
        if entry.get("queue") != queue:
            continue
        group = str(entry.get("group"))
        info = infos.get(group)
        row: dict[str, Any] = {"group": group, "hwm": entry.get("hwm")}
        if isinstance(info, dict):
            for name in ("lag", "lag_complete", "lag_seconds", "boundary"):
                row[name] = info.get(name)
        elif isinstance(info, str):
            row["error"] = info
        found.append(row)
    return sorted(found, key=lambda row: row["group"])


def _shard(
    queue: str, chain: ShardChain, statuses: Mapping[str, Answer], read: Mapping[str, Any]
) -> dict[str, Any]:
    """One shard's row of ``describe``: its members as their statuses tell, its seqs (the head's,
    else the highest a live member reports), and what ``read`` found of the queue there."""
    shard_id = chain.id
    members = [
        _member(n, chain.role_of(n), statuses.get(n, "not asked"), shard_id) for n in chain.members
    ]
    head = next((m for m in members if m["node"] == chain.head), None)
    live = [m for m in members if m.get("error") is None]
    source = head if head is not None and head.get("error") is None else None
    last = source["last_seq"] if source else max((m["last_seq"] for m in live), default=None)
    committed = (
        source["committed_seq"] if source else max((m["committed_seq"] for m in live), default=None)
    )
    retention = read.get("retention")
    page = read.get("page")
    shard_groups = _groups(queue, read.get("groups", "not read"), read.get("group_info", {}))
    has_entries = bool(page.get("messages") or page.get("seqs")) if isinstance(page, dict) else None
    policy = retention.get("policy") if isinstance(retention, dict) else None
    floor = retention.get("floor") if isinstance(retention, dict) else None
    return {
        "id": shard_id,
        "chain": list(chain.chain),
        "fanout": list(chain.fanout),
        "head": chain.head,
        "read_from": read.get("member"),
        "last_seq": last,
        "committed_seq": committed,
        "members": members,
        "retention": {"policy": policy, "floor": floor} if isinstance(retention, dict) else None,
        "has_entries": has_entries,
        "groups": shard_groups,
    }


def _holds_queue(row: dict[str, Any]) -> bool:
    """Whether a shard's row shows the queue exists there: an entry, a group, a retention policy
    or floor."""
    retention = row["retention"] or {}
    held = bool(row["groups"]) or row["has_entries"] is True
    return held or retention.get("policy") is not None or bool(retention.get("floor"))


def describe(
    queue: str,
    topology: Topology,
    statuses: Mapping[str, Answer],
    reads: Mapping[int, Mapping[str, Any]],
) -> dict[str, Any]:
    """The JSON of ``kayos ctl queue describe``. ``statuses``: node -> its ``/v1/status``;
    ``reads``: shard -> ``{"member", "groups", "group_info": {group: answer}, "retention",
    "page"}`` as read from one reachable member of the shard (a tail when one answers)."""
    shards = []
    problems: list[str] = []
    groups: dict[str, dict[str, Any]] = {}
    seen = queue in topology.queues
    for shard_id in topology.shards_for(queue):
        read = reads.get(shard_id, {})
        row = _shard(queue, topology.shards[shard_id], statuses, read)
        seen = seen or _holds_queue(row)
        for member in row["members"]:
            if member["error"] is not None:
                problems.append(f"shard {shard_id}: {member['node']}: {member['error']}")
        if not read:
            problems.append(f"shard {shard_id}: no member answered")
        for group in row["groups"]:
            groups.setdefault(group["group"], {})[str(shard_id)] = group["hwm"]
        shards.append(row)
    answered = any(reads.get(s) for s in topology.shards_for(queue))
    known = seen or not answered  # nothing answered: unknowable, not "unknown"
    if not known:
        problems.insert(
            0,
            f"unknown queue {queue!r}: the topology names no such queue and none of its shards "
            f"{list(topology.shards_for(queue))} holds an entry, a group or a retention policy "
            "of it",
        )
    return {
        "schema": DESCRIBE_SCHEMA,
        "queue": queue,
        "epoch": topology.epoch,
        "known": known,
        "shard_count": topology.queue_shard_count(queue),
        "shard_count_from": "queue" if queue in topology.queues else "cluster default",
        "home_shard": topology.shard_for(queue),
        "shards": shards,
        "groups": dict(sorted(groups.items())),
        "problems": problems,
        "exit_code": 0 if known and not problems else 1,
    }


def retention_policy(
    max_age_ms: int | None, max_bytes: int | None, until_consumed: bool
) -> dict[str, Any]:
    """The retention policy body (docs/retention.md) the command line's options give."""
    policy: dict[str, Any] = {}
    if max_age_ms is not None:
        policy["max_age_ms"] = max_age_ms
    if max_bytes is not None:
        policy["max_bytes"] = max_bytes
    if until_consumed:
        policy["until_consumed"] = True
    return policy


def _policy_text(retention: dict[str, Any] | None) -> str:
    if retention is None:
        return "?"
    policy = retention.get("policy")
    floor = retention.get("floor") or 0
    if not policy:
        text = "keep all"
    else:
        text = ", ".join(f"{name}={value}" for name, value in sorted(policy.items()))
    return f"{text}, floor {floor}"


def render_describe(summary: Mapping[str, Any]) -> str:
    """The summary as a person reads it."""
    queue = summary["queue"]
    lines = [
        f"queue {queue}: {summary['shard_count']} shard(s) ({summary['shard_count_from']}), "
        f"home shard {summary['home_shard']}, topology epoch {summary['epoch']}"
    ]
    for shard in summary["shards"]:
        chain = " -> ".join(shard["chain"])
        if shard["fanout"]:
            chain += " -> {" + ", ".join(shard["fanout"]) + "}"
        lines.append(
            f"  shard {shard['id']}: head {shard['head']}, chain {chain}; last seq "
            f"{shard['last_seq']}, committed {shard['committed_seq']}; retention "
            f"{_policy_text(shard['retention'])}"
        )
        for member in shard["members"]:
            if member["error"] is not None:
                lines.append(f"    {member['node']}: {member['error']}")
            else:
                lines.append(
                    f"    {member['node']} ({member['role']}): last {member['last_seq']}, "
                    f"committed {member['committed_seq']}"
                )
        for group in shard["groups"]:
            lag = group.get("lag")
            more = "" if group.get("lag_complete", True) else "+"
            lines.append(f"    group {group['group']}: mark {group['hwm']}, lag {lag}{more}")
    if not summary["groups"]:
        lines.append("  no consumer groups")
    for problem in summary["problems"]:
        lines.append(f"  problem: {problem}")
    return "\n".join(lines)
