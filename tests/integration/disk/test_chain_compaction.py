"""Nodes compact their stores in the background once superseded versions pile up, on every
replica, while the data stays readable."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import produce, wait_until

pytestmark = pytest.mark.integration


def file_bytes(cluster: LocalCluster, node: str) -> int:
    with urllib.request.urlopen(f"{cluster.url(node)}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(r'^kayos_shard_file_bytes\{[^}]*shard="0"[^}]*\} (\S+)$', text, re.M)
    assert found, text
    return int(float(found.group(1)))


def test_superseded_versions_are_compacted_away_on_every_replica(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    head = cluster.head_of("hot")
    value = "v" * 40
    # 30 versions of the same 5,000 keys: 150,000 seqs, of which the versions superseded before
    # the rollback window (the newest limits.rollback_window_seqs seqs) may go.
    assert limits.rollback_window_seqs <= 100_000
    # The compactor may run while the rounds go in (it checks every few seconds), so the peak is
    # the largest size seen after any round, not the size at the end.
    peak = dict.fromkeys(cluster.ids, 0)
    for round_ in range(30):
        status, body = produce(
            cluster.url(head), "hot", [(f"key-{i}", f"{round_:02}{value}") for i in range(5000)]
        )
        assert status == 200, body
        for node in cluster.ids:
            peak[node] = max(peak[node], file_bytes(cluster, node))
    assert all(size > 1024 * 1024 for size in peak.values()), peak
    for node in cluster.ids:

        def shrank(node: str = node) -> bool:
            return file_bytes(cluster, node) < peak[node] * 0.8

        wait_until(shrank, f"the store on {node} to be compacted", timeout_s=60)
    tail = cluster.tails_of("hot")[0]
    status, page = http_json(f"{cluster.url(tail)}/v1/queues/hot/consume?group=g&limit=10000")
    assert status == 200, page
    assert len(page["messages"]) == 5000
    assert {m["value"][:2] for m in page["messages"]} == {"29"}
