"""A member left catching up, made head of a chain of it alone (campaign seed 2512,
docs/campaigns.md): real ``kayos node`` processes. b, tail of a -> b, holds every acknowledged
write; its store also names a catch-up target past its last seq, as a SUBSCRIBE that found it
behind leaves it when the node dies before getting there (written into the stopped node's store
here, so the state does not hang on a race). a is gone and the next topology makes b the chain
(c, running outside it, is sent that topology).
b gives the target up as it becomes head (docs/replication-protocol.md, "A head gives up its
catch-up"): it serves every acknowledged write to a reader, and a learner c subscribes to it and
copies everything, the shard's second copy (the campaign's q answered both `unavailable` for
good)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from kayos.identity import write_private
from kayos.local.http import http_json
from kayos.replication.shard.local_meta import CATCH_UP_META_KEY
from kayos.signing import sign
from kayos.storage import ShardStore
from kayos.topology import ShardChain, Topology
from tests.support.cluster import (
    answered_replica,
    answered_seqs,
    catch_up,
    learned_through,
    produce_ok,
    read_snapshot,
    shard_status,
    wait_until,
)

pytestmark = pytest.mark.integration

QUEUE = "q"
AHEAD = 50  # how far past b's last seq the target it never reached lies


def test_a_member_left_catching_up_leads_alone_and_feeds_a_learner(start_cluster: Any) -> None:
    cluster = start_cluster(nodes=3, replicas=2, shards=1)
    assert cluster.topology.shards[0].members == ("a", "b"), cluster.topology.shards[0]
    acknowledged: list[str] = []
    last = 0
    for batch in range(10):
        messages: list[tuple[str, str | None]] = [
            (f"{QUEUE}-{batch}-{i}", f"v{batch}-{i}") for i in range(20)
        ]
        _, last = produce_ok(cluster.url("a"), QUEUE, messages)  # acks=all: b holds them
        acknowledged += [key for key, _ in messages]
    assert answered_seqs(cluster, "b", 0)[0] == last
    cluster.kill("a", signal.SIGTERM)
    cluster.kill("b", signal.SIGTERM)

    store = ShardStore.open(str(cluster.data_dir("b") / "shards" / "0"))
    try:
        assert store.last_seq == last
        store.commit([], meta={CATCH_UP_META_KEY: last + AHEAD})
    finally:
        store.close()
    old = cluster.topology
    cluster.topology = Topology(
        old.epoch + 1, old.nodes, {0: ShardChain(0, ("b",), ())}, old.identity
    )
    write_private(str(cluster.topology_path), cluster.topology.dumps_toml())
    cluster.start("b")
    assert old.identity is not None
    new = cluster.topology.to_json()
    message = {"body": new, "mac": sign(old.identity, "topology", new)}
    status, reply = http_json(f"{cluster.url('c')}/v1/admin/topology", method="POST", body=message)
    assert status == 200, reply

    head = answered_replica(cluster, "b")
    assert head is not None
    assert head["role"] == "head", head
    assert head["catching_up"] is False, head
    # Every acknowledged write is read from it.
    read = read_snapshot(cluster.url("b"), QUEUE, "reader")
    assert sorted(m["key"] for m in read.messages) == sorted(acknowledged)
    # It takes writes, and a learner copies all it holds.
    _, after = produce_ok(cluster.url("b"), QUEUE, [("after", "v")])
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "b"}
    assert catch_up(cluster, "c", body)[0] == 200
    wait_until(lambda: learned_through(cluster, "c", after), "c copied b's history")
    learner = shard_status(cluster, "c")
    assert learner is not None
    assert learner["catching_up"] is False, learner
