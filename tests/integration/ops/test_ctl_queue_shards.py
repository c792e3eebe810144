"""``kayos ctl queue create`` and ``queue alter`` run as their own processes against real nodes
and three real manager members: create gives a new queue its shards (and a retention policy on
each); alter adds shards to a queue in use (copying its retention policy to them), every node
runs the new count, entries written before stay readable, a client that still holds the old
topology produces over the new shards and a consumer reads them once its topology is refreshed;
the refusals (an existing queue, fewer shards, more than the cluster has, an unknown queue, no
manager) are named with exit code 1."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

import kayos
from kayos import limits
from kayos.clock import ManualClock
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.manager import Config
from tests.support.cluster import ctl, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SEED = 13_047
CONFIG = Config(detection_window_ms=4_000, suspect_after_ms=2_000)


def leader_queues(cluster: LocalCluster) -> list[Any] | None:
    for member in cluster.manager_ids:
        try:
            code, body = http_json(cluster.manager_url(member) + "/v1/manager/status", timeout_s=1)
        except (OSError, ValueError):
            continue
        if code == 200 and isinstance(body, dict) and body.get("leader") == member:
            queues: list[Any] = body["view"]["queues"]
            return queues
    return None


def commit_all(client: kayos.Client, queue: str, group: str) -> list[str]:
    """Reads the group's snapshot of every shard, commits each shard's boundary: the keys read."""
    keys = []
    for page in client.consume(queue, group, page_size=100):
        keys += [m.key.decode() for m in page.messages]
        if page.end:
            client.commit(queue, group, page.boundary, shard=page.shard)
    return keys


def test_create_and_alter_through_the_manager(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    print(f"seed={SEED}")
    cluster = start_cluster(nodes=3, replicas=3, shards=3, managers=3, manager_config=CONFIG)
    cluster.wait_manager_leader()
    topology = str(cluster.topology_path)
    urls = list(cluster.urls.values())

    code, result, err = ctl(
        "queue", "create", "fresh", "--shards", "2", "--max-age-ms", "3600000",
        "--topology", topology, "--json",
    )  # fmt: skip
    print(json.dumps(result, indent=1))
    assert code == 0, (result, err)
    assert result["ok"] is True
    assert result["op"] == "queue-create"
    assert len(result["shard_ids"]) == 2
    assert set(result["nodes"]) == {"a", "b", "c"}
    assert all(r["policy"] == {"max_age_ms": 3_600_000} for r in result["retention"].values())
    assert wait_until(lambda: leader_queues(cluster), "the leader's view") == [["fresh", 2]]
    code, described, _ = ctl("queue", "describe", "fresh", "--topology", topology, "--json")
    assert code == 0, described
    assert described["shard_count"] == 2
    assert described["shard_count_from"] == "queue"
    assert [s["retention"]["policy"] for s in described["shards"]] == [
        {"max_age_ms": 3_600_000}
    ] * 2

    # A queue in use (the default: one shard), and clients that keep the topology they read now
    # (they do not follow the cluster's changes: the paths for a stale topology are tested).
    clock = ManualClock()
    with (
        kayos.Client(urls, rng=random.Random(SEED), follow=False) as stale,
        kayos.Client(urls, rng=random.Random(SEED), clock=clock, follow=False) as consumer,
    ):
        stale.produce_sharded("grow", [(f"old{i}", f"v{i}") for i in range(30)])
        assert stale.topology.shards_for("grow") == (stale.topology.shard_for("grow"),)
        assert len(commit_all(consumer, "grow", "early")) == 30
        stale.set_retention("grow", {"max_bytes": 1 << 30})  # alter copies it to the new shards

        code, _, err = ctl("queue", "create", "grow", "--shards", "2", "--topology", topology)
        assert code == 1
        assert "already exists" in err
        assert "holds entries" in err
        code, result, _ = ctl(
            "queue", "alter", "grow", "--shards", "1", "--topology", topology, "--json"
        )
        assert code == 1
        assert "never goes down" in result["error"], result
        code, result, _ = ctl(
            "queue", "alter", "grow", "--shards", "4", "--topology", topology, "--json"
        )
        assert code == 1
        assert "the cluster has 3" in result["error"], result
        code, _, err = ctl("queue", "alter", "nosuch", "--shards", "2", "--topology", topology)
        assert code == 1
        assert "unknown queue 'nosuch'" in err

        code, text, err = ctl("queue", "alter", "grow", "--shards", "3", "--topology", topology)
        assert code == 0, (text, err)
        assert "altered queue grow: 1 -> 3 shard(s)" in text
        for url in urls:
            code, body = http_json(url + "/v1/topology", timeout_s=5)
            assert body["queues"]["grow"] == {"shards": 3}, body
        assert stale.topology.queue_shard_count("grow") == 1, "this client has not refreshed"
        parts = stale.produce_sharded("grow", [(f"new{i}", f"w{i}") for i in range(30)])
        assert len({part.shard for part in parts}) == 3, parts
        assert stale.topology.queue_shard_count("grow") == 3
        # A consumer refreshes a topology older than the bound in the background as it starts a
        # snapshot; the next snapshot reads the new shards too.
        later = commit_all(consumer, "grow", "early")
        assert consumer.topology.queue_shard_count("grow") == 1, "not old enough to refresh"
        clock.advance(limits.client_topology_max_age_ms / 1000)
        later += commit_all(consumer, "grow", "early")
        wait_until(lambda: consumer.topology.queue_shard_count("grow") == 3, "a refresh")
        later += commit_all(consumer, "grow", "early")
        assert sorted(later) == sorted(f"new{i}" for i in range(30))
        assert len(consumer.marks("grow", "early")) == 3

    with kayos.Client(urls, rng=random.Random(SEED)) as client:
        read = [m for page in client.consume("grow", "all", page_size=100) for m in page.messages]
    keys = sorted(m.key.decode() for m in read)
    assert keys == sorted([f"old{i}" for i in range(30)] + [f"new{i}" for i in range(30)])
    code, described, _ = ctl("queue", "describe", "grow", "--topology", topology, "--json")
    assert code == 0, described
    assert described["shard_count"] == 3
    assert all(s["has_entries"] for s in described["shards"])
    assert [s["retention"]["policy"] for s in described["shards"]] == [{"max_bytes": 1 << 30}] * 3

    for member in cluster.manager_ids:
        cluster.kill(member)
    code, result, _ = ctl(
        "queue", "create", "later", "--shards", "2", "--topology", topology, "--json"
    )
    assert code == 1
    assert result["ok"] is False
    assert "no manager answered" in result["error"], result
