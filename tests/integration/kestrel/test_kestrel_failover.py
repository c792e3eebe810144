"""The Kestrel front on a real Kayos cluster under failures (issue 5 acceptance): node processes
from ``LocalCluster``, the front as a ``kayos kestrel --cluster`` process, real memcache clients
(python-memcached, pymemcache), and kill -9 of a client, a chain's tail and the front itself.

What the front promises (docs/kestrel-compat.md §10): a ``set`` is answered ``STORED`` once the
item is committed on every member of its shard's chain; an open read is never written, so a
crash or a disconnect brings it back; a confirmed removal is durable once the queue's group
commit (hwm + blob, committed on every replica) has landed. Group commits are not waited for by
the reply, so these tests wait, bounded, until every replica's group state covers a removal
before they kill anything that would otherwise legitimately bring it back.
"""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.kestrel import KestrelFront, LocalClusterWithKestrel
from kestrel_compat.backends.kayos_backend import queue_for
from tests.support.cluster import WAIT_S, answered_status, wait_until
from tests.support.kestrel_front import removed_everywhere, tail_entries

memcache: Any = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")

pytestmark = pytest.mark.integration

StartCluster = Callable[..., LocalCluster]
StartFront = Callable[[LocalCluster], KestrelFront]

# A set while a chain member is down waits for it to come back (the node's commit bound is 30 s).
SLOW_REPLY_S = 60.0

# A memcache client in its own process: opens one read, says which item it holds, and keeps the
# connection (and so the open read) until it is killed.
HOLDER = """
import sys, memcache
client = memcache.Client([sys.argv[1]], dead_retry=0, socket_timeout=30)
value = client.get(sys.argv[2] + "/t=5000/open")
print("held", value.decode() if value is not None else "-", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def start_front(tmp_path: Path) -> Iterator[StartFront]:
    fronts: list[KestrelFront] = []

    def start(cluster: LocalCluster) -> KestrelFront:
        front = KestrelFront(
            tmp_path / f"kestrel-{len(fronts)}.log", cluster=cluster.url(cluster.ids[0])
        )
        fronts.append(front)
        front.start()
        print(f"kestrel front on {front.address}, log {front.log_path}")
        return front

    yield start
    for front in fronts:
        front.stop()


class Holder:
    """A client process holding an open read on ``queue``."""

    def __init__(self, front: KestrelFront, queue: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, front.address, queue],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.item = self._read_line().removeprefix("held ")

    def _read_line(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + WAIT_S
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the holder did not report its item in time"
            ready, _, _ = select.select([self.process.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 1)
                assert chunk, "the holder exited before it held a read"
                line += chunk
        return line.decode().strip()

    def kill_9(self) -> None:
        self.process.kill()
        self.process.wait(timeout=WAIT_S)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def client(front: KestrelFront, timeout_s: float = 10.0) -> Any:
    return memcache.Client([front.address], dead_retry=0, socket_timeout=timeout_s)


def front_stat(front: KestrelFront, name: str) -> int | None:
    connection = client(front)
    try:
        stats = connection.get_stats()
    finally:
        connection.disconnect_all()
    if not stats:
        return None
    value = dict(stats[0][1]).get(name)
    return None if value is None else int(value)


def wait_no_open_reads(front: KestrelFront, queue: str) -> None:
    wait_until(
        lambda: front_stat(front, f"queue_{queue}_open_transactions") == 0,
        f"the front to abort the open reads on {queue}",
    )


def drain(front: KestrelFront, queue: str) -> list[str]:
    """Every item left, read with open + close (confirmed one by one)."""
    reader = client(front)
    found: list[str] = []
    try:
        while (value := reader.get(f"{queue}/t=200/open")) is not None:
            found.append(value.decode())
            assert reader.get(f"{queue}/close") is None
    finally:
        reader.disconnect_all()
    return found


# --- the nodes, over HTTP (docs/node-api.md), msgpack for binary headers and blobs ---


def queue_with_chain(cluster: LocalCluster, head: str, tail: str) -> str:
    """A Kestrel queue name whose Kayos queue's shard has this head and this single tail."""
    for number in range(10_000):
        name = f"jobs{number}"
        chain = cluster.topology.chain_for(queue_for(name))
        if chain.head == head and chain.tails == (tail,):
            return name
    raise AssertionError(f"no queue name maps to a chain {head} .. {tail}")


def set_all(front: KestrelFront, queue: str, values: list[str]) -> None:
    writer = client(front)
    try:
        for value in values:
            assert writer.set(queue, value.encode()), f"set {value} not STORED"
    finally:
        writer.disconnect_all()


# --- the tests ---


def test_killed_client_open_read_is_redelivered_at_head(
    start_cluster: StartCluster, start_front: StartFront
) -> None:
    """kill -9 of a client process holding ``get q/open``: the front sees the socket close,
    aborts the read, and the item is at the head for the next reader, ahead of items that were
    behind it and after one another reader confirmed meanwhile."""
    cluster = start_cluster(nodes=3, replicas=3)
    front = start_front(cluster)
    set_all(front, "work", ["a", "b", "c", "d"])

    holder = Holder(front, "work")
    assert holder.item == "a"
    other = client(front)
    try:
        assert other.get("work/t=1000/open") == b"b"
        assert other.get("work/close") is None
    finally:
        other.disconnect_all()

    holder.kill_9()
    wait_no_open_reads(front, "work")
    assert drain(front, "work") == ["a", "c", "d"]


def test_tail_kill_9_and_restart(start_cluster: StartCluster, start_front: StartFront) -> None:
    """kill -9 of the tail of the queue's shard, with confirmed removals, an open read and a
    ``set`` in flight, then the tail's restart: the front keeps running and needs no restart
    (it writes to the head and reads the tail only at start-up). The set is answered ``STORED``
    once the restarted tail has it; the open read comes back when its client dies; confirmed
    items never come back. Then kill -9 of the front while another client holds the read: the
    restarted front recovers from the restarted tail exactly the unconfirmed items."""
    cluster = start_cluster(nodes=3, replicas=3)
    queue = queue_with_chain(cluster, head="a", tail="c")  # the front's seed (a) stays up
    front = start_front(cluster)
    items = [f"i{n}" for n in range(6)]
    set_all(front, queue, items)
    seqs = tail_entries(cluster, queue)

    reader = client(front)
    try:
        assert reader.get(f"{queue}/t=1000/open") == b"i0"
        assert reader.get(f"{queue}/close/open") == b"i1"  # confirms i0, opens i1
        assert reader.get(f"{queue}/close") is None  # confirms i1
        assert reader.get(queue) == b"i2"  # a plain get removes at once
    finally:
        reader.disconnect_all()
    holder = Holder(front, queue)
    assert holder.item == "i3"
    confirmed = [seqs["i0"], seqs["i1"], seqs["i2"]]
    wait_until(
        lambda: removed_everywhere(cluster, queue, confirmed),
        "the confirmed removals committed on every replica",
    )

    cluster.kill("c")
    outcome: list[Any] = []

    def set_during_outage() -> None:
        writer = client(front, timeout_s=SLOW_REPLY_S)
        try:
            outcome.append(writer.set(queue, b"i6"))
        finally:
            writer.disconnect_all()

    setter = threading.Thread(target=set_during_outage)
    setter.start()
    cluster.start("c")
    cluster.wait_replicated()
    setter.join(SLOW_REPLY_S)
    assert not setter.is_alive(), "the set during the outage never returned"
    assert outcome == [True], "the set during the outage was not STORED"
    assert "i6" in tail_entries(cluster, queue), "STORED before the restarted tail had it"

    holder.kill_9()  # the read open since before the outage comes back at the head
    wait_no_open_reads(front, queue)
    second = Holder(front, queue)
    assert second.item == "i3"

    front.kill()  # kill -9, with i3 open on a live connection and i4..i6 queued
    second.kill_9()
    front.start()  # the same port; recovery reads the log from the restarted tail
    assert drain(front, queue) == ["i3", "i4", "i5", "i6"]


def test_front_kill_9_and_restart(
    start_cluster: StartCluster, start_front: StartFront, seed: int
) -> None:
    """kill -9 of the front and a restart on the same port: removals confirmed (by ``get q``,
    or ``get q/open`` then ``get q/close``) and committed before the kill never come back; the
    read open at the kill and every unread item do, in order. Twice in a row."""
    rng = random.Random(seed)
    cluster = start_cluster(nodes=3, replicas=3)
    front = start_front(cluster)
    queue = "orders"
    items = [f"o{n}-{rng.randrange(10**6)}" for n in range(rng.randint(8, 14))]
    set_all(front, queue, items)
    seqs = tail_entries(cluster, queue)
    position = 0
    for _ in range(2):
        confirm = rng.randint(1, 3)
        reader = client(front)
        try:
            for item in items[position : position + confirm]:
                if rng.random() < 0.5:
                    assert reader.get(queue) == item.encode()
                else:
                    assert reader.get(f"{queue}/t=1000/open") == item.encode()
                    assert reader.get(f"{queue}/close") is None
        finally:
            reader.disconnect_all()
        position += confirm
        holder = Holder(front, queue)
        assert holder.item == items[position]
        done = [seqs[item] for item in items[:position]]
        wait_until(
            lambda: removed_everywhere(cluster, queue, done),  # noqa: B023 - called at once
            "the confirmed removals committed on every replica",
        )
        front.kill()
        holder.kill_9()
        front.start()
        peeker = client(front)
        try:
            assert peeker.get(f"{queue}/peek") == items[position].encode()
        finally:
            peeker.disconnect_all()
    assert drain(front, queue) == items[position:]


def test_stored_set_is_on_every_replica(
    start_cluster: StartCluster, start_front: StartFront, seed: int
) -> None:
    """A ``set`` answered ``STORED`` is already on every member of the shard's chain: read back
    at once (no waiting) from the tail, and every member's ``last_seq`` covers its seq."""
    pymemcache = pytest.importorskip("pymemcache.client.base", reason="in the dev extra")
    rng = random.Random(seed)
    cluster = start_cluster(nodes=3, replicas=3)
    front = start_front(cluster)
    queues = [queue_with_chain(cluster, "a", "c"), queue_with_chain(cluster, "b", "a")]
    writer = pymemcache.Client((front.host, front.port), default_noreply=False, timeout=10)
    try:
        for number in range(20):
            queue = rng.choice(queues)
            value = f"v{number}-" + "x" * rng.randrange(0, 2000)
            assert writer.set(queue, value.encode()) is True
            seq = tail_entries(cluster, queue).get(value)
            assert seq is not None, f"STORED but {value[:8]} is not on the tail of {queue}"
            chain = cluster.topology.chain_for(queue_for(queue))
            for node in chain.members:
                status = answered_status(cluster, node)
                assert int(status["shards"][str(chain.id)]["last_seq"]) >= seq, (node, seq)
    finally:
        writer.close()


def test_cluster_with_kestrel_as_kayos_up_runs_it(tmp_path: Path) -> None:
    """What ``kayos up`` starts: the nodes, then the front on the first node's URL; it answers
    memcache clients with items on the chain, is listed among the endpoints, and stops first,
    cleanly, with the nodes."""
    cluster = LocalClusterWithKestrel(tmp_path / "up", kestrel_port=0, nodes=3, replicas=3)
    try:
        cluster.start_all()
        assert cluster.kestrel is not None
        front = cluster.kestrel
        described = "\n".join(cluster.describe())
        print(described)
        assert f"kestrel: memcache {front.address}" in described
        assert "try: " in described
        set_all(front, "upq", ["hello"])
        assert "hello" in tail_entries(cluster, "upq")
        assert drain(front, "upq") == ["hello"]
        assert cluster.exited() == {}
    finally:
        codes = cluster.stop()
    assert codes == {"kestrel": 0, "a": 0, "b": 0, "c": 0}
