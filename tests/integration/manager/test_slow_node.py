"""A slow node is removed AS SLOW (issue 11): the middle runs a SIGSTOP/SIGCONT duty cycle, so it
still answers the manager's polls (well inside the detection window) but is slow on its chain
links; its neighbours' round-trip p99 reports it, the manager splices it out as ``slow`` (not
``down``), acks=all producers go on, and every acknowledged message is consumed. With a minimum
of 3 replicas the same node is kept, with a ``slow_node_kept`` alert. Real nodes, three real
manager members."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.manager import Config
from tests.support.checked import (
    AFTER,
    BEFORE,
    PRODUCERS,
    Producer,
    answered_view,
    chain_of,
    check_nothing_lost,
    manager_view,
    node_states,
)
from tests.support.cluster import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Stopped this long, then running this long, over and over: every pause is far inside the
# manager's detection window (its polls are answered, late), but a neighbour's round trips
# through it take up to the pause, far over the slow bound.
STOP_S = 0.4
RUN_S = 0.2
SLOW_P99_MS = 150
SLOW_WINDOW_MS = 2_000
DETECT_MS = 3_000


def config(min_replicas: int) -> Config:
    return Config(
        detection_window_ms=DETECT_MS,
        suspect_after_ms=DETECT_MS // 2,
        slow_p99_ms=SLOW_P99_MS,
        slow_window_ms=SLOW_WINDOW_MS,
        min_replicas=min_replicas,
    )


class DutyCycle:
    """SIGSTOP/SIGCONT of one process in a bounded loop; always leaves it running."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="duty-cycle")

    def _run(self) -> None:
        for _ in range(10_000):  # bounded: 10,000 cycles is far past any test's deadline
            if self.stop.is_set():
                break
            os.kill(self.pid, signal.SIGSTOP)
            self.stop.wait(STOP_S)
            os.kill(self.pid, signal.SIGCONT)
            self.stop.wait(RUN_S)
        os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> DutyCycle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        os.kill(self.pid, signal.SIGCONT)


def run_cluster(tmp_path: Any, min_replicas: int) -> LocalCluster:
    return LocalCluster(
        tmp_path,
        nodes=3,
        replicas=3,
        shards=1,
        managers=3,
        manager_config=config(min_replicas),
    )


def test_a_slow_middle_is_removed_as_slow_and_writes_go_on(tmp_path: Any) -> None:
    with run_cluster(tmp_path, min_replicas=2) as cluster:
        assert cluster.topology.shards[0].chain == ("a", "b", "c")
        producers = [Producer(i, list(cluster.urls.values())) for i in range(PRODUCERS)]
        for producer in producers:
            producer.start()
        try:
            wait_until(lambda: all(len(p.acked_at) >= BEFORE for p in producers), "acks before")
            pid = cluster.pid("b")
            assert pid is not None
            started = time.monotonic()
            with DutyCycle(pid):
                wait_until(lambda: chain_of(cluster, 0) == ["a", "c"], "b spliced out as slow")
                removed_s = time.monotonic() - started
                assert node_states(cluster)["b"] == "slow"
                since = time.monotonic()
                wait_until(
                    lambda: all(
                        sum(1 for t in p.acked_at if t > since) >= AFTER for p in producers
                    ),
                    "acks through the repaired chain while b is slow",
                )
        finally:
            for producer in producers:
                producer.finish()
        print(
            f"slow node removed {removed_s:.2f}s after its duty cycle began (slow bound "
            f"p99 > {SLOW_P99_MS} ms over {SLOW_WINDOW_MS} ms; detection window {DETECT_MS} ms)"
        )
        check_nothing_lost(cluster, "c", producers)


def test_a_slow_node_under_the_minimum_is_kept_with_an_alert(tmp_path: Any) -> None:
    with run_cluster(tmp_path, min_replicas=3) as cluster:
        pid = cluster.pid("b")
        assert pid is not None
        producer = Producer(0, list(cluster.urls.values()))
        producer.start()
        try:
            wait_until(lambda: len(producer.acked_at) >= BEFORE, "acks before")

            def kept_alert() -> bool:
                view = manager_view(cluster)
                alerts = [] if view is None else view["view"]["alerts"]
                return any(a[0] == "slow_node_kept" and a[2] == "b" for a in alerts)

            with DutyCycle(pid):
                wait_until(kept_alert, "the slow_node_kept alert for b")
                assert answered_view(cluster)["view"]["shards"][0]["chain"] == ["a", "b", "c"]
                assert node_states(cluster)["b"] == "slow"
        finally:
            producer.finish()
