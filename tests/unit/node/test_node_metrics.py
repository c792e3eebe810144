"""A node's metrics in process (docs/node-api.md, "Metrics"): every sample carries the node and
cluster labels; a group's lag counts only its own queue's committed entries, is 0 messages and 0
seconds once it has read everything, and past the scan budget is an estimate that errs high; a
shard refuses a group past ``limits.groups_per_shard_max``; what a topology change counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kayos import limits
from kayos.errors import LimitExceeded
from kayos.node.http.metrics import (
    UNIDENTIFIED_CLUSTER,
    Collector,
    Labelled,
    cluster_label,
)
from kayos.node.lag import GroupLag, group_lags
from kayos.node.replicas.reconfigure import change_kinds, plan_changes
from kayos.node.runtime import Node
from kayos.topology import ShardChain, Topology
from tests.support.deploy.promql import samples
from tests.support.links import one_shard_topology
from tests.support.replicas import node_chain

pytestmark = pytest.mark.unit


async def produce(node: Node, queue: str, count: int) -> tuple[int, int]:
    keys = [f"k{i}".encode() for i in range(count)]
    return await node.produce(queue, keys, [b"v"] * count, None, None, acks=-1)


def lag_of(lags: list[GroupLag], queue: str, group: str) -> GroupLag:
    (found,) = [lag for lag in lags if lag.queue == queue and lag.group == group]
    return found


@pytest.mark.asyncio
async def test_a_groups_lag_counts_its_queues_committed_entries_and_is_0_once_read(
    tmp_path: Path,
) -> None:
    async with node_chain(tmp_path, "a") as (_, nodes):
        node = nodes["a"]
        first, _ = await produce(node, "q", 5)
        await produce(node, "other", 3)
        await node.commit_group("q", "g", first + 1, None)
        _, last_other = await produce(node, "other", 1)
        await node.commit_group("other", "done", last_other, None)

        lags = await group_lags(node.replicas, node.clock.now_s())
        behind = lag_of(lags, "q", "g")
        assert (behind.messages, behind.exact, behind.hwm) == (3, True, first + 1)
        assert behind.seconds is not None
        assert 0 <= behind.seconds <= 60
        done = lag_of(lags, "other", "done")
        assert (done.messages, done.seconds, done.exact) == (0, 0.0, True)

        _, last = await produce(node, "q", 2)
        await node.commit_group("q", "g", last, None)
        caught_up = lag_of(await group_lags(node.replicas, node.clock.now_s()), "q", "g")
        assert (caught_up.messages, caught_up.seconds) == (0, 0.0)


@pytest.mark.asyncio
async def test_past_the_scan_budget_a_groups_lag_is_an_estimate_that_errs_high(
    tmp_path: Path,
) -> None:
    async with node_chain(tmp_path, "a") as (_, nodes):
        node = nodes["a"]
        for _ in range(3):
            await produce(node, "other", 200)  # three store commits: several store pages
        _, last = await produce(node, "q", 10)
        await node.commit_group("q", "g", 0, None)

        exact = lag_of(await group_lags(node.replicas, node.clock.now_s()), "q", "g")
        assert (exact.messages, exact.exact) == (10, True)
        estimate = lag_of(await group_lags(node.replicas, node.clock.now_s(), budget=1), "q", "g")
        assert not estimate.exact
        assert estimate.messages >= 10
        assert estimate.messages <= last
        assert estimate.seconds is not None
        assert estimate.seconds >= 0


@pytest.mark.asyncio
async def test_a_shard_refuses_a_new_group_past_its_bound_but_moves_an_existing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "groups_per_shard_max", 2)
    async with node_chain(tmp_path, "a") as (_, nodes):
        node = nodes["a"]
        _, last = await produce(node, "q", 2)
        await node.commit_group("q", "g1", 1, None)
        await node.commit_group("q", "g2", 1, None)
        with pytest.raises(LimitExceeded, match="groups_per_shard_max"):
            await node.commit_group("q", "g3", 1, None)
        await node.commit_group("q", "g1", last, None)
        await node.delete_group("q", "g2")
        await node.commit_group("q", "g3", 1, None)


@pytest.mark.asyncio
async def test_every_sample_carries_the_node_and_cluster_labels(tmp_path: Path) -> None:
    async with node_chain(tmp_path, "a") as (topology, nodes):
        node = nodes["a"]
        await produce(node, "q", 4)
        await node.commit_group("q", "g", 1, None)
        collector = Collector(node)
        node.registry.register(collector)
        await collector.refresh()
        labels = {"node": "a", "cluster": cluster_label(topology)}
        found = samples(generate_latest(Labelled(node.registry, labels)).decode())

    assert topology.identity is not None
    assert labels["cluster"] == topology.identity.cluster_id
    assert [
        s for s in found if s[1].get("node") != "a" or s[1].get("cluster") != labels["cluster"]
    ] == []
    by_name = {(name, tuple(sorted(lab.items()))): value for name, lab, value in found}
    names = {name for name, _, _ in found}
    assert {"kayos_commit_seconds_bucket", "kayos_node_ready", "kayos_topology_epoch"} <= names
    group = {"cluster": labels["cluster"], "group": "g", "node": "a", "queue": "q", "shard": "0"}
    assert by_name["kayos_consumer_lag_messages", tuple(sorted(group.items()))] == 3
    shard = {"cluster": labels["cluster"], "node": "a", "shard": "0"}
    assert by_name["kayos_produced_messages_total", tuple(sorted(shard.items()))] == 4
    kind = {"cluster": labels["cluster"], "kind": "became_head", "node": "a"}
    assert by_name["kayos_topology_changes_total", tuple(sorted(kind.items()))] == 0


def test_a_topology_without_an_identity_is_labelled_unidentified() -> None:
    topology = one_shard_topology(["a"])
    bare = Topology(topology.epoch, topology.nodes, topology.shards)
    assert cluster_label(bare) == UNIDENTIFIED_CLUSTER


def test_a_splice_that_makes_a_node_head_counts_a_failover() -> None:
    old = one_shard_topology(["a", "b", "c"])
    new = Topology(2, old.nodes, {0: ShardChain(0, ("b", "c"), ())}, old.identity)
    plan_b = plan_changes("b", old, new)
    assert change_kinds("b", old, new, plan_b) == ["topology", "shard_remade", "became_head"]
    # c keeps its place (tail, fed by b): nothing happens to its replica.
    assert change_kinds("c", old, new, plan_changes("c", old, new)) == ["topology"]
    assert change_kinds("a", old, new, plan_changes("a", old, new)) == ["topology", "shard_closed"]
    same = Topology(3, new.nodes, new.shards, new.identity)
    assert change_kinds("b", new, same, plan_changes("b", new, same)) == ["topology"]
