"""Learners (issue 11, item 3): real ``kayos node`` processes. A node outside a shard's chain copies
it on a signed ``POST /v1/admin/catch-up``: it follows live writes once caught up, counts in the
tail's commit once level with it until the manager's word ends the count, resumes from its
durable seq, and a returning node whose history diverged rolls back only the divergent suffix
and re-fetches only what it lacks (docs/node-api.md, "Learners")."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from kayos.identity import write_private
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.signing import sign
from kayos.topology import ShardChain, Topology
from tests.support.cluster import (
    answered_replica,
    catch_up,
    learned_through,
    produce,
    produce_ok,
    served_metric,
    shard_status,
    wait_until,
)

pytestmark = pytest.mark.integration


def followers(
    cluster: LocalCluster, node: str, body: dict[str, Any], *, mac: str | None = None
) -> tuple[int, Any]:
    """The manager's catch-up list of a shard, signed (``POST /v1/admin/followers``)."""
    assert cluster.identity is not None
    signed = {"body": body, "mac": mac or sign(cluster.identity, "followers", body)}
    return http_json(f"{cluster.url(node)}/v1/admin/followers", method="POST", body=signed)


def counted(cluster: LocalCluster, node: str, shard: int = 0) -> list[str] | None:
    found = answered_replica(cluster, node, shard)
    return None if found is None else found.get("counted_followers")


def committed(cluster: LocalCluster, node: str, seq: int, *, timeout_ms: int) -> int:
    """The node's commit point once it reaches ``seq``, or as it is after ``timeout_ms`` (the
    node's own bounded wait)."""
    url = f"{cluster.url(node)}/v1/shards/0/committed?seq={seq}&timeout_ms={timeout_ms}"
    status, reply = http_json(url)
    assert status == 200, reply
    return int(reply["committed_seq"])


def fill(cluster: LocalCluster, url: str, queue: str, batches: int, size: int = 50) -> int:
    last = 0
    for batch in range(batches):
        messages = [(f"{queue}-{batch}-{i}", "x" * 100) for i in range(size)]
        _, last = produce_ok(url, queue, messages)
    return last


def test_learner_copies_follows_and_is_counted_once_level(start_cluster: Any) -> None:
    # Shard 0: a -> b -> c; d holds no replica of it.
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    head = cluster.url("a")
    last = fill(cluster, head, "q", 20)
    assert answered_replica(cluster, "d") is None

    # Refusals first: nothing changes.
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "c"}
    status, reply = catch_up(cluster, "d", body, mac="0" * 64)
    assert status == 401, reply
    status, reply = catch_up(cluster, "d", {**body, "epoch": cluster.topology.epoch - 1})
    assert (status, reply["error"]["code"]) == (409, "stale_epoch"), reply
    status, reply = catch_up(cluster, "b", body)
    assert (status, reply["error"]["code"]) == (400, "invalid_request"), reply
    status, reply = catch_up(cluster, "d", {**body, "upstream": "d"})
    assert status == 400, reply
    assert answered_replica(cluster, "d") is None

    status, reply = catch_up(cluster, "d", body)
    assert (status, reply) == (200, {"shard": 0, "state": "learning"})
    wait_until(lambda: learned_through(cluster, "d", last), "d copied the shard")
    learner = answered_replica(cluster, "d")
    assert learner is not None
    assert learner["upstream"] == "c"
    # Holding nothing, it copied the upstream's store file (docs/replication-protocol.md, "Store
    # snapshots"), not the entries one by one.
    assert learner["refetched_entries"] == 0, learner
    assert learner["snapshot"]["done"], learner
    assert learner["rolled_back_entries"] == 0
    # The same order again keeps the learner.
    assert catch_up(cluster, "d", body) == (200, {"shard": 0, "state": "learning"})

    # Live writes reach it once caught up.
    _, live = produce_ok(head, "q", [("live", "v")])
    wait_until(lambda: learned_through(cluster, "d", live), "d followed a live write")
    wait_until(
        lambda: (s := shard_status(cluster, "d")) is not None and s["committed_seq"] >= live,
        "d learned the commit point",
    )
    # The upstream lists it apart from the chain.
    upstream = answered_replica(cluster, "c")
    assert upstream is not None
    assert upstream["downstreams_linked"] == ["learner:d"], upstream

    # Level with c's commit point, it counts in c's commit (docs/replication-protocol.md,
    # "Counting a catch-up follower"). The count is in c's store: it survives a kill -9 of c
    # (the upstream dies between the count starting and the manager's new chain).
    wait_until(lambda: counted(cluster, "c") == ["d"], "c counts d in its commit")
    cluster.kill("c", signal.SIGKILL)
    cluster.start("c")
    assert counted(cluster, "c") == ["d"]
    wait_until(lambda: learned_through(cluster, "d", live), "d linked to c again")

    # Gone, d holds the commit back: only the manager's word ends the count, never a dropped
    # link (a tail that stopped counting a follower the manager had made a member acknowledged
    # writes alone: simulator seed 567).
    cluster.kill("d", signal.SIGKILL)
    status, reply = produce(head, "q", [("after-d", "v")], acks="1")
    assert status == 200, reply
    after_kill = int(reply["last_seq"])
    assert committed(cluster, "a", after_kill, timeout_ms=1_000) < after_kill
    # The manager's catch-up list at another epoch changes nothing; at c's, it ends the count.
    epoch = cluster.topology.epoch
    stale = {"epoch": epoch + 1, "shard": 0, "followers": []}
    assert followers(cluster, "c", stale) == (200, {"shard": 0, "counted_followers": ["d"]})
    assert followers(cluster, "c", stale, mac="0" * 64)[0] == 401
    word = {"epoch": epoch, "shard": 0, "followers": []}
    assert followers(cluster, "c", word) == (200, {"shard": 0, "counted_followers": []})
    assert committed(cluster, "a", after_kill, timeout_ms=30_000) >= after_kill
    # Restarted, c counts nobody: the end of the count was recorded too.
    cluster.kill("c", signal.SIGKILL)
    cluster.start("c")
    assert counted(cluster, "c") == []

    # Resumable: restarted and ordered again, it copies only what it lacks.
    cluster.start("d")
    assert answered_replica(cluster, "d") is None  # a learner lives until the node stops
    assert catch_up(cluster, "d", body)[0] == 200
    wait_until(lambda: learned_through(cluster, "d", after_kill), "d resumed")
    learner = answered_replica(cluster, "d")
    assert learner is not None
    assert learner["refetched_entries"] <= 2, learner


def test_returning_node_rolls_back_only_its_divergent_suffix(start_cluster: Any) -> None:
    """a heads a -> b -> c. With b and c stopped, a takes DIVERGED writes with acks=1 that no one
    else holds, and stops. b heads a new chain b -> c (epoch 2) and takes NEW writes. a returns
    outside the chain and learns from b: it rolls back exactly the DIVERGED entries and re-fetches
    the NEW ones, whatever the shard's size."""
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    shared = fill(cluster, cluster.url("a"), "q", 40)  # 2000 entries everyone holds
    cluster.kill("c", signal.SIGTERM)
    cluster.kill("b", signal.SIGTERM)
    diverged = 30
    status, reply = produce(
        cluster.url("a"), "q", [(f"lost-{i}", "v") for i in range(diverged)], acks="1"
    )
    assert status == 200, reply
    cluster.kill("a", signal.SIGTERM)

    old = cluster.topology
    cluster.topology = Topology(
        old.epoch + 1, old.nodes, {0: ShardChain(0, ("b", "c"), ())}, old.identity
    )
    write_private(str(cluster.topology_path), cluster.topology.dumps_toml())
    cluster.start("b")
    cluster.start("c")
    new = 25
    produce_ok(cluster.url("b"), "q", [(f"new-{i}", "v") for i in range(new)])
    head = answered_replica(cluster, "b")
    assert head is not None
    last = int(head["last_seq"])  # the new entries and b's takeover entry's commit
    cluster.start("a")
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "b"}
    assert catch_up(cluster, "a", body)[0] == 200
    wait_until(lambda: learned_through(cluster, "a", last), "a caught up with b")
    learner = answered_replica(cluster, "a")
    assert learner is not None
    print(f"shared {shared}, diverged {diverged}, new {new}: {learner}")
    assert learner["rolled_back_entries"] == diverged, learner
    assert learner["rolled_back_committed_entries"] == 0, learner
    assert learner["refetched_entries"] == new, learner
    assert learner["durable_seq"] == last
    # Only the suffix came, entry by entry: no store file, and the payload of the new entries
    # (keys of about 12 bytes and one-byte values) rather than the shard's.
    assert served_metric(cluster, "a", "kayos_copy_bytes_total", mode="file") == 0
    copied = served_metric(cluster, "a", "kayos_copy_bytes_total", mode="log")
    assert copied is not None
    assert 0 < copied <= new * 20, copied
    assert learner["copy_mode"] == "log", learner
    assert learner["refetched_bytes"] == copied, learner


def test_a_topology_making_the_learner_a_member_keeps_what_it_copied(start_cluster: Any) -> None:
    """d learns shard 0 from c; the next topology (a -> b -> c -> d) makes it the tail: the
    learner closes, the tail's replica opens the same store and goes on from there (nothing is
    copied again), and the shard is fully replicated on four members."""
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    last = fill(cluster, cluster.url("a"), "q", 10)
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "c"}
    assert catch_up(cluster, "d", body)[0] == 200
    wait_until(lambda: learned_through(cluster, "d", last), "d copied the shard")
    old = cluster.topology
    assert old.identity is not None
    new = Topology(
        old.epoch + 1, old.nodes, {0: ShardChain(0, ("a", "b", "c", "d"), ())}, old.identity
    )
    message = {"body": new.to_json(), "mac": sign(old.identity, "topology", new.to_json())}
    for node in cluster.ids:
        status, reply = http_json(
            f"{cluster.url(node)}/v1/admin/topology", method="POST", body=message
        )
        assert status == 200, (node, reply)
    cluster.topology = new
    _, after = produce_ok(cluster.url("a"), "q", [("joined", "v")])
    assert cluster.wait_replicated(60)[0] == after
    member = answered_replica(cluster, "d")
    assert member is not None
    assert member["role"] == "tail", member
    # The copy was kept: at most what was written after the switch may come by catch-up (the
    # write can land before the new tail subscribes).
    assert member["refetched_entries"] <= after - last, member
    assert member["rolled_back_entries"] == 0, member
