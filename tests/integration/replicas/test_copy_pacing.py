"""A copy's pacing as a node reports it, and its rate ceiling (docs/performance.md, "Pacing a
copy"; docs/operations.md, "A copy's rate ceiling"): real ``kayos node`` processes started with
``--copy-rate-mb-per-s-max``; a learner holding nothing copies the tail's store file."""

from __future__ import annotations

import os
import signal
import sys
import threading
import urllib.request
from typing import Any

import pytest

from tests.support.cluster import (
    answered_replica,
    catch_up,
    learned_through,
    produce_ok,
    wait_until,
)

pytestmark = pytest.mark.integration

CEILING_MB_PER_S = 8.0


def test_a_snapshot_is_held_to_the_node_ceiling_and_reported(start_cluster: Any) -> None:
    # Shard 0: a -> b -> c; d holds nothing of it. Every node holds its copies to 8 MB/s.
    command = [sys.executable, "-m", "kayos", "node", "--copy-rate-mb-per-s-max", "8"]
    cluster = start_cluster(nodes=4, replicas=3, shards=1, node_command=command)
    head = cluster.url("a")
    last = 0
    for batch in range(40):  # 40 x 50 x 6000 B: about 12 MB, so 1.5 s at the ceiling
        messages = [(f"k{batch}-{i}", "x" * 6000) for i in range(50)]
        _first, last = produce_ok(head, "q", messages)
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "c"}
    assert catch_up(cluster, "d", body)[0] == 200
    wait_until(lambda: learned_through(cluster, "d", last), "d copied the shard")
    learner = answered_replica(cluster, "d")
    assert learner is not None
    assert learner["snapshot"]["done"], learner["snapshot"]
    sent = learner["snapshot"]["total_bytes"]

    served = answered_replica(cluster, "c")
    assert served is not None
    [snapshot] = [copy for copy in served["copies"] if copy["kind"] == "snapshot"]
    assert snapshot["ended"], snapshot
    assert snapshot["copied_bytes"] == sent, snapshot
    assert snapshot["ceiling_mb_per_s"] == CEILING_MB_PER_S
    # Every piece lasted at least its bytes at the ceiling: the whole copy did too.
    assert snapshot["seconds"] >= 0.95 * sent / (CEILING_MB_PER_S * 1e6), snapshot
    assert snapshot["mean_mb_per_s"] <= CEILING_MB_PER_S * 1.05, snapshot

    with urllib.request.urlopen(f"{cluster.url('c')}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    shares = [
        line
        for line in metrics.splitlines()
        if line.startswith("kayos_copy_share{") and 'copy="snapshot"' in line
    ]
    assert shares, metrics
    log = cluster.log_path("c").read_text(errors="replace")
    assert "snapshot: copy paced:" in log
    assert "ceiling 8 MB/s" in log


def test_a_learner_slower_than_the_link_gets_the_snapshot_in_one_attempt(
    start_cluster: Any,
) -> None:
    # d is stopped 0.35 s of every 0.45 s while it copies: the upstream sends faster than d
    # reads, so the end of the file is likely still in flight when the upstream has sent it all.
    # The upstream must wait for d to hang up: closed at once, with d's PONGs unread, the
    # connection is reset and what d had not read yet is lost (the copy then starts again; with
    # the upstream closing at once most runs of this test saw a second attempt).
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    head = cluster.url("a")
    last = 0
    for batch in range(100):  # 100 x 50 x 16000 B: about 80 MB
        messages = [(f"k{batch}-{i}", "x" * 16000) for i in range(50)]
        _first, last = produce_ok(head, "q", messages)
    pid = cluster.pid("d")
    assert pid is not None
    stop = threading.Event()

    def duty_cycle() -> None:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            stop.wait(0.35)  # the stopped part of the cycle, not a synchronisation
            os.kill(pid, signal.SIGCONT)
            stop.wait(0.1)

    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "c"}
    assert catch_up(cluster, "d", body)[0] == 200
    cycling = threading.Thread(target=duty_cycle)
    cycling.start()
    try:
        wait_until(
            lambda: (learner := answered_replica(cluster, "d")) and learner["snapshot"]["done"],
            "d installed the snapshot",
        )
    finally:
        stop.set()
        cycling.join()
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: learned_through(cluster, "d", last), "d copied the shard")
    learner = answered_replica(cluster, "d")
    assert learner is not None
    assert learner["snapshot"]["attempts"] == 1, learner["snapshot"]
