"""Replicated metadata under load: every consumer-group commit reaches every replica, whether the
link forwards batches from memory or reads them back from the store."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import produce, wait_until

pytestmark = pytest.mark.integration


def groups_on(cluster: LocalCluster, node: str, shard: int) -> dict[tuple[str, str], int]:
    status, body = http_json(f"{cluster.url(node)}/v1/shards/{shard}/groups")
    assert status == 200, body
    return {(g["queue"], g["group"]): g["hwm"] for g in body["groups"]}


def test_group_commits_during_produce_reach_every_replica(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    head = cluster.head_of("meta")
    stop = threading.Event()
    errors: list[Any] = []

    def producer() -> None:
        i = 0
        while not stop.is_set():
            status, body = produce(cluster.url(head), "meta", [(f"k{i}", "v")], acks="1")
            if status != 200:
                errors.append(body)
            i += 1

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        for round_ in range(30):
            group = f"g{round_ % 5}"
            status, body = http_json(
                f"{cluster.url(head)}/v1/queues/meta/groups/{group}/commit",
                method="POST",
                body={"hwm": round_},
            )
            assert status == 200, body
        http_json(f"{cluster.url(head)}/v1/queues/meta/groups/g4", method="DELETE")
    finally:
        stop.set()
        thread.join()
    assert not errors
    expected = groups_on(cluster, head, 0)
    assert expected == {("meta", f"g{i}"): 25 + i for i in range(4)}
    for node in cluster.ids:

        def agrees(node: str = node) -> bool:
            return groups_on(cluster, node, 0) == expected

        wait_until(agrees, f"the groups on {node}")
