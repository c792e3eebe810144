"""kill -9 of one chain member while producers run with acks=all (issue 4 acceptance): after the
node restarts on its data, the chain resumes by itself (same topology), and every acknowledged
message is on every replica. Replicas are compared offline, store by store, once the cluster has
stopped: the same entries at the same seqs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import pytest

from kayos.local.cluster import LocalCluster
from kayos.storage import ShardStore
from tests.support.cluster import PRODUCE_TIMEOUT_S, produce, read_snapshot, shard_seqs, wait_until

pytestmark = pytest.mark.integration

StartCluster = Callable[..., LocalCluster]
QUEUE = "load"
BATCH = 5
# Batches acknowledged before the kill, and again after the restart (the chain has resumed).
BATCHES_BEFORE = 30
BATCHES_AFTER = 30


class LoadProducer(threading.Thread):
    """Produces batches of unique keys until stopped; keeps what was acknowledged. A failed
    request (refused connection, 503, 504) has an unknown outcome and is not kept."""

    def __init__(self, url: str, name: str, stop: threading.Event, acks: str = "all") -> None:
        super().__init__(name=name, daemon=True)
        self.url = url
        self.acks = acks
        self.stop = stop
        self.acked: dict[str, str] = {}
        self.batches_acked = 0
        self.failures: list[object] = []

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            batch: list[tuple[str, str | None]] = [
                (f"{self.name}-{number:05d}-{i}", f"v{number}.{i}") for i in range(BATCH)
            ]
            number += 1
            try:
                status, reply = produce(self.url, QUEUE, batch, acks=self.acks)
            except OSError as exc:
                status, reply = 0, repr(exc)
            if status == 200:
                self.acked.update((key, value) for key, value in batch if value is not None)
                self.batches_acked += 1
            else:
                self.failures.append(reply)
                self.stop.wait(0.05)  # back off while the chain is broken


def replica_entries(cluster: LocalCluster, node: str) -> list[tuple[int, bytes, bytes | None]]:
    with ShardStore.open(str(cluster.data_dir(node) / "shards" / "0")) as store:
        return [(entry.seq, entry.key, entry.value) for entry in store.scan(after_seq=0)]


@pytest.mark.parametrize("role", ["head", "middle", "tail"])
def test_kill_9_one_node_under_acks_all_load(start_cluster: StartCluster, role: str) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    chain = cluster.topology.shards[0]
    victim = {"head": chain.head, "middle": chain.chain[1], "tail": chain.tails[0]}[role]
    stop = threading.Event()
    head_url = cluster.url(chain.head)
    producers = [LoadProducer(head_url, f"p{i}", stop) for i in range(2)]
    # acks=1 adds entries the head holds but the chain has not committed while a node is down,
    # so the restarted node has a backlog to catch up; they too must reach every replica.
    producers.append(LoadProducer(head_url, "p-acks1", stop, acks="1"))

    def acked_batches() -> int:
        return sum(producer.batches_acked for producer in producers if producer.acks == "all")

    for producer in producers:
        producer.start()
    try:
        wait_until(lambda: acked_batches() >= BATCHES_BEFORE, "load before the kill")
        assert cluster.kill(victim, signal.SIGKILL) == -signal.SIGKILL
        if role == "head":
            wait_until(lambda: any(p.failures for p in producers), "producers to see the loss")
        else:
            # The head keeps writing but cannot commit: a backlog past the committed seq.
            wait_until(
                lambda: (seqs := shard_seqs(cluster, chain.head, 0)) and seqs[0] > seqs[1] + 200,
                "the head to build a backlog of uncommitted entries",
            )
        cluster.start(victim)
        resumed_from = acked_batches()
        wait_until(
            lambda: acked_batches() >= resumed_from + BATCHES_AFTER,
            "the chain to resume by itself",
            timeout_s=PRODUCE_TIMEOUT_S,
        )
    finally:
        stop.set()
        for producer in producers:
            producer.join(timeout=PRODUCE_TIMEOUT_S + 5)
    assert not any(producer.is_alive() for producer in producers)
    acked = {key: value for producer in producers for key, value in producer.acked.items()}
    failures = {producer.name: len(producer.failures) for producer in producers}
    print(f"{len(acked)} messages acknowledged; failed requests: {failures}")

    last_seq = cluster.wait_replicated()[0]
    snapshot = read_snapshot(cluster.url(chain.tails[0]), QUEUE, "check", limit=10_000)
    assert snapshot.boundary == last_seq
    consumed = {m["key"]: m["value"] for m in snapshot.messages}
    missing = sorted(set(acked) - set(consumed))
    assert missing == [], f"{len(missing)} acknowledged messages lost, first {missing[:5]}"
    assert {key: consumed[key] for key in acked} == acked

    assert cluster.stop() == dict.fromkeys(chain.members, 0)
    entries = {node: replica_entries(cluster, node) for node in chain.members}
    prefix = QUEUE.encode() + b"\x00"
    for node, rows in entries.items():
        assert rows == entries[chain.head], f"replica {node} differs from the head"
        keys = {key[len(prefix) :].decode() for _, key, _ in rows if key.startswith(prefix)}
        assert set(acked) <= keys, f"replica {node} lacks acknowledged messages"
