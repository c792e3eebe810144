"""Chain replication end to end (issue 4 acceptance), over real `kayos node` processes and the HTTP
API of docs/node-api.md: delivery per consumer group with de-dup, all-or-nothing batches under a
concurrent snapshot reader, acks=all, and high-water marks across a tail restart."""

from __future__ import annotations

import itertools
import random
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import (
    Snapshot,
    answered_seqs,
    commit_group,
    produce,
    produce_ok,
    read_snapshot,
    shard_seqs,
    wait_until,
)

pytestmark = pytest.mark.integration

StartCluster = Callable[..., LocalCluster]

TOPOLOGIES = {
    "n1": {"nodes": 1, "replicas": 1},
    "n2": {"nodes": 2, "replicas": 2},
    "n3": {"nodes": 3, "replicas": 3},
    "fanout2": {"nodes": 4, "replicas": 2, "fanout": 2, "shards": 1},
}
QUEUES = ("orders", "events", "jobs")
GROUPS = ("g1", "g2")


def expected_snapshot(
    log: dict[int, tuple[str, str | None]], hwm: int, boundary: int
) -> list[tuple[int, str, str | None]]:
    """What a consumer snapshot ``(hwm, boundary]`` of one queue holds: for each key, its newest
    version as of ``boundary`` if that version lies in the snapshot (a later version of a key
    replaces the earlier; a delete shows as a tombstone)."""
    newest: dict[str, int] = {}
    for seq in sorted(log):
        if seq <= boundary:
            newest[log[seq][0]] = seq
    return sorted(
        (seq, log[seq][0], log[seq][1]) for seq in newest.values() if hwm < seq <= boundary
    )


def delivered(snapshot: Snapshot) -> list[tuple[int, str, str | None]]:
    return [(m["seq"], m["key"], None if m["deleted"] else m["value"]) for m in snapshot.messages]


class Producer(threading.Thread):
    """Produces seeded batches (keys repeat, some deletes) with acks=all to one queue's head and
    keeps the log of what each seq holds."""

    def __init__(self, cluster: LocalCluster, queue: str, rng: random.Random, batches: int):
        super().__init__(name=f"producer-{queue}", daemon=True)
        self.url = cluster.url(cluster.head_of(queue))
        self.queue = queue
        self.plan = [
            [
                (f"k{rng.randrange(30)}", None if rng.random() < 0.1 else f"v{b}.{i}")
                for i in range(rng.randint(1, 20))
            ]
            for b in range(batches)
        ]
        self.log: dict[int, tuple[str, str | None]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for batch in self.plan:
                first, last = produce_ok(self.url, self.queue, batch)
                self.log.update(zip(range(first, last + 1), batch, strict=True))
        except BaseException as exc:  # reported by the test thread
            self.error = exc


@pytest.mark.parametrize("topology", list(TOPOLOGIES), ids=list(TOPOLOGIES))
def test_every_message_once_per_group_in_seq_order(
    start_cluster: StartCluster, seed: int, topology: str
) -> None:
    cluster = start_cluster(**TOPOLOGIES[topology])
    rng = random.Random(seed)
    producers = [Producer(cluster, queue, rng, batches=25) for queue in QUEUES]
    snapshots: dict[tuple[str, str], list[Snapshot]] = {
        (group, queue): [] for group in GROUPS for queue in QUEUES
    }

    def consume_round(round_number: int) -> None:
        for group_index, group in enumerate(GROUPS):
            for queue in QUEUES:
                # Groups read from different tails, and switch tails between rounds (fanout).
                tails = cluster.tails_of(queue)
                url = cluster.url(tails[(round_number + group_index) % len(tails)])
                snapshot = read_snapshot(url, queue, group, limit=7, wait_ms=50)
                snapshots[group, queue].append(snapshot)
                if snapshot.boundary > snapshot.hwm:
                    commit_group(url, queue, group, snapshot.boundary)

    for producer in producers:
        producer.start()
    round_number = 0
    while any(producer.is_alive() for producer in producers):
        consume_round(round_number)
        round_number += 1
    for producer in producers:
        producer.join()
        assert producer.error is None, producer.error
    consume_round(round_number)  # everything acknowledged is committed, so visible now
    print(f"{round_number + 1} consume rounds")

    for producer in producers:
        last_seq = max(producer.log)
        for group in GROUPS:
            history = snapshots[group, producer.queue]
            seqs = [seq for snapshot in history for seq, _, _ in delivered(snapshot)]
            assert seqs == sorted(set(seqs)), "at most once, in seq order"
            for previous, snapshot in itertools.pairwise(history):
                assert snapshot.hwm == max(previous.hwm, previous.boundary)
            for snapshot in history:
                assert delivered(snapshot) == expected_snapshot(
                    producer.log, snapshot.hwm, snapshot.boundary
                )
            assert history[-1].boundary >= last_seq, "every acknowledged message was read"


def test_all_or_nothing_batch_is_seen_whole_or_not_at_all(start_cluster: StartCluster) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    queue, batches, size = "atomic", 30, 50
    shard, tail_node = cluster.topology.shard_for(queue), cluster.tails_of(queue)[0]
    head, tail = cluster.url(cluster.head_of(queue)), cluster.url(tail_node)
    done = threading.Event()
    replies: list[tuple[int, Any]] = []

    def producer() -> None:
        try:
            for batch in range(batches):
                messages: list[tuple[str, str | None]] = [
                    (f"{batch:03d}-{i:02d}", f"v{batch}") for i in range(size)
                ]
                replies.append(produce(head, queue, messages, acks="1", txn=True))
        finally:
            done.set()

    def batches_seen() -> int:
        # Pages of 37 cross batch boundaries; the snapshot must still be one consistent view.
        snapshot = read_snapshot(tail, queue, "reader", limit=37)
        counts: dict[str, int] = {}
        for message in snapshot.messages:
            prefix = message["key"].split("-")[0]
            counts[prefix] = counts.get(prefix, 0) + 1
        assert set(counts.values()) <= {size}, f"a batch seen in part: {counts}"
        assert sorted(counts) == [f"{b:03d}" for b in range(len(counts))], "commit order"
        return len(counts)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    views_while_producing = 0
    while not done.is_set():
        views_while_producing += 0 < batches_seen() < batches
    thread.join()
    assert all(status == 200 for status, _ in replies), replies
    last_seq = max(reply["last_seq"] for _, reply in replies)
    wait_until(
        lambda: (shard_seqs(cluster, tail_node, shard) or (0, 0))[1] >= last_seq,
        "the tail to commit the last batch",
    )
    assert batches_seen() == batches
    print(f"{views_while_producing} snapshots saw some batches but not all")


def test_acks_all_returns_only_after_the_tail_has_it(start_cluster: StartCluster) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    chain = cluster.topology.shards[0]
    queue = "acked"
    messages: list[tuple[str, str | None]] = [(f"k{i}", f"v{i}") for i in range(10)]
    _, last = produce_ok(cluster.url(chain.head), queue, messages)
    cluster.kill(chain.head, signal.SIGKILL)
    for node in chain.members[1:]:
        seqs = answered_seqs(cluster, node, 0)
        assert seqs[0] >= last, f"{node} lacks an acknowledged message: {seqs}"
    # The head comes back on its data and the chain carries on by itself. Only then must the tail
    # show the writes: the head may die before its commit point reaches the tail, and members
    # forward before they persist, so until the head is back no survivor can tell the writes it
    # acknowledged from ones its store never held (and that a restarted head discards).
    cluster.start(chain.head)
    cluster.wait_replicated()
    snapshot = read_snapshot(cluster.url(chain.tails[0]), queue, "g")
    assert delivered(snapshot) == [(seq, k, v) for seq, (k, v) in enumerate(messages, 1)]
    _, later = produce_ok(cluster.url(chain.head), queue, [("after", "restart")])
    assert later == last + 1
    assert cluster.wait_replicated()[0] == later


def test_high_water_marks_survive_a_tail_restart(start_cluster: StartCluster) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    chain = cluster.topology.shards[0]
    queue, tail = "marks", chain.tails[0]
    produce_ok(cluster.url(chain.head), queue, [(f"k{i}", "v") for i in range(20)])
    snapshot = read_snapshot(cluster.url(tail), queue, "g")
    assert len(snapshot.messages) == 20
    commit_group(cluster.url(tail), queue, "g", snapshot.boundary)  # relayed to the head
    assert cluster.kill(tail, signal.SIGKILL) == -signal.SIGKILL
    cluster.start(tail)
    cluster.wait_replicated()
    for node in chain.members:
        status, group = http_json(f"{cluster.url(node)}/v1/queues/{queue}/groups/g")
        assert status == 200, group
        assert group["hwm"] == snapshot.boundary, node
    again = read_snapshot(cluster.url(tail), queue, "g")
    assert (again.hwm, again.messages) == (snapshot.boundary, [])
    first, last = produce_ok(cluster.url(chain.head), queue, [("k1", "new"), ("k99", "new")])
    resumed = read_snapshot(cluster.url(tail), queue, "g")
    assert delivered(resumed) == [(first, "k1", "new"), (last, "k99", "new")]


def test_nodes_stop_cleanly_on_sigint_and_sigterm(start_cluster: StartCluster) -> None:
    cluster = start_cluster(nodes=2, replicas=2, shards=1)
    produce_ok(cluster.url("a"), "q", [("k", "v")])
    assert cluster.kill("b", signal.SIGINT) == 0, "Ctrl-C stops a node cleanly"
    cluster.start("b")
    assert cluster.stop() == {"a": 0, "b": 0}, "SIGTERM stops every node cleanly"


def test_pages_of_one_snapshot_ignore_later_commits(start_cluster: StartCluster) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    chain = cluster.topology.shards[0]
    head, tail = cluster.url(chain.head), cluster.url(chain.tails[0])
    produce_ok(head, "paged", [(f"k{i:02d}", "old") for i in range(25)])
    status, page = http_json(f"{tail}/v1/queues/paged/consume?group=g&limit=10")
    assert status == 200, page
    boundary, seen = page["boundary"], [m["seq"] for m in page["messages"]]
    # A new version of a key not read yet, and a new key, both after the snapshot's boundary.
    produce_ok(head, "paged", [("k20", "new"), ("late", "new")])
    cluster.wait_replicated()
    while not page["end"]:
        query = f"group=g&limit=10&after={page['next']}&upto={boundary}"
        status, page = http_json(f"{tail}/v1/queues/paged/consume?{query}")
        assert status == 200, page
        assert page["boundary"] == boundary
        assert all(m["value"] == "old" for m in page["messages"]), "read as of the boundary"
        seen += [m["seq"] for m in page["messages"]]
    assert seen == list(range(1, 26))
    commit_group(tail, "paged", "g", boundary)
    following = read_snapshot(tail, "paged", "g")
    assert [(m["key"], m["value"]) for m in following.messages] == [
        ("k20", "new"),
        ("late", "new"),
    ]


def test_the_client_finds_heads_and_tails_from_one_seed(start_cluster: StartCluster) -> None:
    from kayos import Client

    cluster = start_cluster(nodes=3, replicas=3)
    queue = "via-client"
    chain = cluster.topology.chain_for(queue)
    seed_node = chain.chain[1]  # neither the head nor the tail of the queue's shard
    with Client(cluster.url(seed_node)) as client:
        first, last = client.produce_batch(
            queue, [("a", "1"), ("b", "1"), ("a", "2")], acks="all", txn=True
        )
        assert (first, last) == (1, 3)
        assert client.produce(queue, "c", None, acks="all") == 4
        pages = list(client.consume(queue, "g", page_size=2))
        messages = [m for page in pages for m in page.messages]
        assert [(m.seq, m.key, m.value, m.deleted) for m in messages] == [
            (2, b"b", b"1", False),
            (3, b"a", b"2", False),
            (4, b"c", None, True),
        ]
        assert pages[-1].end
        client.commit(queue, "g", pages[-1].boundary)
        group = client.group(queue, "g")
        assert group.hwm == 4
        assert group.boundary >= 4, "the boundary counts shard seqs (the commit claims one)"
