"""End to end: the write hold after a splice is narrowed to where it is needed (docs/manager.md,
"Head leases" and "The new head's write hold").

Real node processes and three real manager members over TCP on 127.0.0.1 (default detection
window), no network namespaces. kill -9 of the middle: the head stays head and holds no write
(``write_hold`` null in its status) and takes a write at once. The head frozen (SIGSTOP) until it
is removed: the new head starts a hold, and the manager leader tells it that nothing is left of
the old head's lease (silent for the whole detection window, longer than ``head_lease_ms``):
``hold_ms`` 0 in the leader's log, ``told`` in the head's status, and the write goes through. (A
head killed outright is removed by proof before the window, and its lease may still be running:
tests/integration/manager/test_proof_of_death.py.)"""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from tests.support.cluster import produce_ok, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "held"
# The detection window, and margin for a loaded box.
SPLICE_WAIT_S = limits.manager_detection_window_ms / 1000 + 60


def shard_status(cluster: LocalCluster, node: str) -> dict[str, Any] | None:
    status = cluster.status(node)
    return None if status is None else status["shards"].get("0")


def leader_told(cluster: LocalCluster, node: str) -> list[int]:
    """The ``hold_ms`` values the manager members logged telling ``node``."""
    told = []
    for member in cluster.manager_ids:
        text = cluster.log_path(member).read_text(errors="replace")
        pattern = rf"write hold of shard 0 at {node}: .*'hold_ms': (\d+)"
        told += [int(ms) for ms in re.findall(pattern, text)]
    return told


def test_only_a_new_head_holds_and_a_dead_heads_lease_costs_nothing(tmp_path: Any) -> None:
    assert limits.manager_detection_window_ms > limits.head_lease_ms  # the premise
    with LocalCluster(tmp_path, nodes=3, replicas=3, shards=1, managers=3) as cluster:
        print("\n".join(cluster.describe()))
        assert cluster.topology.chain_for(QUEUE).members == ("a", "b", "c")
        produce_ok(cluster.url("a"), QUEUE, [("k1", "v1")])
        wait_until(lambda: (cluster.status("a") or {}).get("lease_remaining_ms"), "a's lease")

        cluster.kill("b", signal.SIGKILL)
        wait_until(
            lambda: (shard_status(cluster, "c") or {}).get("upstream") == "a",
            "the middle spliced out",
            SPLICE_WAIT_S,
        )
        # A status read that times out on a loaded box is no answer: wait for one.
        head = wait_until(lambda: shard_status(cluster, "a"), "a's status after the splice")
        assert head["role"] == "head"
        assert head["write_hold"] is None  # the head stayed: no hold
        produce_ok(cluster.url("a"), QUEUE, [("k2", "v2")])

        frozen = cluster.pid("a")
        assert frozen is not None
        os.kill(frozen, signal.SIGSTOP)  # silent: removed only after the detection window
        hold = wait_until(
            lambda: (
                ((s := shard_status(cluster, "c")) or {}).get("role") == "head"
                and (s or {}).get("write_hold")
            ),
            "c heading the shard with a write hold",
            SPLICE_WAIT_S,
        )
        print("c's write hold:", hold)
        hold = wait_until(
            lambda: (
                ((shard_status(cluster, "c") or {}).get("write_hold") or {}).get("told")
                and shard_status(cluster, "c")
            ),
            "the leader's word on c's hold",
        )["write_hold"]
        print("after the leader's word:", hold, "told:", leader_told(cluster, "c"))
        assert hold["remaining_ms"] == 0
        assert leader_told(cluster, "c")[:1] == [0]
        produce_ok(cluster.url("c"), QUEUE, [("k3", "v3")])
        cluster.kill("a", signal.SIGKILL)
