"""A clean stop (SIGTERM) of a head while a group commit waits on a paused chain member: the node
gives the request limits.http_shutdown_ms_max, then stops and exits 0, well inside the
launcher's stop bound (found by the chaos campaign: the stop used to wait for the commit's own
30 s bound, and the launcher killed the node after 10 s)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import produce_ok, wait_until

pytestmark = pytest.mark.integration


def test_sigterm_with_a_commit_waiting_on_a_paused_member(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    head = cluster.topology.shards[0].head
    queue = next(f"q{i}" for i in range(1000) if cluster.topology.shard_for(f"q{i}") == 0)
    last = cluster.topology.shards[0].tails[0]
    _first, before = produce_ok(cluster.url(head), queue, [("k", "v")])
    result: dict[str, Any] = {}

    def commit() -> None:
        try:
            result["reply"] = http_json(
                f"{cluster.url(head)}/v1/queues/{queue}/groups/g/commit",
                method="POST",
                body={"hwm": 1},
                timeout_s=60,
            )
        except OSError as error:  # the stop closes the connection: the outcome is unknown
            result["error"] = error

    tail_pid = cluster.pid(last)
    assert tail_pid is not None
    os.kill(tail_pid, signal.SIGSTOP)
    try:
        waiter = threading.Thread(target=commit, daemon=True)
        waiter.start()
        # The commit claims a seq on the head, then waits for the paused tail.
        wait_until(
            lambda: (
                int((cluster.status(head) or {}).get("shards", {}).get("0", {}).get("last_seq", 0))
                > before
            ),
            "the commit written on the head",
        )
        assert waiter.is_alive(), result
        began = time.monotonic()
        code = cluster.kill(head, signal.SIGTERM)
        took_s = time.monotonic() - began
    finally:
        os.kill(tail_pid, signal.SIGCONT)
    waiter.join(30)
    assert code == 0, f"head exited {code} after {took_s:.1f}s"
    assert took_s < cluster.stop_timeout_s
    assert took_s < limits.http_shutdown_ms_max / 1000 + 5
    assert result, "the commit request never ended"
