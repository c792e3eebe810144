"""Learners and repair links, the deterministic parts (docs/replication-protocol.md, "Learners and
repair links"; docs/node-api.md, "Learners"): HELLO's new roles with golden bytes, who may copy
a shard, the throttle's decision, and the signed catch-up message's checks."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kayos.clock import SystemClock
from kayos.errors import InvalidRequest, Unauthenticated, WrongRoleError
from kayos.node.replicas import learners
from kayos.node.replicas.learners import CatchUpOrder, parse_catch_up
from kayos.replication.link.downstream import check_copy_peer
from kayos.replication.logic import chain
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import frames as fr
from kayos.signing import sign
from kayos.topology import NodeAddr, ShardChain, Topology
from tests.support.links import TEST_IDENTITY

pytestmark = pytest.mark.unit


def test_hello_roles_golden_bytes() -> None:
    learner = bytes.fromhex("0000000f 01 9503a1640005a76c6561726e6572")
    repair = bytes.fromhex("0000000e 01 9503a1640005a6726570616972")
    assert fr.encode(fr.Hello(3, "d", 0, 5, "learner")) == learner
    assert fr.encode(fr.Hello(3, "d", 0, 5, "repair")) == repair
    decoder = fr.FrameDecoder()
    assert decoder.feed(learner + repair) == [
        fr.Hello(3, "d", 0, 5, "learner"),
        fr.Hello(3, "d", 0, 5, "repair"),
    ]
    with pytest.raises(InvalidRequest):
        fr.Hello(3, "d", 0, 5, "observer")


def test_copy_pause_keeps_the_link_within_its_share() -> None:
    # An idle shard (no live write within the window) is copied at full speed.
    assert chain.copy_pause_s(0.5, live_s_ago=2.0, live_window_s=1.0, share=0.2) == 0.0
    # Under live writes the link works at most `share` of the time: busy / (busy + pause).
    for share in (0.1, 0.2, 0.5, 1.0):
        pause = chain.copy_pause_s(0.03, live_s_ago=0.1, live_window_s=1.0, share=share)
        assert 0.03 / (0.03 + pause) == pytest.approx(share)
    assert chain.copy_pause_s(0.0, live_s_ago=0.0, live_window_s=1.0, share=0.2) == 0.0


def _topology() -> Topology:
    nodes = {n: NodeAddr(n, "127.0.0.1", 1000 + i, 2000 + i) for i, n in enumerate("abcd")}
    return Topology(4, nodes, {0: ShardChain(0, ("a", "b", "c"), ())}, TEST_IDENTITY)


def test_who_may_copy_a_shard(tmp_path: Path) -> None:
    topology = _topology()
    replica = ShardReplica(
        node_id="b",
        topology=topology,
        shard=topology.shards[0],
        store_path=str(tmp_path / "b"),
        clock=SystemClock(),
        rng=random.Random(1),
    )
    try:
        check_copy_peer(replica, "d", "learner")  # outside the chain, in the topology
        check_copy_peer(replica, "a", "repair")  # a member repairing itself
        check_copy_peer(replica, "c", "repair")
        for node, role in (("a", "learner"), ("c", "learner"), ("x", "learner"), ("d", "repair")):
            with pytest.raises(WrongRoleError):
                check_copy_peer(replica, node, role)
        with pytest.raises(WrongRoleError):
            check_copy_peer(replica, "b", "repair")  # itself
    finally:
        replica.close()


def test_learner_replica_counts_in_no_chain(tmp_path: Path) -> None:
    topology = _topology()
    replica = ShardReplica(
        node_id="d",
        topology=topology,
        shard=topology.shards[0],
        store_path=str(tmp_path / "d"),
        clock=SystemClock(),
        rng=random.Random(1),
        learner_upstream="c",
    )
    try:
        assert (replica.role, replica.upstream, replica.downstreams) == ("learner", "c", ())
        assert replica.repair_status() is None
        assert not replica.repairing
        with pytest.raises(WrongRoleError):
            replica.check_head()
    finally:
        replica.close()


def test_catch_up_message_checks() -> None:
    body = {"epoch": 4, "shard": 0, "upstream": "c"}
    signed = {"body": body, "mac": sign(TEST_IDENTITY, "catch-up", body)}
    assert parse_catch_up(TEST_IDENTITY, signed) == CatchUpOrder(4, 0, "c")
    # A MAC for another purpose, or none, or the body changed after signing: 401.
    for mac in (sign(TEST_IDENTITY, "topology", body), "", None, "0" * 64):
        with pytest.raises(Unauthenticated):
            parse_catch_up(TEST_IDENTITY, {"body": body, "mac": mac})
    with pytest.raises(Unauthenticated):
        parse_catch_up(TEST_IDENTITY, {"body": {**body, "shard": 1}, "mac": signed["mac"]})
    with pytest.raises(Unauthenticated):
        parse_catch_up(None, signed)
    # Well signed but malformed: 400.
    for bad in (
        {"epoch": 4, "shard": 0},
        {"epoch": 4, "shard": 0, "upstream": "c", "extra": 1},
        {"epoch": -1, "shard": 0, "upstream": "c"},
        {"epoch": 4, "shard": True, "upstream": "c"},
        {"epoch": 4, "shard": 2**32, "upstream": "c"},
        {"epoch": 4, "shard": 0, "upstream": 7},
    ):
        with pytest.raises(InvalidRequest):
            parse_catch_up(
                TEST_IDENTITY, {"body": bad, "mac": sign(TEST_IDENTITY, "catch-up", bad)}
            )
    for shape in (None, [], {"body": body}, {"body": body, "mac": signed["mac"], "x": 1}):
        with pytest.raises(InvalidRequest):
            parse_catch_up(TEST_IDENTITY, shape)


def test_a_topology_that_comes_while_the_learners_store_opens_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a snapshot the learner's store opens on a thread; a topology applied meanwhile finds
    no replica to hand to (follow_topology), so the new replica must take the node's topology
    itself, or its links HELLO at the old epoch and are refused for good (kayos bench grow)."""
    old = _topology()
    new = Topology(old.epoch + 1, old.nodes, old.shards, TEST_IDENTITY)
    node = SimpleNamespace(
        node_id="d",
        topology=old,
        clock=SystemClock(),
        rng=random.Random(1),
        copy_rate_mb_per_s_max=0.0,
    )

    def open_while_the_topology_changes(**kwargs: Any) -> ShardReplica:
        replica = ShardReplica(**kwargs)
        node.topology = new  # the reconfigure task ran while this thread opened the store
        return replica

    monkeypatch.setattr(learners, "ShardReplica", open_while_the_topology_changes)
    learner = learners.Learner("c")
    order = CatchUpOrder(old.epoch, 0, "c")

    async def open_it() -> None:
        # A task already set: open_learner starts no link task (nothing here to reach).
        learner.task = asyncio.create_task(asyncio.sleep(0))
        await learners.open_learner(node, learner, order, str(tmp_path / "d"), copied=False)
        await learner.task

    asyncio.run(open_it())
    assert learner.replica is not None
    try:
        assert learner.replica.epoch == new.epoch
        assert learner.replica.topology is new
    finally:
        learner.replica.close()
