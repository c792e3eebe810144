"""What the answers of ``kayos ctl compact`` and ``kayos ctl check`` mean (docs/operations.md):
pure functions of the nodes' replies, so every verdict is tested without a cluster."""

from __future__ import annotations

from typing import Any

CHECK_SCHEMA = 1
COMPACT_SCHEMA = 1


def _size(value: Any) -> str:
    if not isinstance(value, int):
        return "?"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


# --- compact -------------------------------------------------------------------------------------


def render_compact_line(node: str, job: dict[str, Any]) -> str:
    """One store's progress or outcome, as a person reads it."""
    where = f"{node} shard {job.get('shard')}"
    state = job.get("state")
    before = job.get("bytes_before")
    if state == "running":
        done = job.get("written_bytes") or 0
        share = f" ({100 * done // before}%)" if isinstance(before, int) and before > 0 else ""
        return f"{where}: compacting, {_size(done)} written of {_size(before)} before{share}"
    if state == "done":
        after = job.get("bytes_after")
        saved = ""
        if isinstance(before, int) and isinstance(after, int) and before > 0:
            saved = f" ({100 * (before - after) / before:+.0f}% freed)".replace("+", "")
        return f"{where}: done, {_size(before)} -> {_size(after)}{saved} in {job.get('seconds')} s"
    if state == "failed":
        return f"{where}: FAILED: {job.get('error')}"
    return f"{where}: {state}"


def compact_summary(
    plan: dict[str, list[int]],
    jobs: dict[tuple[str, int], dict[str, Any]],
    errors: dict[str, str],
    *,
    waited: bool,
) -> dict[str, Any]:
    """The JSON reply of ``kayos ctl compact`` and its text lines."""
    stores: list[dict[str, Any]] = []
    problems: list[str] = []
    for node, shards in plan.items():
        for shard in shards:
            if node in errors:
                job: dict[str, Any] = {
                    "shard": shard,
                    "state": "unreachable",
                    "error": errors[node],
                }
            else:
                job = dict(jobs.get((node, shard), {"shard": shard, "state": "unknown"}))
            stores.append({"node": node, **job})
            state = job.get("state")
            if state == "failed" or state == "unreachable":
                problems.append(f"{node} shard {shard}: {job.get('error')}")
            elif state != "done" and waited:
                problems.append(f"{node} shard {shard}: still {state} when --wait-timeout ran out")
    finished = [s for s in stores if s.get("state") == "done"]
    before = sum(int(s.get("bytes_before") or 0) for s in finished)
    after = sum(int(s.get("bytes_after") or 0) for s in finished)
    lines = [
        render_compact_line(s["node"], s)
        if s.get("state") != "unreachable"
        else f"{s['node']} shard {s['shard']}: UNREACHABLE: {s['error']}"
        for s in stores
    ]
    lines.append(
        f"{len(finished)} of {len(stores)} stores compacted: {_size(before)} -> {_size(after)}"
    )
    lines += [f"problem: {p}" for p in problems]
    return {
        "schema": COMPACT_SCHEMA,
        "ok": not problems,
        "stores": stores,
        "bytes_before": before,
        "bytes_after": after,
        "problems": problems,
        "lines": lines,
    }


# --- check ---------------------------------------------------------------------------------------


def digest_range(probe: dict[str, Any], upto: int, seqs: int) -> int | None:
    """The ``after`` every member can answer for: above each one's floor, at most ``seqs`` below
    ``upto``; None when a member did not answer the probe."""
    if not probe or not all(isinstance(a, dict) for a in probe.values()):
        return None
    floor = max(int(a["floor"]) for a in probe.values())
    return min(upto, max(floor, upto - seqs))


def _problem(code: str, message: str, **where: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **where}


def judge(
    summary: dict[str, Any],
    digests: dict[int, Any],
    stores: dict[str, Any],
    replicas: int | None,
) -> dict[str, Any]:
    """The verdict of ``kayos ctl check`` from ``kayos ctl status``'s summary, each shard's
    digests (``{"upto", "answers": {node: reply | why not}}`` or None: not compared) and each
    ``node/shard`` store check (reply | why not)."""
    problems: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    if summary.get("health") == "unreachable":
        problems.append(
            _problem("cluster_unreachable", summary["alerts"][0]["message"])
            if summary.get("alerts")
            else _problem("cluster_unreachable", "no node answered")
        )
        return _verdict(summary, problems, warnings, [], 2)
    for alert in summary.get("alerts", []):
        entry = {k: v for k, v in alert.items() if k != "severity"}
        (problems if alert["severity"] == "critical" else warnings).append(entry)
    want = replicas or max((len(s["members"]) for s in summary["shards"]), default=1)
    shards_out = []
    for shard in summary["shards"]:
        sid = shard["id"]
        count = len(shard["members"])
        if count < want:
            problems.append(
                _problem(
                    "chain_short",
                    f"shard {sid} has {count} replicas ({', '.join(shard['chain'])}); "
                    f"every chain should have {want}",
                    shard=sid,
                )
            )
        compared = _judge_digests(sid, digests.get(sid), problems)
        checked = _judge_stores(sid, shard, stores, problems, warnings)
        shards_out.append(
            {"id": sid, "members": [m["node"] for m in shard["members"]]}
            | compared
            | {"stores": checked}
        )
    return _verdict(summary, problems, warnings, shards_out, 1 if problems else 0)


def _judge_digests(shard: int, found: Any, problems: list[dict[str, Any]]) -> dict[str, Any]:
    if found is None:
        return {"compared": None}
    answers: dict[str, Any] = found["answers"]
    failed = {node: why for node, why in answers.items() if isinstance(why, str)}
    for node, why in sorted(failed.items()):
        problems.append(
            _problem(
                "digest_failed",
                f"shard {shard}: {node} gave no digest of its committed entries: {why}",
                shard=shard,
                node=node,
            )
        )
    good = {node: a for node, a in answers.items() if isinstance(a, dict)}
    if failed or not good:
        return {"compared": None}
    first = next(iter(good.values()))
    after, upto = int(first["after"]), int(first["upto"])
    by_digest: dict[str, list[str]] = {}
    for node, answer in sorted(good.items()):
        by_digest.setdefault(f"{answer['digest']}/{answer['entries']}", []).append(node)
    if len(by_digest) > 1:
        groups = "; ".join(
            f"{', '.join(nodes)}: {key.split('/')[1]} entries, digest {key[:12]}"
            for key, nodes in sorted(by_digest.items(), key=lambda kv: kv[1])
        )
        problems.append(
            _problem(
                "committed_entries_differ",
                f"shard {shard}: members disagree on the committed entries in seqs "
                f"({after}, {upto}]: {groups}",
                shard=shard,
            )
        )
    return {
        "compared": {
            "after": after,
            "upto": upto,
            "entries": {node: int(a["entries"]) for node, a in sorted(good.items())},
            "agree": len(by_digest) == 1,
            "digests": {node: a["digest"] for node, a in sorted(good.items())},
        }
    }


def _judge_stores(
    shard: int,
    summary_shard: dict[str, Any],
    stores: dict[str, Any],
    problems: list[dict[str, Any]],
    warnings: list[dict[str, Any]],
) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    for member in summary_shard["members"]:
        node = member["node"]
        answer = stores.get(f"{node}/{shard}")
        if answer is None:
            continue  # unreachable: named by its own problem
        if isinstance(answer, str):
            problems.append(
                _problem(
                    "store_check_failed",
                    f"shard {shard} on {node}: no store check: {answer}",
                    shard=shard,
                    node=node,
                )
            )
            checked[node] = {"ok": None, "problem": answer}
            continue
        checked[node] = {
            k: answer.get(k) for k in ("checked", "ok", "problem", "entries", "file_bytes")
        }
        repair = answer.get("repair") or {}
        if repair.get("state") == "damaged":
            problems.append(
                _problem(
                    "store_damaged",
                    f"shard {shard} on {node}: a read met damage ({repair.get('problem')}); "
                    "the node re-makes the replica",
                    shard=shard,
                    node=node,
                )
            )
        if answer.get("checked") is False:
            warnings.append(
                _problem("store_not_checked", f"shard {shard} on {node}: {answer.get('problem')}")
                | {"shard": shard, "node": node}
            )
        elif answer.get("ok") is False:
            problems.append(
                _problem(
                    "store_check_failed",
                    f"shard {shard} on {node}: {answer.get('problem')} at offset "
                    f"{answer.get('offset')}",
                    shard=shard,
                    node=node,
                )
            )
    return checked


def _verdict(
    summary: dict[str, Any],
    problems: list[dict[str, Any]],
    warnings: list[dict[str, Any]],
    shards: list[dict[str, Any]],
    exit_code: int,
) -> dict[str, Any]:
    return {
        "schema": CHECK_SCHEMA,
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "epoch": summary.get("epoch"),
        "nodes": [
            {"id": n["id"], "reachable": n["reachable"], "error": n["error"]}
            for n in summary.get("nodes", [])
        ],
        "shards": shards,
        "problems": problems,
        "warnings": warnings,
    }


def render_check(result: dict[str, Any]) -> str:
    """``kayos ctl check``'s text: a verdict line, a line per shard, then each problem."""
    lines = []
    verdict = "OK" if result["ok"] else f"{len(result['problems'])} PROBLEM(S)"
    lines.append(f"check: {verdict} (epoch {result['epoch']})")
    for shard in result["shards"]:
        compared = shard.get("compared")
        if compared is None:
            digest = "members not compared"
        else:
            counts = sorted(set(compared["entries"].values()))
            digest = (
                f"committed entries in ({compared['after']}, {compared['upto']}] "
                f"{'agree' if compared['agree'] else 'DIFFER'} ({'/'.join(map(str, counts))} "
                "entries)"
            )
        stores = shard["stores"]
        good = sum(1 for s in stores.values() if s.get("ok"))
        lines.append(
            f"  shard {shard['id']}: {', '.join(shard['members'])}: {digest}; "
            f"stores {good}/{len(shard['members'])} pass"
        )
    for problem in result["problems"]:
        lines.append(f"PROBLEM {problem['code']}: {problem['message']}")
    for warning in result["warnings"]:
        lines.append(f"warning {warning['code']}: {warning['message']}")
    return "\n".join(lines)
