"""``kayos ctl status`` run as its own process against real node processes: a healthy cluster
exits 0 with every link up; a paused (SIGSTOP) middle shows as unreachable with its links down
(exit 1) and the cluster is healthy again after SIGCONT; a killed node is unreachable (exit 1);
no node at the URL exits 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.ports import free_ports
from tests.support.cluster import WAIT_S, produce_ok, wait_until

pytestmark = pytest.mark.integration

SILENCE_S = limits.peer_silence_ms_max / 1000
# How late the silence bound may be seen on 2 shared cores (as in test_liveness.py) plus a few
# status runs (a Python start each, and a paused node costs one its per-node reply bound).
SLACK_S = limits.ping_interval_ms / 1000 + 10.0


def ctl_status(url: str, *extra: str) -> tuple[int, Any]:
    """Runs ``kayos ctl status --cluster URL`` (``--json`` unless ``extra`` says otherwise; the
    default per-node timeout): its exit code and its parsed JSON (or its text)."""
    args = ["--json"] if not extra else list(extra)
    command = [sys.executable, "-m", "kayos", "ctl", "status", "--cluster", url, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, check=False)
    if "--json" in args:
        return done.returncode, json.loads(done.stdout)
    return done.returncode, done.stdout


def link(summary: dict[str, Any], shard: int, start: str, end: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        x for x in summary["shards"][shard]["links"] if x["from"] == start and x["to"] == end
    )
    return found


def healthy(url: str) -> dict[str, Any] | None:
    code, summary = ctl_status(url)
    return summary if code == 0 else None


def answered_by(summary: dict[str, Any], nodes: list[str]) -> bool:
    """Every one of ``nodes`` answered the run behind ``summary``: a node that missed its reply
    bound on a loaded box shows unreachable, which is no picture of the cluster to assert on."""
    reachable = {node["id"]: node["reachable"] for node in summary.get("nodes", [])}
    return all(reachable.get(node) for node in nodes)


def test_a_healthy_cluster_exits_0_with_every_link_up(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    head = cluster.topology.shards[0].head
    queue = next(q for q in (f"q{i}" for i in range(1000)) if cluster.topology.shard_for(q) == 0)
    first, last = produce_ok(cluster.url(head), queue, [(f"k{i}", "v") for i in range(10)])
    cluster.wait_replicated()
    # Links come up a moment after the nodes say ready: poll for health within a bound.
    summary = wait_until(lambda: healthy(cluster.url("a")), "ctl status to report healthy")
    assert summary["health"] == "healthy"
    assert summary["alerts"] == []
    assert summary["epoch"] == cluster.topology.epoch
    assert [node["id"] for node in summary["nodes"]] == ["a", "b", "c"]
    assert all(node["reachable"] for node in summary["nodes"])
    assert [shard["chain"] for shard in summary["shards"]] == [
        list(cluster.topology.shards[s].chain) for s in range(3)
    ]
    for shard in summary["shards"]:
        assert shard["fully_replicated"] is True
        assert [x["state"] for x in shard["links"]] == ["up", "up"]
        assert all(x["reported_by"] == [x["from"], x["to"]] for x in shard["links"])
        assert all(x["lag_entries"] == 0 for x in shard["links"])
    assert summary["shards"][0]["last_seq"] >= last >= first

    # A node missing the reply bound on a loaded box makes one run degraded: ask again.
    code, text = wait_until(
        lambda: (found := ctl_status(cluster.url("c"), "--timeout", "5"))[0] == 0 and found,
        "ctl status (text) to report healthy",
    )
    assert code == 0, text
    assert text.startswith("cluster: HEALTHY (epoch 1, from ")
    assert "\x1b[" not in text, "no colour when stdout is not a terminal"
    assert f"shard 0: {' -> '.join(cluster.topology.shards[0].chain)}" in text


def test_a_paused_middle_shows_unreachable_and_its_links_down_then_recovers(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    head, middle, tail = cluster.topology.shards[0].chain
    wait_until(lambda: healthy(cluster.url(head)), "ctl status to report healthy")
    process = cluster.processes[middle]
    process.send_signal(signal.SIGSTOP)
    try:

        def middle_link_down() -> dict[str, Any] | None:
            code, summary = ctl_status(cluster.url(head))
            down = link(summary, 0, head, middle)["state"] == "down"
            return summary if code == 1 and down and answered_by(summary, [head, tail]) else None

        summary = wait_until(
            middle_link_down,
            "ctl status to show the paused middle's link down",
            SILENCE_S + SLACK_S,
        )
    finally:
        process.send_signal(signal.SIGCONT)
    print(json.dumps(summary["alerts"], indent=1))
    assert summary["health"] == "degraded"
    nodes = {node["id"]: node for node in summary["nodes"]}
    assert nodes[middle]["reachable"] is False
    assert "no reply" in nodes[middle]["error"]
    assert nodes[head]["reachable"]
    assert nodes[tail]["reachable"]
    first = link(summary, 0, head, middle)
    assert first["down_at"] == [head]
    assert first["last_heard_s"] >= SILENCE_S
    assert summary["shards"][0]["fully_replicated"] is False
    assert summary["shards"][0]["in_sync"] == [head]
    found = {(a["code"], a.get("node"), tuple(a.get("link", ()))) for a in summary["alerts"]}
    assert ("node_unreachable", middle, ()) in found
    assert ("link_down", None, (head, middle)) in found
    assert {a["shard"] for a in summary["alerts"] if a["code"] == "shard_under_replicated"} == {
        0,
        1,
        2,
    }
    # After SIGCONT the middle relinks and the cluster is reported healthy again, by itself.
    wait_until(lambda: healthy(cluster.url(head)), "ctl status to report healthy after SIGCONT")


def test_a_killed_node_is_unreachable_and_exit_is_1(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    wait_until(lambda: healthy(cluster.url("a")), "ctl status to report healthy")
    cluster.kill("c", signal.SIGKILL)

    def a_and_b_answered() -> tuple[int, Any] | None:
        found = ctl_status(cluster.url("a"))
        return found if answered_by(found[1], ["a", "b"]) else None

    code, summary = wait_until(a_and_b_answered, "ctl status with a and b answering")
    assert code == 1
    nodes = {node["id"]: node for node in summary["nodes"]}
    assert nodes["c"]["reachable"] is False
    assert nodes["a"]["reachable"]
    assert nodes["b"]["reachable"]
    assert ("node_unreachable", "c") in {(a["code"], a.get("node")) for a in summary["alerts"]}
    # c is in every shard (3 nodes, replication factor 3): none is fully replicated.
    assert not any(shard["fully_replicated"] for shard in summary["shards"])
    assert all("c" not in shard["in_sync"] for shard in summary["shards"])
    # Once its neighbours notice, they show the links into c down too.
    wait_until(
        lambda: link(ctl_status(cluster.url("a"))[1], 0, "b", "c")["state"] == "down",
        "b's link to the killed c to show down",
        SILENCE_S + SLACK_S,
    )


def test_no_node_at_the_url_exits_2() -> None:
    (port,) = free_ports(1)
    code, summary = ctl_status(f"http://127.0.0.1:{port}")
    assert code == 2
    assert summary["health"] == "unreachable"
    assert [alert["code"] for alert in summary["alerts"]] == ["cluster_unreachable"]
    assert str(port) in summary["alerts"][0]["message"]
