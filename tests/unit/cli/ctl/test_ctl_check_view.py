"""The verdicts of ``kayos ctl check`` and ``kayos ctl compact`` (kayos/cli/ctl/check_view.py) from
made-up node answers: members that disagree, a store that fails its check, a short chain, a
member that gave no digest, the digest range, and the compact summary's totals and problems."""

from __future__ import annotations

from typing import Any

import pytest

from kayos.cli.ctl.check_view import compact_summary, digest_range, judge, render_check

pytestmark = pytest.mark.unit


def member(node: str, committed: int = 100) -> dict[str, Any]:
    return {"node": node, "reachable": True, "committed_seq": committed}


def summary(*shards: list[str]) -> dict[str, Any]:
    return {
        "health": "healthy",
        "epoch": 3,
        "alerts": [],
        "nodes": [{"id": n, "reachable": True, "error": None} for n in "abc"],
        "shards": [
            {"id": i, "chain": chain, "members": [member(n) for n in chain]}
            for i, chain in enumerate(shards)
        ],
    }


def digest(node: str, value: str, entries: int = 10) -> dict[str, Any]:
    return {"node": node, "after": 90, "upto": 100, "floor": 0, "entries": entries, "digest": value}


def store(ok: bool = True, **extra: Any) -> dict[str, Any]:
    return {"checked": True, "ok": ok, "problem": None, "entries": 10, "file_bytes": 4096} | extra


def stores_for(*pairs: str) -> dict[str, Any]:
    return {pair: store() for pair in pairs}


def test_members_that_agree_and_pass_are_ok() -> None:
    digests = {0: {"upto": 100, "answers": {n: digest(n, "aa" * 32) for n in "abc"}}}
    result = judge(summary(["a", "b", "c"]), digests, stores_for("a/0", "b/0", "c/0"), None)
    assert result["exit_code"] == 0
    assert result["problems"] == []
    assert result["shards"][0]["compared"]["agree"] is True
    assert render_check(result).startswith("check: OK (epoch 3)")


def test_a_member_with_other_committed_entries_is_named() -> None:
    answers = {
        "a": digest("a", "aa" * 32),
        "b": digest("b", "aa" * 32),
        "c": digest("c", "bb" * 32, 9),
    }
    result = judge(summary(["a", "b", "c"]), {0: {"upto": 100, "answers": answers}}, {}, None)
    assert result["exit_code"] == 1
    (problem,) = result["problems"]
    assert problem["code"] == "committed_entries_differ"
    assert problem["shard"] == 0
    assert "(90, 100]" in problem["message"]
    assert "a, b: 10 entries" in problem["message"]
    assert "c: 9 entries" in problem["message"]
    assert "PROBLEM committed_entries_differ" in render_check(result)


def test_a_member_without_a_digest_and_a_failed_store_are_problems() -> None:
    answers = {"a": digest("a", "aa" * 32), "b": "OperationTimeoutError: no reply in 5s"}
    stores = {"a/0": store(), "b/0": store(ok=False, problem="CRC mismatch", offset=8192)}
    result = judge(summary(["a", "b"]), {0: {"upto": 100, "answers": answers}}, stores, 2)
    codes = [(p["code"], p.get("node")) for p in result["problems"]]
    assert ("digest_failed", "b") in codes
    assert ("store_check_failed", "b") in codes
    assert "offset 8192" in next(
        p["message"] for p in result["problems"] if p["code"] == "store_check_failed"
    )


def test_a_short_chain_and_an_unchecked_large_store() -> None:
    stores = {"a/1": store(checked=False, ok=None, problem="not checked: over the bound")}
    result = judge(summary(["a", "b", "c"], ["a"]), {}, stores, None)
    assert [p["code"] for p in result["problems"]] == ["chain_short"]
    assert "shard 1 has 1 replicas" in result["problems"][0]["message"]
    assert [w["code"] for w in result["warnings"]] == ["store_not_checked"]
    assert result["exit_code"] == 1


def test_status_alerts_become_problems_or_warnings_and_unreachable_exits_2() -> None:
    found = summary(["a", "b"])
    found["alerts"] = [
        {"severity": "critical", "code": "node_unreachable", "message": "c down", "node": "c"},
        {"severity": "warning", "code": "replica_catching_up", "message": "b", "shard": 0},
    ]
    result = judge(found, {}, {}, None)
    assert [p["code"] for p in result["problems"]] == ["node_unreachable"]
    assert [w["code"] for w in result["warnings"]] == ["replica_catching_up"]
    gone = {"health": "unreachable", "epoch": None, "alerts": [{"message": "refused"}]}
    result = judge(gone, {}, {}, None)
    assert result["exit_code"] == 2
    assert result["problems"][0]["code"] == "cluster_unreachable"


def test_digest_range_is_above_every_floor_and_bounded() -> None:
    probe = {"a": {"floor": 10}, "b": {"floor": 40}}
    assert digest_range(probe, 100, 1000) == 40
    assert digest_range(probe, 100, 20) == 80
    assert digest_range({"a": {"floor": 150}}, 100, 20) == 100  # nothing left to compare
    assert digest_range({"a": {"floor": 0}, "b": "UnavailableError: down"}, 100, 20) is None


def test_compact_summary_totals_and_problems() -> None:
    jobs = {
        ("a", 0): {"shard": 0, "state": "done", "bytes_before": 4000, "bytes_after": 1000},
        ("a", 1): {"shard": 1, "state": "failed", "error": "storage_error: disk"},
    }
    result = compact_summary(
        {"a": [0, 1], "b": [0]}, jobs, {"b": "UnavailableError: x"}, waited=True
    )
    assert result["ok"] is False
    assert (result["bytes_before"], result["bytes_after"]) == (4000, 1000)
    assert [s["state"] for s in result["stores"]] == ["done", "failed", "unreachable"]
    assert len(result["problems"]) == 2
    assert "a shard 0: done, 3.9 KB -> 1000 B (75% freed)" in result["lines"][0]
