"""``kayos ctl queue describe``'s verdicts (kayos/cli/ctl/queue_view.py) from made-up answers."""

from __future__ import annotations

from typing import Any

import pytest

from kayos.cli.ctl.queue_view import describe, render_describe
from kayos.topology import NodeAddr, rotated

pytestmark = pytest.mark.unit

TOPOLOGY = rotated([NodeAddr(n, "127.0.0.1", 1, 2) for n in "abc"], replicas=3)


def status(node: str, seq: int) -> dict[str, Any]:
    return {
        "node": node,
        "shards": {str(s): {"role": "x", "last_seq": seq, "committed_seq": seq} for s in range(3)},
    }


def read(member: str, *, groups: list[dict[str, Any]], policy: Any = None) -> dict[str, Any]:
    return {
        "member": member,
        "retention": {"queue": "q", "policy": policy, "floor": 0},
        "groups": {"groups": groups},
        "group_info": {g["group"]: {"lag": 2, "lag_complete": True} for g in groups},
        "page": {"messages": []},
    }


def test_a_known_queue_shows_its_shard_marks_and_lag() -> None:
    shard = TOPOLOGY.shard_for("q")
    groups = [
        {"queue": "q", "group": "g", "hwm": 7},
        {"queue": "other", "group": "h", "hwm": 9},  # another queue of the same shard
    ]
    summary = describe(
        "q", TOPOLOGY, {n: status(n, 10) for n in "abc"}, {shard: read("c", groups=groups)}
    )
    assert summary["known"] is True
    assert summary["exit_code"] == 0
    assert summary["groups"] == {"g": {str(shard): 7}}
    (row,) = summary["shards"]
    assert row["last_seq"] == 10
    assert row["groups"] == [
        {
            "group": "g",
            "hwm": 7,
            "lag": 2,
            "lag_complete": True,
            "lag_seconds": None,
            "boundary": None,
        }
    ]
    assert "group g: mark 7, lag 2" in render_describe(summary)


def test_unknown_queue_and_a_dead_head() -> None:
    shard = TOPOLOGY.shard_for("q")
    head = TOPOLOGY.shards[shard].head
    statuses: dict[str, Any] = {n: status(n, 10) for n in "abc"}
    statuses[head] = "TransportError: refused"
    summary = describe("q", TOPOLOGY, statuses, {shard: read("c", groups=[])})
    assert summary["known"] is False
    assert summary["exit_code"] == 1
    assert summary["problems"][0].startswith("unknown queue 'q'")
    assert any(f": {head}: TransportError" in p for p in summary["problems"])
    assert summary["shards"][0]["last_seq"] == 10, "the highest of the members that answered"


def test_a_policy_alone_makes_a_queue_known_and_no_answer_is_not_unknown() -> None:
    shard = TOPOLOGY.shard_for("q")
    summary = describe("q", TOPOLOGY, {}, {shard: read("a", groups=[], policy={"max_bytes": 5})})
    assert summary["known"] is True
    silent = describe("q", TOPOLOGY, dict.fromkeys("abc", "down"), {})
    assert silent["known"] is True, "nothing answered: unknowable, not unknown"
    assert silent["exit_code"] == 1
    assert f"shard {shard}: no member answered" in silent["problems"]
