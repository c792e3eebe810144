"""End to end: the manager finds dead nodes by proof and frozen ones by the window
(docs/manager.md, "Evidence and proof of death").

Real node processes and three real manager members over TCP on 127.0.0.1. kill -9 of a head:
the leader's watch ends, its probe is refused, and the head is spliced out far within the
detection window; an acks=all write begun after the kill is acknowledged at the new head soon
after (a refused probe ends no lease: the new head holds what may be left of the dead head's, at
most ``head_lease_ms``; a supervisor's exit report ends it at once). A clean stop (SIGTERM) is
spliced out at once too (its goodbye; its hold is 0). A node stopped for 300 ms every ~2 s for
20 s is never removed. A node killed and restarted on its data by ``kayos up``'s supervisor comes
back, and a late report of its predecessor's exit does not splice it out again."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from typing import Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.exits import exit_message
from kayos.local.http import http_json
from kayos.local.up import StopSignal, supervise
from tests.support.cluster import produce, produce_ok, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "proof"
WINDOW_S = limits.manager_detection_window_ms / 1000
# A write begun after a head's death is acknowledged within this (generous: the box is shared;
# measured 0.1-0.3 s, docs/manager.md).
WRITE_AFTER_DEATH_S = 2.0
# The stall schedule: every node may stall this long now and then, and none may be removed.
STALL_S = limits.manager_stall_ms_tolerated / 1000
STALL_EVERY_S = 2.0
STALLING_S = 20.0


def manager_status(cluster: LocalCluster) -> dict[str, Any] | None:
    """The leader's ``GET /v1/manager/status``, or any member's."""
    found = None
    for member in cluster.manager_ids:
        try:
            code, body = http_json(cluster.manager_url(member) + "/v1/manager/status", timeout_s=1)
        except OSError:
            continue
        if code == 200 and isinstance(body, dict):
            if body.get("leader") == body.get("member"):
                return body
            found = body
    return found


def chain(cluster: LocalCluster) -> list[str]:
    status = wait_until(lambda: manager_status(cluster), "a manager's status")
    return list(status["view"]["shards"][0]["chain"])


def node_states(cluster: LocalCluster) -> dict[str, list[Any]]:
    status = wait_until(lambda: manager_status(cluster), "a manager's status")
    return {entry[0]: entry for entry in status["view"]["nodes"]}


def members_logged(cluster: LocalCluster, text: str) -> bool:
    return any(text in cluster.log_path(m).read_text(errors="replace") for m in cluster.manager_ids)


def holds_told(cluster: LocalCluster, node: str) -> list[int]:
    """The ``hold_ms`` values the manager members logged telling ``node`` (shard 0)."""
    told = []
    for member in cluster.manager_ids:
        text = cluster.log_path(member).read_text(errors="replace")
        pattern = rf"write hold of shard 0 at {node}: .*'hold_ms': (\d+)"
        told += [int(ms) for ms in re.findall(pattern, text)]
    return told


def write_until_acknowledged(cluster: LocalCluster, alive: list[str]) -> float:
    """Writes (acks=all) at the shard's head as a live node's topology names it, again and again
    until one is acknowledged; returns when (monotonic)."""
    attempt = 0
    while True:
        attempt += 1
        for node in alive:
            try:
                code, topology = http_json(cluster.url(node) + "/v1/topology", timeout_s=1)
            except OSError:
                continue
            if code != 200:
                continue
            head = topology["shards"][0]["chain"][0]
            if head not in alive:
                continue
            try:
                status, _ = produce(cluster.url(head), QUEUE, [(f"after-{attempt}", "v")])
            except OSError:
                continue
            if status == 200:
                return time.monotonic()
        time.sleep(0.01)  # a bounded retry of a write refused meanwhile, not a synchronisation


def test_a_killed_head_is_spliced_out_by_proof_and_writes_resume_soon(tmp_path: Any) -> None:
    with LocalCluster(tmp_path, nodes=3, replicas=3, shards=1, managers=3) as cluster:
        print("\n".join(cluster.describe()))
        assert chain(cluster) == ["a", "b", "c"]
        produce_ok(cluster.url("a"), QUEUE, [("k0", "v0")])
        wait_until(lambda: (cluster.status("a") or {}).get("lease_remaining_ms"), "a's lease")
        epoch = wait_until(lambda: manager_status(cluster), "status")["epoch"]

        pid = cluster.pid("a")
        assert pid is not None
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        acked: list[float] = []
        writer = threading.Thread(
            target=lambda: acked.append(write_until_acknowledged(cluster, ["b", "c"]))
        )
        writer.start()
        wait_until(lambda: "a" not in chain(cluster), "a spliced out", 30)
        spliced_s = time.monotonic() - killed
        writer.join(60)
        assert acked, "no write was acknowledged after the kill"
        acked_s = acked[0] - killed
        print(f"kill -9 of the head: spliced out after {spliced_s:.3f} s, a write begun after the"
              f" kill acknowledged after {acked_s:.3f} s")  # fmt: skip
        assert cluster.wait_exit("a") == -signal.SIGKILL
        assert members_logged(cluster, "a is gone (refused"), "spliced by the probe's proof"
        assert spliced_s < WINDOW_S, "far within the detection window"
        assert acked_s < WRITE_AFTER_DEATH_S
        # A refusal ends no lease: b was told what may be left of a's, at most one lease.
        told = holds_told(cluster, "b")
        print("holds told b:", told)
        assert told
        assert told[0] <= limits.head_lease_ms
        status = wait_until(lambda: manager_status(cluster), "status")
        assert status["epoch"] == epoch + 1
        assert node_states(cluster)["a"][1] == "down"


def test_a_cleanly_stopped_head_is_spliced_out_at_once(tmp_path: Any) -> None:
    with LocalCluster(tmp_path, nodes=3, replicas=3, shards=1, managers=3) as cluster:
        print("\n".join(cluster.describe()))
        produce_ok(cluster.url("a"), QUEUE, [("k0", "v0")])
        wait_until(lambda: (cluster.status("a") or {}).get("lease_remaining_ms"), "a's lease")
        pid = cluster.pid("a")
        assert pid is not None
        stopped = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: "a" not in chain(cluster), "a spliced out", 30)
        spliced_s = time.monotonic() - stopped
        print(f"SIGTERM of the head: spliced out after {spliced_s:.3f} s")
        assert cluster.wait_exit("a") == 0
        assert members_logged(cluster, "a is gone (stopped"), "spliced by its goodbye"
        assert spliced_s < WINDOW_S
        assert wait_until(lambda: holds_told(cluster, "b"), "b told its hold")[:1] == [0]
        acked_s = write_until_acknowledged(cluster, ["b", "c"]) - stopped
        print(f"a write begun after the stop acknowledged after {acked_s:.3f} s")
        assert acked_s < WRITE_AFTER_DEATH_S


def test_a_node_stalling_300_ms_every_two_seconds_is_never_removed(tmp_path: Any) -> None:
    seed = int(os.environ.get("KAYOS_TEST_SEED", random.randrange(2**32)))
    print(f"KAYOS_TEST_SEED={seed}")
    rng = random.Random(seed)
    with LocalCluster(tmp_path, nodes=3, replicas=3, shards=1, managers=3) as cluster:
        print("\n".join(cluster.describe()))
        produce_ok(cluster.url("a"), QUEUE, [("k0", "v0")])
        before = wait_until(lambda: manager_status(cluster), "status")
        victim = "a"  # the head: its removal would cost the most
        pid = cluster.pid(victim)
        assert pid is not None
        stalls = 0
        deadline = time.monotonic() + STALLING_S
        while time.monotonic() < deadline:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(STALL_S)  # the fault's length, not a synchronisation
            os.kill(pid, signal.SIGCONT)
            stalls += 1
            # The gap between stalls: ~2 s, jittered (the fault schedule).
            time.sleep(STALL_EVERY_S * rng.uniform(0.8, 1.2))
        after = wait_until(lambda: manager_status(cluster), "status")
        print(f"{stalls} stalls of {STALL_S} s; epoch {before['epoch']} -> {after['epoch']}")
        assert stalls >= 8
        assert after["epoch"] == before["epoch"], "a stalled node was removed"
        assert {entry[1] for entry in after["view"]["nodes"]} <= {"up", "suspect"}
        assert chain(cluster) == ["a", "b", "c"]
        produce_ok(cluster.url("a"), QUEUE, [("k1", "v1")])


def post_to_leader(cluster: LocalCluster, path: str, body: Any) -> tuple[int, Any]:
    """Posts ``body`` to every member until the leader takes it (a follower answers 421)."""
    last: tuple[int, Any] = (0, None)
    for member in cluster.manager_ids:
        last = http_json(cluster.manager_url(member) + path, method="POST", body=body)
        if last[0] != 421:
            return last
    return last


def test_a_restarted_node_is_not_spliced_out_for_its_predecessors_death(tmp_path: Any) -> None:
    with LocalCluster(tmp_path, nodes=3, replicas=3, shards=1, managers=3) as cluster:
        print("\n".join(cluster.describe()))
        produce_ok(cluster.url("a"), QUEUE, [("k0", "v0")])
        first = wait_until(lambda: cluster.status("a"), "a's status")["incarnation"]
        wait_until(lambda: node_states(cluster)["a"][3] == first, "a's incarnation in the view")
        echoed: list[str] = []
        stop = StopSignal()
        supervisor = threading.Thread(target=supervise, args=(cluster, stop, echoed.append))
        supervisor.start()
        try:
            pid = cluster.pid("a")
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: "a" not in chain(cluster), "a spliced out", 30)
            wait_until(
                lambda: any("a's exit reported to the manager" in line for line in echoed),
                "the supervisor's exit report",
                30,
            )
            # The supervisor's report ends the dead process's lease: b is told a hold of 0.
            told = wait_until(lambda: 0 in holds_told(cluster, "b") and holds_told(cluster, "b"),
                              "b told its hold is over", 30)  # fmt: skip
            print("holds told b:", told)
            # Restarted on its data by the supervisor: it returns, catches up and rejoins.
            wait_until(lambda: chain(cluster) == ["b", "c", "a"], "a rejoined as tail", 120)
            second = wait_until(lambda: cluster.status("a"), "a's status")["incarnation"]
            assert second != first
            wait_until(lambda: node_states(cluster)["a"][3] == second, "a's new incarnation")
            epoch = wait_until(lambda: manager_status(cluster), "status")["epoch"]

            # A late report of the old process's exit: stale, nothing moves.
            code, reply = post_to_leader(
                cluster, "/v1/manager/exited", exit_message(cluster.identity, "a", first, -9)
            )
            assert code == 200, reply
            assert reply["state"] == "up"
            # A report from anyone makes the leader probe a: alive, nothing moves either.
            code, reply = post_to_leader(cluster, "/v1/manager/suspect", {"node": "a"})
            assert code == 202, reply
            produce_ok(cluster.url("b"), QUEUE, [("k1", "v1")])  # a round trip past the probe
            status = wait_until(lambda: manager_status(cluster), "status")
            assert status["epoch"] == epoch
            assert chain(cluster) == ["b", "c", "a"]
        finally:
            stop.set()
            supervisor.join(30)
        print("\n".join(echoed))
