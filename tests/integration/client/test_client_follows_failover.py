"""Connected clients follow the cluster (docs/node-api.md, "Clients"): real nodes, three real
manager members, and producers sharing one long-lived client, writing with acks=all. The head is
frozen (SIGSTOP) and never resumed while the test waits: the manager splices it out, and the
client, watching every node's topology, abandons the calls it had sent to the frozen head and
sends them again to the new one. An acknowledgement must come within a bound counted from the
manager's change (the detection window before it is the manager's business), and everything
acknowledged is consumed once the head is resumed. Once with threads sharing one ``kayos.Client``,
once with tasks sharing one ``kayos.AsyncClient``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kayos.client.aio import AsyncClient
from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.manager import Config
from tests.support.checked import (
    PRODUCER_QUEUE,
    Producer,
    chain_of,
    check_nothing_lost,
)
from tests.support.cluster import WAIT_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# A short detection window so the test runs in seconds (the bound below does not depend on it).
CONFIG = Config(detection_window_ms=2_000, suspect_after_ms=1_000)
# Producers sharing the one client.
SHARERS = 4
BEFORE = 10  # acks each producer gets before the head is frozen
AFTER = 5  # ... and after the change, each
# The first acknowledgement must come within this of the manager's change: the client learns
# of it from its watch in milliseconds and sends its calls to the new head at once; the rest is
# the new head's write hold and its chain linking up, with room for two busy shared cores.
FOLLOW_BOUND_S = 3.0


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path, nodes=3, replicas=3, shards=1, managers=3, manager_config=CONFIG
    ) as c:
        print("\n".join(c.describe()))
        yield c


def acks_after(producers: list[Producer], since: float) -> list[float]:
    return sorted(t for p in producers for t in p.acked_at if t > since)


def freeze_head_and_follow(
    cluster: LocalCluster, producers: list[Producer], stop_producers: Callable[[], None]
) -> None:
    """Freezes the head under the running producers, waits for the manager's change, and checks
    that acknowledgements come within the bound of it while the head stays frozen; then stops
    the producers and checks, the head still frozen (the chain b > c stays put meanwhile), that
    nothing acknowledged was lost."""
    assert cluster.topology.shards[0].chain == ("a", "b", "c")
    try:
        wait_until(lambda: all(len(p.acked_at) >= BEFORE for p in producers), "acks before")
        pid = cluster.pid("a")
        assert pid is not None
        frozen = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: chain_of(cluster, 0) == ["b", "c"], "the manager splicing a out")
            changed = time.monotonic()
            first = wait_until(
                lambda: acks_after(producers, changed),
                f"an ack within {FOLLOW_BOUND_S}s of the change, the head still frozen",
                timeout_s=FOLLOW_BOUND_S,
            )[0]
            print(
                f"head frozen; the manager's change seen {changed - frozen:.2f}s later; the "
                f"first ack {first - changed:.2f}s after the change"
            )
            assert first - changed <= FOLLOW_BOUND_S
            wait_until(
                lambda: all(sum(1 for t in p.acked_at if t > changed) >= AFTER for p in producers),
                "every producer acknowledged through the new head",
            )
            stop_producers()
            check_nothing_lost(cluster, "c", producers)
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        stop_producers()


def test_threads_sharing_one_client_follow_a_frozen_head_out(cluster: LocalCluster) -> None:
    urls = list(cluster.urls.values())
    producers = [Producer(i, urls) for i in range(SHARERS)]
    with Client(urls, name="shared") as client:

        def stop() -> None:
            for producer in producers:
                producer.finish()

        for producer in producers:
            producer.start(client)
        freeze_head_and_follow(cluster, producers, stop)


async def _produce(client: AsyncClient, producer: Producer) -> None:
    n = 0
    while not producer.stop.is_set():
        key, value, op = producer.call(n)
        n += 1
        began = time.monotonic()
        try:
            seq = await client.produce(PRODUCER_QUEUE, key, value, acks="all")
        except KayosError as exc:
            producer.failed(op, key, value, exc)
            continue
        producer.acked(op, key, value, seq, began)


def test_tasks_sharing_one_async_client_follow_a_frozen_head_out(cluster: LocalCluster) -> None:
    urls = list(cluster.urls.values())
    producers = [Producer(i, urls) for i in range(SHARERS)]
    failures: list[BaseException] = []

    async def run() -> None:
        async with AsyncClient(urls, name="shared-async") as client:
            await asyncio.gather(*(_produce(client, p) for p in producers))

    def thread_main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=thread_main, name="async-producers")
    thread.start()

    def stop() -> None:
        for producer in producers:
            producer.stop.set()
        thread.join(WAIT_S * 2)
        assert not thread.is_alive(), "the async producers did not stop"
        assert not failures, failures

    freeze_head_and_follow(cluster, producers, stop)
