"""What a dashboard reads of a live cluster (docs/node-api.md, "Metrics"): every sample of every
node's ``/metrics`` carries the node's ``node`` and the cluster's ``cluster`` label; every metric
the Grafana dashboard (deploy/grafana/kayos.json) queries is served by a live node; a group's lag
in messages and seconds is on ``/metrics`` and in ``kayos ctl status``, and drops to 0 once the
group has committed what it read."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import WAIT_S, commit_group, ctl, produce_ok, wait_until
from tests.support.deploy.promql import dashboard_expressions, metric_names, samples

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "kayos.json"
QUEUE = "watched"
GROUP = "reader"

Samples = list[tuple[str, dict[str, str], float]]


def scrape(cluster: LocalCluster, node: str) -> Samples:
    with urllib.request.urlopen(f"{cluster.url(node)}/metrics", timeout=WAIT_S) as response:
        return samples(response.read().decode())


def consumer_lag(cluster: LocalCluster, tail: str) -> tuple[float, float] | None:
    """The group's ``(messages, seconds)`` on the tail's ``/metrics`` (None: not reported)."""
    found: dict[str, float] = {}
    for name, labels, value in scrape(cluster, tail):
        if labels.get("queue") == QUEUE and labels.get("group") == GROUP:
            found[name] = value
    if "kayos_consumer_lag_messages" not in found or "kayos_consumer_lag_seconds" not in found:
        return None
    return found["kayos_consumer_lag_messages"], found["kayos_consumer_lag_seconds"]


def test_every_dashboard_metric_is_served_by_a_live_node_with_node_and_cluster_labels(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    identity = cluster.topology.identity
    assert identity is not None
    head = cluster.url(cluster.head_of(QUEUE))
    produce_ok(head, QUEUE, [(f"k{i}", f"v{i}") for i in range(5)])
    cluster.wait_replicated()
    tail_id = cluster.topology.chain_for(QUEUE).tails[0]
    tail = cluster.url(tail_id)
    status, page = http_json(f"{tail}/v1/queues/{QUEUE}/consume?group={GROUP}&limit=2")
    assert status == 200, page
    assert len(page["messages"]) == 2, page
    commit_group(head, QUEUE, GROUP, page["messages"][-1]["seq"])

    served: dict[str, Samples] = {node: scrape(cluster, node) for node in cluster.ids}
    for node, found in served.items():
        unlabelled = [
            (name, labels)
            for name, labels, _ in found
            if labels.get("node") != node or labels.get("cluster") != identity.cluster_id
        ]
        assert found, node
        assert not unlabelled, (node, unlabelled[:5])
    names = {name for found in served.values() for name, _, _ in found}
    expressions = dashboard_expressions(DASHBOARD)
    wanted: dict[str, str] = {}
    for expression in expressions:
        wanted |= dict.fromkeys(metric_names(expression), expression)
    print(f"{len(expressions)} expressions, {len(wanted)} metric names: {sorted(wanted)}")
    assert len(wanted) >= 15, wanted
    missing = {name: expression for name, expression in wanted.items() if name not in names}
    assert not missing, missing

    # The group's lag: 3 unread on the tail, then (after a commit of all) none.
    messages, seconds = wait_until(lambda: consumer_lag(cluster, tail_id), "the group's lag")
    assert messages == 3
    assert seconds >= 0
    aged = wait_until(
        lambda: (lag := consumer_lag(cluster, tail_id)) and lag[1] >= 1.0 and lag,
        "the unread messages aging past 1 s",
    )
    assert aged[0] == 3, aged
    code, summary, err = ctl("status", "--cluster", head, "--json")
    assert code in (0, 1), err
    groups = [g for s in summary["shards"] for g in s["groups"] if g["group"] == GROUP]
    assert len(groups) == 1, summary["shards"]
    assert groups[0]["lag_messages"] == 3, groups
    assert groups[0]["lag_seconds"] is not None, groups
    assert groups[0]["lag_seconds"] >= 1.0, groups
    assert groups[0]["node"] == tail_id, groups
    assert groups[0]["lag_exact"] is True, groups
    code, text, err = ctl("status", "--cluster", head)
    assert f"group {QUEUE}/{GROUP}: mark" in text, text
    assert "lag 3 messages" in text, text

    last = max(s["last_seq"] for s in summary["shards"] if s["groups"])
    commit_group(head, QUEUE, GROUP, last)
    wait_until(
        lambda: consumer_lag(cluster, tail_id) == (0.0, 0.0),
        "lag 0 messages and 0 seconds after committing everything",
    )
    head_samples = scrape(cluster, cluster.head_of(QUEUE))
    produced = sum(v for n, _, v in head_samples if n == "kayos_produced_messages_total")
    consumed = sum(
        v for n, _, v in scrape(cluster, tail_id) if n == "kayos_consumed_messages_total"
    )
    assert (produced, consumed) == (5, 2)
