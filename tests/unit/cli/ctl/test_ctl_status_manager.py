"""`kayos ctl status` with the manager's view (kayos/cli/ctl/status/manager.py ``with_manager``):
canned manager replies in, summary and text out."""

from __future__ import annotations

from typing import Any

import pytest

from kayos.cli.ctl.status.common import EXIT_DEGRADED, EXIT_HEALTHY
from kayos.cli.ctl.status.manager import with_manager
from kayos.cli.ctl.status.view import render, summarise
from kayos.manager import (
    CatchUpDone,
    Config,
    Drain,
    ManagerView,
    NodeReturned,
    RemoveNode,
    StartCatchUp,
    TimerTick,
    decide,
    view_hash,
)
from kayos.manager.restore import restore_status
from tests.support.answers import healthy_answers, topology

pytestmark = pytest.mark.unit

URLS = ["http://127.0.0.1:7401", "http://127.0.0.1:7402"]


def manager_reply(view: ManagerView, leader: str | None = "m1") -> dict[str, Any]:
    return {
        "member": "m1",
        "leader": leader,
        "leader_url": URLS[0] if leader else None,
        "epoch": view.epoch,
        "view": view.to_data(),
        "view_hash": view_hash(view),
        "alerts": [{"kind": a.kind, "shard": a.shard, "node": a.node} for a in view.alerts],
    }


def first_view() -> ManagerView:
    return ManagerView.bootstrap(Config(), list("abc"), [list("abc"), list("bca"), list("cab")])


def plain(text: str, **_: Any) -> str:
    return text


def test_without_managers_the_summary_is_unchanged_but_says_so() -> None:
    topo = topology()
    summary = summarise("u", topo, healthy_answers(topo))
    out = with_manager(summary, None, [])
    assert out["manager"] is None
    assert out["exit_code"] == summary["exit_code"]


def test_a_healthy_manager_view_adds_no_alert() -> None:
    topo = topology()
    summary = with_manager(
        summarise("u", topo, healthy_answers(topo)), manager_reply(first_view()), URLS
    )
    assert summary["exit_code"] == EXIT_HEALTHY, summary["alerts"]
    manager = summary["manager"]
    assert manager["leader"] == "m1"
    assert manager["nodes"] == [{"id": n, "state": "up"} for n in "abc"]
    text = render(summary, plain)
    assert "manager: leader m1 (http://127.0.0.1:7401), epoch 1" in text
    assert "node states: a up  b up  c up" in text


def test_manager_alerts_join_the_summary_with_their_severity() -> None:
    topo = topology()
    view, _ = decide(
        ManagerView.bootstrap(Config(min_replicas=3), list("abc"), [list("abc")] * 3),
        RemoveNode("c"),
    )
    summary = with_manager(summarise("u", topo, healthy_answers(topo)), manager_reply(view), URLS)
    assert summary["exit_code"] == EXIT_DEGRADED
    below = [a for a in summary["alerts"] if a["code"] == "shard_below_min_replicas"]
    assert len(below) == 3
    assert all(a["severity"] == "critical" for a in below)
    assert "c removed" in render(summary, plain)


def test_no_leader_or_no_member_answering_is_an_alert() -> None:
    topo = topology()
    base = summarise("u", topo, healthy_answers(topo))
    leaderless = with_manager(base, manager_reply(first_view(), leader=None), URLS)
    assert [a["code"] for a in leaderless["alerts"]] == ["manager_no_leader"]
    gone = with_manager(base, "UnavailableError: refused", URLS)
    assert gone["manager"] == {
        "reachable": False,
        "asked": URLS,
        "error": "UnavailableError: refused",
    }
    assert [a["code"] for a in gone["alerts"]] == ["manager_unreachable"]
    assert gone["exit_code"] == EXIT_DEGRADED
    assert "manager: UNREACHABLE" in render(gone, plain)


def test_a_shard_with_members_away_is_degraded_until_they_rejoin() -> None:
    """A chain spliced down to two of its three members is not full replication: the summary says
    which node is away and whether it is catching up, and clears once it rejoined."""
    topo = topology()
    view = first_view()
    later = view.config.detection_window_ms + 1_000
    view, _ = decide(view, TimerTick(later, (("a", later), ("b", later))))  # c silent: down
    summary = with_manager(summarise("u", topo, healthy_answers(topo)), manager_reply(view), URLS)
    away = [a for a in summary["alerts"] if a["code"] == "shard_members_away"]
    assert sorted(a["shard"] for a in away) == [0, 1, 2], summary["alerts"]
    assert all(a["message"].endswith("not back yet: c") for a in away)
    assert summary["exit_code"] == EXIT_DEGRADED

    view, _ = decide(view, NodeReturned("c", later + 100))
    summary = with_manager(summarise("u", topo, healthy_answers(topo)), manager_reply(view), URLS)
    away = [a for a in summary["alerts"] if a["code"] == "shard_members_away"]
    assert all(a["message"].endswith("c (catching up)") for a in away), away
    for shard in range(3):
        order = view.shards[shard].order_of("c")
        assert order is not None
        view, _ = decide(view, CatchUpDone("c", shard, order))
    summary = with_manager(summarise("u", topo, healthy_answers(topo)), manager_reply(view), URLS)
    assert not [a for a in summary["alerts"] if a["code"] == "shard_members_away"]


def test_status_shows_shards_being_restored_and_short_ones_with_the_reason() -> None:
    """Rule 10 in `kayos ctl status`: during the grace each short shard says how long is left;
    past it, the copy to a new member shows (to which node, from which, for how long), and a
    shard with nowhere to go says so."""
    topo = topology()
    config = Config(replace_after_ms=30_000)
    view = ManagerView.bootstrap(config, list("abcd"), [list("abc"), list("bca")])
    later = view.config.detection_window_ms + 1_000
    heard = tuple((n, later) for n in "abd")
    view, _ = decide(view, TimerTick(later, heard))  # c silent: down, both shards short

    def shown(view: ManagerView) -> tuple[dict[str, Any], str]:
        reply = {**manager_reply(view), "restore": restore_status(view)}
        summary = with_manager(summarise("u", topo, healthy_answers(topo)), reply, URLS)
        return summary["manager"]["restore"], render(summary, plain)

    restore, text = shown(view)
    assert [r["reason"] for r in restore["short"]] == ["grace", "grace"]
    assert "short shard 0: 2 of 3 replicas for 0.0 s; waiting out the grace (30.0 s left)" in text

    past = later + 30_000
    view, actions = decide(view, TimerTick(past, tuple((n, past) for n in "abd")))
    assert sorted((a.node, a.shard) for a in actions if isinstance(a, StartCatchUp)) == [
        ("d", 0),
        ("d", 1),
    ]
    restore, text = shown(view)
    assert restore["short"] == []
    assert {(r["shard"], r["target"]) for r in restore["restoring"]} == {(0, "d"), (1, "d")}
    assert "restoring shard 0: to d from b, for 0.0 s" in text

    # d is drained: it is no target, so a shard that loses its copy to d has nowhere to go.
    view, _ = decide(view, Drain("d"))
    view, _ = decide(view, TimerTick(past + 100, tuple((n, past + 100) for n in "ab")))
    gone = past + 100 + view.config.detection_window_ms
    view, _ = decide(view, TimerTick(gone, (("a", gone), ("b", gone))))  # d down too
    restore, text = shown(view)
    assert [r["reason"] for r in restore["short"]] == ["no_candidate", "no_candidate"]
    assert "no up, non-draining node without a replica: add a node" in text
    summary = with_manager(summarise("u", topo, healthy_answers(topo)), manager_reply(view), URLS)
    codes = [a["code"] for a in summary["alerts"]]
    assert codes.count("shard_not_restorable") == 2, codes
