"""``kayos ctl status``'s pure summary (kayos/cli/ctl/status/view.py) fed canned ``/v1/status``
replies: health, alerts, link states, replication, the JSON schema and the text with and without
colour."""

from __future__ import annotations

import copy
import json
from typing import Any

import click
import pytest

from kayos import limits
from kayos.cli.ctl.status.common import EXIT_DEGRADED, EXIT_HEALTHY, EXIT_UNREACHABLE, NodeAnswer
from kayos.cli.ctl.status.view import SCHEMA_VERSION, render, summarise, unreachable
from tests.support.answers import healthy_answers, topology

pytestmark = pytest.mark.unit

SOURCE = "http://127.0.0.1:7101"


def replica(answers: dict[str, NodeAnswer], node: str, shard: int) -> dict[str, Any]:
    answer = answers[node]
    assert isinstance(answer, dict)
    result: dict[str, Any] = answer["shards"][str(shard)]
    return result


def set_link(
    answers: dict[str, NodeAnswer], node: str, shard: int, peer: str, **fields: Any
) -> None:
    for entry in replica(answers, node, shard)["links"]:
        if entry["peer"] == peer:
            entry.update(fields)


def codes(summary: dict[str, Any]) -> list[str]:
    return sorted(alert["code"] for alert in summary["alerts"])


def link_of(summary: dict[str, Any], shard: int, start: str, end: str) -> dict[str, Any]:
    links = summary["shards"][shard]["links"]
    found: dict[str, Any] = next(x for x in links if x["from"] == start and x["to"] == end)
    return found


def test_a_healthy_cluster_has_no_alerts_and_every_shard_fully_replicated() -> None:
    topo = topology()
    summary = summarise(SOURCE, topo, healthy_answers(topo))
    assert summary["health"] == "healthy"
    assert summary["exit_code"] == EXIT_HEALTHY
    assert summary["alerts"] == []
    assert summary["epoch"] == 1
    assert [node["reachable"] for node in summary["nodes"]] == [True, True, True]
    assert [shard["chain"] for shard in summary["shards"]] == [["a", "b", "c"], ["b", "c", "a"]]
    for shard in summary["shards"]:
        assert shard["fully_replicated"] is True
        assert shard["in_sync"] == shard["chain"]
        assert [link["state"] for link in shard["links"]] == ["up", "up"]
        assert shard["last_seq"] == 50
    assert link_of(summary, 1, "c", "a")["reported_by"] == ["c", "a"]


def test_a_paused_middle_is_unreachable_its_links_down_and_its_shards_under_replicated() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    answers["b"] = "OperationTimeoutError: GET http://127.0.0.1:7102/v1/status: no reply in 2.0s"
    set_link(answers, "a", 0, "b", up=False, last_heard_s=4.2, lag_entries=7)
    set_link(answers, "c", 0, "b", up=False, last_heard_s=4.1)
    summary = summarise(SOURCE, topo, answers)
    assert summary["exit_code"] == EXIT_DEGRADED
    assert summary["health"] == "degraded"
    assert codes(summary) == [
        "link_down",
        "link_down",
        "node_unreachable",
        "shard_under_replicated",
        "shard_under_replicated",
    ]
    down = link_of(summary, 0, "a", "b")
    assert down["state"] == "down"
    assert down["reported_by"] == ["a"]
    assert down["down_at"] == ["a"]
    assert down["lag_entries"] == 7
    assert down["last_heard_s"] == 4.2
    shard0 = summary["shards"][0]
    assert shard0["fully_replicated"] is False
    assert shard0["in_sync"] == ["a"]  # c's only path from the head runs through b
    # S1 b->c->a: b is its head and silent; nothing below an unreachable head is in sync.
    assert summary["shards"][1]["in_sync"] == []
    assert summary["shards"][1]["last_seq"] is None
    node_b = next(node for node in summary["nodes"] if node["id"] == "b")
    assert node_b["reachable"] is False
    assert "no reply" in node_b["error"]


def test_a_link_seen_down_by_one_end_is_down_and_one_no_end_answers_for_is_unknown() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    set_link(answers, "c", 0, "b", up=False, last_heard_s=3.5)  # b still thinks it is up
    summary = summarise(SOURCE, topo, answers)
    assert link_of(summary, 0, "b", "c")["state"] == "down"
    assert link_of(summary, 0, "b", "c")["down_at"] == ["c"]
    assert summary["shards"][0]["in_sync"] == ["a", "b"]
    assert codes(summary) == ["link_down", "shard_under_replicated"]

    answers = healthy_answers(topo)
    answers["b"] = answers["c"] = "UnavailableError: connection refused"
    summary = summarise(SOURCE, topo, answers)
    assert link_of(summary, 0, "b", "c")["state"] == "unknown"
    assert link_of(summary, 0, "b", "c")["lag_entries"] is None
    assert "link_down" not in codes(summary)  # a has its own view of a -> b only
    assert codes(summary).count("node_unreachable") == 2


def test_a_catching_up_replica_is_an_alert_and_not_in_sync() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    replica(answers, "c", 0)["catching_up"] = True
    summary = summarise(SOURCE, topo, answers)
    assert codes(summary) == ["replica_catching_up", "shard_under_replicated"]
    assert summary["shards"][0]["in_sync"] == ["a", "b"]
    assert summary["shards"][1]["fully_replicated"] is True
    assert "c: catching up" in render(summary, lambda text, **_: text)


def test_a_replica_whose_disk_is_full_is_a_critical_alert() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    replica(answers, "a", 0)["disk_full"] = True
    summary = summarise(SOURCE, topo, answers)
    assert codes(summary) == ["disk_full"]
    assert summary["alerts"][0]["severity"] == "critical"
    assert summary["exit_code"] == 1


def test_lag_above_the_bound_on_an_up_link_is_a_warning_below_it_nothing() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    set_link(answers, "a", 0, "b", lag_entries=limits.ctl_link_lag_alert_entries)
    assert summarise(SOURCE, topo, answers)["alerts"] == []
    set_link(answers, "a", 0, "b", lag_entries=limits.ctl_link_lag_alert_entries + 1)
    summary = summarise(SOURCE, topo, answers)
    assert codes(summary) == ["link_lagging"]
    assert summary["alerts"][0]["severity"] == "warning"
    assert summary["alerts"][0]["link"] == ["a", "b"]
    assert summary["shards"][0]["fully_replicated"] is True


def test_epoch_role_readiness_missing_replica_and_committed_rollback_alerts() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    node_a = answers["a"]
    assert isinstance(node_a, dict)
    node_a["epoch"] = 2
    node_a["ready"] = False
    replica(answers, "b", 0)["role"] = "head"
    replica(answers, "c", 1)["rolled_back_committed_entries"] = 3
    node_c = answers["c"]
    assert isinstance(node_c, dict)
    del node_c["shards"]["0"]
    summary = summarise(SOURCE, topo, answers)
    assert codes(summary) == [
        "committed_entries_rolled_back",
        "epoch_mismatch",
        "node_not_ready",
        "replica_missing",
        "role_mismatch",
        "shard_under_replicated",
    ]
    by_code = {alert["code"]: alert for alert in summary["alerts"]}
    assert by_code["committed_entries_rolled_back"]["severity"] == "critical"
    assert by_code["replica_missing"] == {
        "severity": "critical",
        "code": "replica_missing",
        "message": "shard 0: node c serves no replica of it",
        "shard": 0,
        "node": "c",
    }


def test_a_repairing_store_is_a_warning_and_its_repair_state_is_shown() -> None:
    """Each member carries its replica's ``repair`` (docs/node-api.md, "Self-repair"): null when
    its store verified; ``repairing`` or ``damaged`` is a warning, ``repaired`` is shown only."""
    topo = topology()
    answers = healthy_answers(topo)
    repairing = {"state": "repairing", "kept_seq": 40, "lost_from_offset": 4096,
                 "problem": "bad crc", "refetched_entries": 0}  # fmt: skip
    replica(answers, "b", 0)["repair"] = repairing
    summary = summarise(SOURCE, topo, answers)
    assert codes(summary) == ["replica_repairing"]
    assert summary["alerts"][0] | {"message": ""} == {
        "severity": "warning", "code": "replica_repairing", "message": "", "shard": 0, "node": "b",
    }  # fmt: skip
    members = {m["node"]: m for m in summary["shards"][0]["members"]}
    assert members["b"]["repair"] == repairing
    assert members["a"]["repair"] is None
    text = render(summary, lambda text, **_: text)
    assert "  b: repair repairing, kept seqs 1..40 (bad crc)" in text
    replica(answers, "b", 0)["repair"] = {**repairing, "state": "repaired", "refetched_entries": 9}
    summary = summarise(SOURCE, topo, answers)
    assert summary["alerts"] == []
    text = render(summary, lambda text, **_: text)
    assert "  b: repair repaired, kept seqs 1..40, re-fetched 9 entries (bad crc)" in text


def test_fanout_tails_each_get_a_link_from_the_last_of_the_chain() -> None:
    topo = topology(fanout=("d",))
    summary = summarise(SOURCE, topo, healthy_answers(topo))
    shard = summary["shards"][0]
    assert [(x["from"], x["to"]) for x in shard["links"]] == [("a", "b"), ("b", "c"), ("b", "d")]
    assert shard["tails"] == ["c", "d"]
    assert summary["alerts"] == []
    assert "a -> b -> {c, d}" in render(summary, lambda text, **_: text)


def test_a_node_missing_from_the_answers_counts_as_unreachable() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    del answers["c"]
    summary = summarise(SOURCE, topo, answers)
    assert "node_unreachable" in codes(summary)
    assert summary["exit_code"] == EXIT_DEGRADED


def test_the_unreachable_summary_exits_2_and_names_the_urls() -> None:
    summary = unreachable([SOURCE], "connection refused")
    assert summary["exit_code"] == EXIT_UNREACHABLE
    assert summary["health"] == "unreachable"
    assert codes(summary) == ["cluster_unreachable"]
    assert SOURCE in summary["alerts"][0]["message"]
    assert "UNREACHABLE" in render(summary, lambda text, **_: text)


def test_the_json_schema_keys_are_stable() -> None:
    """The documented schema (docs/operations.md): a change here is a change for every script."""
    topo = topology()
    answers = healthy_answers(topo)
    answers["b"] = "UnavailableError: refused"
    summary = json.loads(json.dumps(summarise(SOURCE, topo, answers)))
    assert summary["schema"] == SCHEMA_VERSION == 1
    assert set(summary) == {
        "schema", "health", "exit_code", "source", "epoch", "nodes", "shards", "alerts", "auth"
    }  # fmt: skip
    assert set(summary["auth"]) == {"mode", "table_version", "versions"}
    assert set(summary["nodes"][0]) == {"id", "url", "reachable", "error", "epoch", "ready", "auth"}
    shard = summary["shards"][0]
    assert set(shard) == {
        "id", "chain", "fanout", "head", "tails", "last_seq", "committed_seq",
        "fully_replicated", "in_sync", "members", "links", "groups",
    }  # fmt: skip
    assert set(shard["members"][0]) == {
        "node", "role", "reachable", "last_seq", "committed_seq", "catching_up",
        "rolled_back_entries", "rolled_back_committed_entries", "repair",
    }  # fmt: skip
    assert set(shard["links"][0]) == {
        "from", "to", "state", "last_heard_s", "lag_entries", "reported_by", "down_at"
    }  # fmt: skip
    for alert in summary["alerts"]:
        assert {"severity", "code", "message"} <= set(alert)
        assert alert["severity"] in {"critical", "warning"}


def test_a_node_behind_on_credentials_is_a_warning_and_open_is_said() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    for node, version in zip(("a", "b", "c"), (3, 3, 2), strict=False):
        answer = answers[node]
        assert isinstance(answer, dict)
        answer["auth"] = {"mode": "credentials", "table_version": version, "credentials": 2}
    summary = summarise(SOURCE, topo, answers)
    assert summary["auth"]["mode"] == "credentials"
    assert [a["code"] for a in summary["alerts"]] == ["credentials_behind"]
    assert "node c" in summary["alerts"][0]["message"]
    for answer in answers.values():
        assert isinstance(answer, dict)
        answer["auth"] = {"mode": "open", "table_version": 0, "credentials": 0}
    opened = summarise(SOURCE, topo, answers)
    assert opened["alerts"] == []
    assert "auth: OPEN" in render(opened, lambda text, **_: text)


def test_each_shards_groups_and_their_lag_come_from_its_tail() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    lag = {"queue": "q", "group": "g", "hwm": 7, "boundary": 12, "lag_messages": 5}
    replica(answers, "c", 0)["groups"] = [{**lag, "lag_seconds": 4.25, "lag_exact": True}]
    # A member that is not the tail is not asked for its groups' lag (and would not count).
    replica(answers, "a", 0)["groups"] = [{**lag, "lag_seconds": 99.0, "lag_exact": True}]
    replica(answers, "a", 1)["groups"] = [{**lag, "lag_seconds": None, "lag_exact": False}]
    summary = summarise(SOURCE, topo, answers)
    (group,) = summary["shards"][0]["groups"]
    assert group == {**lag, "lag_seconds": 4.25, "lag_exact": True, "node": "c"}
    assert summary["shards"][1]["groups"][0]["node"] == "a"
    text = render(summary, lambda text, **_: text)
    assert "group q/g: mark 7, lag 5 messages, 4.2 s (at c)" in text
    assert "group q/g: mark 7, lag about 5 messages, age unknown (at a)" in text
    assert summary["health"] == "healthy"


def test_text_has_colour_only_when_styled() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    answers["b"] = "UnavailableError: refused"
    summary = summarise(SOURCE, topo, answers)
    plain = render(summary, lambda text, **_: text)
    assert "\x1b[" not in plain
    assert plain.startswith("cluster: DEGRADED (epoch 1, from http://127.0.0.1:7101), 3 alerts")
    assert "b  http://127.0.0.1:7102  UNREACHABLE  UnavailableError: refused" in plain
    assert "a -> b  DOWN" not in plain  # a's view of a -> b is still up in these replies
    assert "CRITICAL node_unreachable: node b: UnavailableError: refused" in plain
    coloured = render(summary, click.style)
    assert "\x1b[31m" in coloured  # red
    assert click.unstyle(coloured) == plain
    healthy = render(summarise(SOURCE, topo, healthy_answers(topo)), click.style)
    assert "\x1b[32m" in healthy
    assert "alerts:" not in healthy


def test_summarise_does_not_change_its_inputs() -> None:
    topo = topology()
    answers = healthy_answers(topo)
    answers["c"] = "refused"
    before = copy.deepcopy(answers)
    summarise(SOURCE, topo, answers)
    assert answers == before
