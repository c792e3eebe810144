"""Real `kayos manager` members (three processes, Raft over loopback) beside real nodes
(LocalCluster(managers=3)): leader failover after kill -9, agreement of every member's view
(view_hash at the same applied entry), remove-node through the real CLI, and a whole-group restart
that keeps the view (docs/manager.md, "Running it")."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.manager import Config
from kayos.signing import sign
from tests.support.cluster import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# A new leader within this of the kill: Raft's election timeouts (0.15-0.45 s) measured 0.6-0.8 s
# on an idle machine; the bound leaves room for two shared, busy cores.
FAILOVER_BOUND_S = 5.0
CONFIG = Config(detection_window_ms=2_000, suspect_after_ms=1_000)


def manager_status(cluster: LocalCluster, member: str) -> dict[str, Any] | None:
    """The member's ``GET /v1/manager/status``, None when it gives no answer in time (a loaded
    box) or an error: for a condition polled by ``wait_until``."""
    try:
        code, body = http_json(cluster.manager_url(member) + "/v1/manager/status", timeout_s=1.0)
    except (OSError, ValueError):
        return None
    return body if code == 200 and isinstance(body, dict) else None


def answered_statuses(cluster: LocalCluster, members: list[str]) -> list[dict[str, Any]]:
    """Every member's status, each asked again until it answers (within the bound)."""
    return [
        wait_until(lambda m=m: manager_status(cluster, m), f"manager member {m} to answer")
        for m in members
    ]


def agreed_entry(cluster: LocalCluster, members: list[str]) -> int | None:
    """The latest entry every member has applied, once each member's view hash after it is the
    same (asserted for every entry they share); None while they share none."""
    statuses = [manager_status(cluster, m) for m in members]
    if any(s is None for s in statuses):
        return None
    histories = [{int(i): h for i, h in s["recent_hashes"]} for s in statuses if s]
    common = set.intersection(*(set(h) for h in histories))
    for entry in common:
        hashes = {h[entry] for h in histories}
        assert len(hashes) == 1, f"members diverged at entry {entry}: {hashes}"
    return max(common) if common else None


def leader_of(cluster: LocalCluster, members: list[str], not_: str | None = None) -> str | None:
    """The leader the members that answer name, once they name one (a member with no answer
    in time is left out: it contradicts nobody)."""
    statuses = [manager_status(cluster, m) for m in members]
    leaders = {s["leader"] for s in statuses if s is not None}
    if len(leaders) != 1:
        return None
    leader = leaders.pop()
    return leader if leader is not None and leader != not_ else None


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with LocalCluster(tmp_path, nodes=3, replicas=3, managers=3, manager_config=CONFIG) as c:
        yield c


def test_kill_9_of_the_leader_elects_another_and_every_view_agrees(cluster: LocalCluster) -> None:
    members = cluster.manager_ids
    leader = wait_until(lambda: leader_of(cluster, members), "a leader")
    wait_until(lambda: agreed_entry(cluster, members), "members agreeing on an entry")

    killed_at = time.monotonic()
    cluster.kill(leader)
    others = [m for m in members if m != leader]
    new = wait_until(lambda: leader_of(cluster, others, not_=leader), "a new leader", 30)
    failover_s = time.monotonic() - killed_at
    print(f"manager leader {leader} killed: {new} leads after {failover_s:.2f}s")
    assert failover_s < FAILOVER_BOUND_S
    # The new leader logged ManagerLeaderChanged, applied by both survivors alike.
    wait_until(lambda: agreed_entry(cluster, others), "the survivors agreeing")
    assert "became leader" in cluster.log_path(new).read_text()

    cluster.start(leader, wait=False)
    first = wait_until(lambda: agreed_entry(cluster, members), "the restarted member agreeing")
    # and they keep agreeing as the leader logs more rounds
    wait_until(lambda: (agreed_entry(cluster, members) or 0) > first, "more agreed entries")
    statuses = answered_statuses(cluster, members)
    assert {s["leader"] for s in statuses} == {new}
    assert {s["epoch"] for s in statuses} == {1}  # no node was lost: no chain changed


def remove_with_cli(cluster: LocalCluster, node: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "kayos", "ctl", "remove-node", node, "--json",
         "--topology", str(cluster.topology_path)],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def test_remove_node_through_the_cli_and_a_whole_group_restart_keeps_the_view(
    cluster: LocalCluster,
) -> None:
    members = cluster.manager_ids
    leader = wait_until(lambda: leader_of(cluster, members), "a leader")

    code, reply = remove_with_cli(cluster, "c")
    assert code == 0, reply
    assert reply["ok"] is True
    assert reply["node"] == "c"
    assert reply["state"] == "removed"
    assert reply["epoch"] == 2

    def everyone_removed_c() -> bool:
        statuses = [manager_status(cluster, m) for m in members]
        return all(
            s is not None and s["view"]["nodes"][2][:2] == ["c", "removed"] for s in statuses
        )

    wait_until(everyone_removed_c, "every member holding c removed")
    wait_until(lambda: agreed_entry(cluster, members), "members agreeing")
    (status,) = answered_statuses(cluster, [leader])
    assert [s["chain"] for s in status["view"]["shards"]] == [["a", "b"], ["b", "a"], ["a", "b"]]

    # An unknown node, a bad MAC, a follower: each refused with its own error.
    code, reply = remove_with_cli(cluster, "zz")
    assert code == 1
    assert "unknown node" in reply["error"]
    body = {"node": "b"}
    url = cluster.manager_url(leader) + "/v1/manager/remove-node"
    code, error = http_json(url, method="POST", body={"body": body, "mac": "00" * 32})
    assert (code, error["error"]["code"]) == (401, "unauthenticated")
    follower = next(m for m in members if m != leader)
    signed = {"body": body, "mac": sign(cluster.identity, "remove-node", body)}
    code, error = http_json(
        cluster.manager_url(follower) + "/v1/manager/remove-node", method="POST", body=signed
    )
    assert (code, error["error"]["code"]) == (421, "not_leader")
    assert error["error"]["redirect"] == cluster.manager_url(leader)

    # Every member stops; started again from their data directories, the view is still there.
    for member in members:
        cluster.kill(member, signal.SIGTERM)
    for member in members:
        cluster.start(member, wait=False)
    cluster.wait_manager_leader()
    wait_until(everyone_removed_c, "the view kept across a whole-group restart")
    statuses = answered_statuses(cluster, members)
    assert {s["epoch"] for s in statuses} == {2}
    wait_until(lambda: agreed_entry(cluster, members), "members agreeing after the restart")


def test_ctl_status_json_shows_the_managers_view(cluster: LocalCluster) -> None:
    leader = wait_until(lambda: leader_of(cluster, cluster.manager_ids), "a leader")
    done = subprocess.run(
        [sys.executable, "-m", "kayos", "ctl", "status", "--json",
         "--cluster", cluster.url("a"), "--topology", str(cluster.topology_path)],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    summary = json.loads(done.stdout)
    manager = summary["manager"]
    assert manager["reachable"] is True
    assert manager["leader"] == leader
    assert manager["member"] == leader  # the leader's own answer is preferred
    assert manager["nodes"] == [{"id": n, "state": "up"} for n in "abc"]
    assert [s["chain"] for s in manager["shards"]] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
    ]
    # Nothing is wrong: the nodes run the manager's epoch, every shard is replicated.
    assert (done.returncode, summary["health"]) == (0, "healthy"), summary["alerts"]


def test_the_detection_window_in_the_file_is_the_one_members_use(cluster: LocalCluster) -> None:
    status = wait_until(lambda: manager_status(cluster, "m1"), "m1 answering")
    assert status["view"]["config"]["detection_window_ms"] == CONFIG.detection_window_ms
    assert limits.manager_poll_interval_ms < CONFIG.suspect_after_ms
