"""Chains spliced under load (issue 11, node side): real node processes, the test playing the
cluster manager by posting signed topologies (docs/node-api.md, "Topology changes").

Producers run with ``acks=all`` throughout, each its own client following the topology; after
each change every acknowledged message must be consumed, in each producer's order, at the new
tail. Every wait is a bounded poll; the producers' keys are their own (no randomness)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from chaos import checker
from chaos.history import Recorder
from chaos.procs.campaign import queues_one_per_shard
from chaos.procs.workload import Consumer
from chaos.procs.workload import Producer as ChaosProducer
from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.signing import sign
from kayos.topology import ShardChain, Topology
from tests.support.cluster import WAIT_S, answered_status, read_snapshot, wait_until

pytestmark = pytest.mark.integration

QUEUE = "spliced"
PRODUCERS = 2
# Acknowledged messages each producer gets before a fault, and after the change.
BEFORE = 20
AFTER = 20


def signed(topology: Topology) -> dict[str, Any]:
    assert topology.identity is not None
    body = topology.to_json()
    return {"body": body, "mac": sign(topology.identity, "topology", body)}


def post_topology(cluster: LocalCluster, node: str, message: Any) -> tuple[int, Any]:
    return http_json(cluster.url(node) + "/v1/admin/topology", method="POST", body=message)


def spliced(topology: Topology, without: str) -> Topology:
    """The next epoch's topology: ``without`` taken out of every chain (the manager's splice)."""
    shards = {
        shard.id: ShardChain(shard.id, tuple(n for n in shard.chain if n != without))
        for shard in topology.shards.values()
    }
    return Topology(topology.epoch + 1, topology.nodes, shards, topology.identity)


def publish(cluster: LocalCluster, topology: Topology) -> float:
    """Posts ``topology`` to every running node (as the manager does); returns when it was
    posted (time.monotonic) and checks each node applied it."""
    message = signed(topology)
    posted = time.monotonic()
    for node in cluster.ids:
        if cluster.running(node):
            status, reply = post_topology(cluster, node, message)
            assert status == 200, (node, reply)
            assert reply == {"epoch": topology.epoch, "applied": True}, (node, reply)
    return posted


@dataclass
class Producer:
    """One producer thread: keys ``p<i>-<n>`` one at a time with acks=all; the acked ones kept,
    with when each was acked; failures (retries exhausted) counted, never fatal."""

    index: int
    urls: list[str]
    acked: list[str] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"producer-{self.index}")
        self.thread.start()

    def _run(self) -> None:
        with Client(self.urls, name=f"producer-{self.index}") as client:
            n = 0
            while not self.stop.is_set():
                key = f"p{self.index}-{n:05d}"
                n += 1
                try:
                    client.produce(QUEUE, key, f"v-{key}", acks="all")
                except KayosError as exc:
                    self.failures.append(f"{key}: {exc}")
                    continue
                self.acked.append(key)
                self.acked_at.append(time.monotonic())

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(WAIT_S * 2)
        assert not self.thread.is_alive(), f"producer {self.index} did not stop"


def start_producers(cluster: LocalCluster) -> list[Producer]:
    producers = [Producer(i, list(cluster.urls.values())) for i in range(PRODUCERS)]
    for producer in producers:
        producer.start()
    wait_until(
        lambda: all(len(p.acked) >= BEFORE for p in producers), "acks before the fault", WAIT_S
    )
    return producers


def acked_after(producers: list[Producer], since: float, count: int) -> bool:
    return all(sum(1 for t in p.acked_at if t > since) >= count for p in producers)


def check_consumed(cluster: LocalCluster, tail: str, producers: list[Producer]) -> None:
    """Every acknowledged message is at the tail, each producer's in the order it produced them
    (a retried one may be there twice: at-least-once)."""
    snapshot = read_snapshot(cluster.url(tail), QUEUE, "check")
    keys = [m["key"] for m in snapshot.messages]
    assert all(m["value"] == f"v-{m['key']}" for m in snapshot.messages)
    last_position = {key: i for i, key in enumerate(keys)}
    for producer in producers:
        missing = [key for key in producer.acked if key not in last_position]
        assert not missing, f"producer {producer.index}: acked but not consumed: {missing[:10]}"
        positions = [last_position[key] for key in producer.acked]
        assert positions == sorted(positions), f"producer {producer.index}: out of order"
    print(
        f"consumed {len(keys)} ({len(set(keys))} distinct); acked "
        f"{sum(len(p.acked) for p in producers)}; failed attempts "
        f"{sum(len(p.failures) for p in producers)}"
    )


def link_down(cluster: LocalCluster, node: str, peer: str) -> bool:
    links = answered_status(cluster, node)["shards"]["0"]["links"]
    return any(link["peer"] == peer and not link["up"] for link in links)


def splice_under_load(cluster: LocalCluster, victim: str) -> tuple[Topology, list[Producer]]:
    """kill -9 ``victim``, post the spliced chain, check the producers go on and every acked
    message is consumed; prints the time from the post to the first acks=all success."""
    producers = start_producers(cluster)
    try:
        cluster.kill(victim, signal.SIGKILL)
        # As the manager would: the splice comes once the neighbours have seen the link drop
        # (acks=all producers are stuck by then, waiting at the head or failing to connect).
        old_chain = cluster.topology.shards[0]
        for node in (old_chain.upstream_of(victim), *old_chain.downstreams_of(victim)):
            if node is not None:
                wait_until(lambda n=node: link_down(cluster, n, victim), f"{node} sees the drop")
        new = spliced(cluster.topology, victim)
        posted = publish(cluster, new)
        wait_until(lambda: acked_after(producers, posted, 1), "a first ack after the splice")
        first = min(t for p in producers for t in p.acked_at if t > posted)
        print(f"splice without {victim}: first acks=all success {1000 * (first - posted):.0f} ms")
        wait_until(lambda: acked_after(producers, posted, AFTER), "acks after the splice")
    finally:
        for producer in producers:
            producer.finish()
    tail = new.shards[0].tails[0]
    check_consumed(cluster, tail, producers)
    for node in new.shards[0].members:
        status = answered_status(cluster, node)
        assert status["epoch"] == new.epoch
        replica = status["shards"]["0"]
        assert replica["role"] == new.shards[0].role_of(node)
        assert replica["upstream"] == new.shards[0].upstream_of(node)
        assert replica["rolled_back_committed_entries"] == 0
    # The head measures its new downstream: PING/PONG round trips and ACK delays.
    head, below = new.shards[0].chain[0], new.shards[0].downstreams_of(new.shards[0].chain[0])[0]
    latency = answered_status(cluster, head)["latency"][below]
    assert latency["samples"] > 0, latency
    assert 0 <= latency["p99_ms"] < 10_000, latency
    return new, producers


@pytest.fixture
def chain3(start_cluster: Any) -> LocalCluster:
    cluster: LocalCluster = start_cluster(nodes=3, replicas=3, shards=1)
    assert cluster.topology.shards[0].chain == ("a", "b", "c")
    return cluster


@pytest.mark.timeout(240)
def test_kill_the_middle_and_splice(chain3: LocalCluster) -> None:
    new, _ = splice_under_load(chain3, "b")
    assert new.shards[0].chain == ("a", "c")
    # A node restarted after the splice takes its epoch from DATA/topology.json: the tail alone,
    # with no peer to ask, comes back at the new epoch, following the head.
    chain3.kill("c", signal.SIGKILL)
    chain3.kill("a", signal.SIGKILL)
    chain3.start("c")
    status = answered_status(chain3, "c")
    assert status["epoch"] == new.epoch
    assert status["shards"]["0"]["upstream"] == "a"


@pytest.mark.timeout(240)
def test_kill_the_head_and_splice(chain3: LocalCluster) -> None:
    new, _ = splice_under_load(chain3, "a")
    assert new.shards[0].head == "b"
    takeover = answered_status(chain3, "b")["shards"]["0"]["takeover"]
    assert len(takeover) == 2, f"the new head records its takeover entry: {takeover}"
    # The old head, restarted with the old file and no DATA/topology.json (it was dead when the
    # splice was posted), learns the newer signed topology from its peers: it is no head.
    chain3.start("a")
    status = answered_status(chain3, "a")
    assert status["epoch"] == new.epoch
    assert "0" not in status["shards"]
    code, reply = http_json(
        chain3.url("a") + f"/v1/queues/{QUEUE}/messages?acks=all",
        method="POST",
        body={"messages": [{"key": "late", "value": "v"}]},
    )
    assert code == 421, reply
    assert reply["error"]["node"] == "b"


@pytest.mark.timeout(240)
def test_kill_the_tail_and_splice(chain3: LocalCluster) -> None:
    new, _ = splice_under_load(chain3, "c")
    assert new.shards[0].tails == ("b",)


def test_a_stale_or_unsigned_topology_changes_nothing(chain3: LocalCluster) -> None:
    before = {node: answered_status(chain3, node)["shards"]["0"]["role"] for node in chain3.ids}
    topology = chain3.topology
    new = spliced(topology, "b")
    message = signed(new)
    for bad, code in (
        ({"body": message["body"]}, 401),  # no mac
        ({"body": message["body"], "mac": "00" * 32}, 401),  # a wrong one
        ({"body": {**message["body"], "epoch": 9}, "mac": message["mac"]}, 401),  # altered
        (new.to_json(), 400),  # not a signed message at all
    ):
        status, reply = post_topology(chain3, "a", bad)
        assert status == code, (bad, reply)
    # Signed, but not newer: acknowledged, nothing applied.
    same = Topology(topology.epoch, topology.nodes, new.shards, topology.identity)
    status, reply = post_topology(chain3, "a", signed(same))
    assert (status, reply) == (200, {"epoch": topology.epoch, "applied": False})
    for node in chain3.ids:
        found = answered_status(chain3, node)
        assert found["epoch"] == topology.epoch
        assert found["shards"]["0"]["role"] == before[node]
    assert not (chain3.data_dir("a") / "topology.json").exists()
    code, served = http_json(chain3.url("a") + "/v1/topology")
    assert code == 200
    assert "mac" not in served
    # A newer one is applied once; the same again is not.
    assert post_topology(chain3, "a", message) == (200, {"epoch": new.epoch, "applied": True})
    assert post_topology(chain3, "a", message) == (200, {"epoch": new.epoch, "applied": False})
    code, served = http_json(chain3.url("a") + "/v1/topology")
    assert served["mac"] == message["mac"]
    assert served["epoch"] == new.epoch


@pytest.mark.timeout(300)
def test_a_splice_of_rotated_chains_passes_the_chaos_checker(start_cluster: Any, seed: int) -> None:
    """Three shards with rotated roles over three nodes: the node killed is the head of one
    shard, the middle of another and the tail of the third. The chaos workload (producers with
    keyed versions, transactions and deletes; consumers committing their groups) runs
    throughout; after the splice the history must pass the chaos checker: nothing acknowledged
    lost, order, atomicity, de-dup, high-water marks."""
    cluster: LocalCluster = start_cluster(nodes=3, replicas=3, shards=3)
    queues = queues_one_per_shard(cluster)
    seeds = list(cluster.urls.values())
    recorder = Recorder()
    producers = [ChaosProducer(n, seeds, list(queues.values()), recorder, seed) for n in range(3)]
    consumers = [Consumer(queue, "g0", seeds, recorder) for queue in queues.values()]
    workers = [*producers, *consumers]
    try:
        for worker in workers:
            worker.start()
        wait_until(lambda: sum(p.stats.ok for p in producers) >= 30, "acks before the fault")
        cluster.kill("b", signal.SIGKILL)
        new = spliced(cluster.topology, "b")
        posted = publish(cluster, new)
        before = sum(p.stats.ok for p in producers)
        wait_until(lambda: sum(p.stats.ok for p in producers) >= before + 60, "acks after")
        print(f"60 acks after the splice in {time.monotonic() - posted:.2f} s")
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join(WAIT_S * 2)
        final = wait_until(lambda: converged(cluster, new), "the spliced chains level")
        for consumer in consumers:
            consumer.drain_to = final[cluster.topology.shard_for(consumer.queue)]
        for consumer in consumers:
            assert consumer.drained.wait(WAIT_S * 2), f"{consumer.name} did not drain"
    finally:
        for worker in workers:
            worker.stop.set()
        for worker in workers:
            worker.join(WAIT_S * 2)
    verdict = checker.check(recorder.snapshot_of_events())
    print(
        f"acked versions {verdict.acked_versions}, delivered {verdict.delivered_messages}, "
        f"snapshots {verdict.snapshots}, unknown produces {sum(p.stats.unknown for p in producers)}"
    )
    assert verdict.ok, [violation.to_json() for violation in verdict.violations]
    assert verdict.acked_versions > 0


def converged(cluster: LocalCluster, topology: Topology) -> dict[int, int] | None:
    """Each shard's last seq once every member of its new chain holds and has committed it."""
    found: dict[int, int] = {}
    for shard in topology.shards.values():
        seqs = set()
        for node in shard.members:
            replica = answered_status(cluster, node)["shards"].get(str(shard.id))
            if replica is None:
                return None
            seqs.add((replica["durable_seq"], replica["committed_seq"]))
        if len(seqs) != 1:
            return None
        durable, committed = seqs.pop()
        if durable != committed:
            return None
        found[shard.id] = durable
    return found


@pytest.mark.timeout(300)
def test_a_paused_middle_is_spliced_out_and_told_on_return(chain3: LocalCluster) -> None:
    """SIGSTOP of the middle (a slow node, not a dead one): once the head sees the link drop, the
    splice goes to the head and the tail; producers go on. On SIGCONT the old middle still runs
    epoch 1 and its links are refused; told the new topology, it closes the shard (its store is
    kept on disk)."""
    cluster = chain3
    producers = start_producers(cluster)
    pid = cluster.pid("b")
    assert pid is not None
    new = spliced(cluster.topology, "b")
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: link_down(cluster, "a", "b"), "a sees b silent")
            message = signed(new)
            posted = time.monotonic()
            for node in ("a", "c"):
                assert post_topology(cluster, node, message) == (
                    200,
                    {"epoch": new.epoch, "applied": True},
                )
            wait_until(lambda: acked_after(producers, posted, AFTER), "acks after the splice")
        finally:
            os.kill(pid, signal.SIGCONT)
        status = answered_status(cluster, "b")
        assert status["epoch"] == 1
        assert post_topology(cluster, "b", signed(new)) == (
            200,
            {"epoch": new.epoch, "applied": True},
        )
        assert "0" not in answered_status(cluster, "b")["shards"]
        assert (cluster.data_dir("b") / "shards" / "0").is_dir()
    finally:
        for producer in producers:
            producer.finish()
    check_consumed(cluster, "c", producers)


@pytest.mark.timeout(240)
def test_the_whole_cluster_starts_again_after_a_chain_change(start_cluster: Any) -> None:
    """`make run`, a splice by the manager, Ctrl-C, `make run`: the launcher judges the restarted
    cluster by the chains the nodes hold (epoch 2), not by the file it wrote (epoch 1), where the
    new head of a shard still has an upstream and would never show it linked."""
    cluster: LocalCluster = start_cluster(nodes=3, replicas=3, shards=3)
    with Client(cluster.url("a")) as client:
        for n in range(20):
            client.produce(f"q{n}", f"k{n}", f"v{n}", acks="all")
    new = spliced(cluster.topology, "b")
    assert new.shards[1].chain == ("c", "a")  # c, a middle in the file, is head now
    publish(cluster, new)
    assert set(cluster.stop().values()) == {0}
    cluster.start_all()
    assert cluster.live_topology().epoch == new.epoch
    assert any("shard 1: c -> a " in line for line in cluster.describe())
    with Client(cluster.url("a")) as client:
        for n in range(20):
            values = [m.value for page in client.consume(f"q{n}", "fresh") for m in page.messages]
            assert values == [f"v{n}".encode()], n
