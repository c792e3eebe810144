"""End to end: a head that lost its lease from the manager makes the tail refuse new snapshots
(docs/manager.md, "Head leases"; docs/replication-protocol.md, "Confirming a snapshot").

Real node processes and three real manager members over TCP on 127.0.0.1, no network
namespaces: SIGSTOP of the two members that do not lead leaves the leader alive but without a
majority, so it commits no round and grants no lease (a leader that may have been deposed must
not vouch for a head). Within a lease the tail answers 503 `unavailable` with a message that says
why, and serves again once the members are resumed. The chain's links stay up all along: only
the lease says no."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import answered_status, produce_ok, read_snapshot, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "leased"


def consume(url: str) -> tuple[int, Any]:
    return http_json(f"{url}/v1/queues/{QUEUE}/consume?group=g&limit=10&wait_ms=0")


def lease_ms(cluster: LocalCluster, node: str) -> Any:
    status = cluster.status(node)
    return None if status is None else status.get("lease_remaining_ms")


def test_a_head_without_its_lease_makes_the_tail_refuse(tmp_path: Any) -> None:
    with LocalCluster(tmp_path, nodes=3, replicas=3, shards=1, managers=3) as cluster:
        print("\n".join(cluster.describe()))
        head, tail = cluster.head_of(QUEUE), cluster.tails_of(QUEUE)[0]
        assert (head, tail) == ("a", "c")
        produce_ok(cluster.url(head), QUEUE, [("k1", "v1"), ("k2", "v2")])
        wait_until(lambda: (lease_ms(cluster, head) or 0) > 0, "the head's first lease")
        wait_until(lambda: consume(cluster.url(tail))[0] == 200, "the tail serving")
        assert len(read_snapshot(cluster.url(tail), QUEUE, "g").messages) == 2

        leader = cluster.wait_manager_leader()
        assert leader is not None
        followers = [m for m in cluster.manager_ids if m != leader]
        pids = [cluster.pid(m) for m in followers]
        assert all(pid is not None for pid in pids)
        for pid in pids:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            refused = wait_until(
                lambda: (reply := consume(cluster.url(tail)))[0] == 503 and reply,
                "the tail refusing once the head's lease ran out",
            )
            print("refused:", refused[1])
            error = refused[1]["error"]
            assert error["code"] == "unavailable"
            assert "did not confirm the chain up to a head holding its lease" in error["message"]
            assert answered_status(cluster, head).get("lease_remaining_ms") == 0
            status = answered_status(cluster, tail)
            assert status["shards"]["0"]["upstream_linked"]  # the links are fine
        finally:
            for pid in pids:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)

        wait_until(lambda: consume(cluster.url(tail))[0] == 200, "the tail serving again")
        assert len(read_snapshot(cluster.url(tail), QUEUE, "g").messages) == 2
