"""plan_rebalance and drain_target (kayos/manager/placement.py): pure, deterministic, bounded;
seeded random layouts print their seed."""

from __future__ import annotations

import random

import pytest

from kayos.errors import InvalidRequest
from kayos.manager import (
    AddNode,
    CatchUpDone,
    Config,
    Drain,
    ManagerView,
    MoveReplica,
    Rebalance,
    decide,
)
from kayos.manager.member.http import operator_event
from kayos.manager.placement import drain_target, plan_rebalance, replica_counts

pytestmark = pytest.mark.unit


def rotated(nodes: list[str], shards: int, replicas: int) -> ManagerView:
    chains = [[nodes[(i + k) % len(nodes)] for k in range(replicas)] for i in range(shards)]
    return ManagerView.bootstrap(Config(), nodes, chains)


def test_a_new_empty_node_gets_its_share() -> None:
    view, _ = decide(rotated(["a", "b", "c"], 6, 3), AddNode("d", "127.0.0.1", 1, 2))
    moves = plan_rebalance(view)
    assert all(target == "d" for _, _, target in moves)
    assert len(moves) == 4  # 18 replicas over 4 nodes: 5, 5, 4, 4
    assert len({shard for shard, _, _ in moves}) == len(moves)  # one move per shard


def test_a_balanced_cluster_plans_nothing() -> None:
    assert plan_rebalance(rotated(["a", "b", "c"], 3, 3)) == []


def test_drain_target_is_the_least_loaded_outside_the_chain() -> None:
    view = rotated(["a", "b", "c", "d"], 4, 2)
    view, _ = decide(view, Drain("a"))
    assert drain_target(view, 0) not in ("a", "b")


@pytest.mark.parametrize("seed", [random.randrange(2**32) for _ in range(5)])
def test_rebalance_then_catch_ups_balance_any_layout(seed: int) -> None:
    print(f"seed {seed}")
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(rng.randint(2, 6))]
    replicas = rng.randint(1, len(nodes))
    chains = [rng.sample(nodes, replicas) for _ in range(rng.randint(1, 12))]
    view = ManagerView.bootstrap(Config(), nodes, chains)
    for node in rng.sample(["x", "y"], rng.randint(0, 2)):
        view, _ = decide(view, AddNode(node, "127.0.0.1", 1, 2))
    for _ in range(50):  # bounded: each round completes every move it started
        view, actions = decide(view, Rebalance())
        if not actions:
            break
        for shard in view.shards:
            for target, _ in shard.moves:
                order = shard.order_of(target)
                assert order is not None, f"move target {target} has no catch-up order"
                view, _ = decide(view, CatchUpDone(target, shard.id, order))
        view, _ = decide(view, Drain("nobody"))  # any next event completes the moves
    counts = replica_counts(view)
    assert max(counts.values()) - min(counts.values()) <= 1 or plan_rebalance(view) == []
    assert all(len(s.chain) == replicas for s in view.shards)


def test_operator_requests_are_checked_against_the_view() -> None:
    view = rotated(["a", "b", "c"], 3, 2)
    epoch = view.epoch
    assert operator_event({"op": "drain", "node": "a", "epoch": epoch}, view) == Drain("a")
    assert operator_event({"op": "rebalance", "epoch": epoch}, view) == Rebalance()
    move = {"op": "move-shard", "shard": 0, "source": "a", "target": "c", "epoch": epoch}
    assert operator_event(move, view) == MoveReplica(0, "a", "c")
    for bad in (
        {"op": "drain", "node": "a", "epoch": epoch + 1},  # stale or replayed
        {"op": "drain", "node": "zz", "epoch": epoch},
        {"op": "explode", "epoch": epoch},
        {**move, "source": "c", "target": "a"},  # c holds no replica of shard 0
        {**move, "target": "b"},  # b already holds it
        {**move, "shard": 9},
        {"op": "add-node", "node": "a", "host": "h", "http_port": 1, "bin_port": 2, "epoch": 1},
        {"op": "add-node", "node": "d", "host": "h", "http_port": 1, "bin_port": 1, "epoch": 1},
        {"op": "add-node", "node": "d", "host": "h", "http_port": "1", "bin_port": 2, "epoch": 1},
    ):
        with pytest.raises(InvalidRequest):
            operator_event(bad, view)


def test_the_same_move_asked_again_while_pending_is_accepted_another_is_refused() -> None:
    """A re-run of `kayos ctl move-shard` after Ctrl-C asks for the pending move again: accepted
    (decide leaves it as it is); a different move on the same shard is refused with the reason."""
    view = rotated(["a", "b", "c", "d"], 3, 2)
    move = {"op": "move-shard", "shard": 0, "source": "a", "target": "c", "epoch": view.epoch}
    moving, _ = decide(view, operator_event(move, view))
    assert moving.shards[0].moves == (("c", "a"),)
    again = {**move, "epoch": moving.epoch}
    assert operator_event(again, moving) == MoveReplica(0, "a", "c")
    assert decide(moving, MoveReplica(0, "a", "c"))[0] == moving
    with pytest.raises(InvalidRequest, match="already moving"):
        operator_event({**again, "target": "d"}, moving)
