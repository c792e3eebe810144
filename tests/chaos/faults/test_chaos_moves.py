"""The deterministic parts of ``move_under_fault`` (chaos/procs/moves.py): the kind is opt-in
and seeded in the schedule, the move and strike are drawn from the manager's view by the fault's
seed, a move's end is judged from the view, and the campaign's convergence wait accepts a node
outside a chain. The faults themselves run against real processes in
tests/chaos/campaigns/test_chaos_moves_campaign.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from click.testing import CliRunner

from chaos.cli import chaos
from chaos.procs import faults, membership, moves
from chaos.procs.netfaults import ProxiedCluster
from chaos.procs.netns import NetnsCluster
from kayos.local.cluster import LocalCluster
from tests.support.chaos import CHAINS, NODES, first, view

pytestmark = pytest.mark.chaos


def test_moves_are_drawn_only_when_named_and_need_the_manager() -> None:
    assert "move_under_fault" not in faults.KINDS
    assert "move_under_fault" in faults.ALL_KINDS
    assert "move_under_fault" in faults.MANAGER_KINDS
    assert all(f.kind != "move_under_fault" for f in first(5, 2000, faults.KINDS))
    mixed = first(5, 600, ("kill9", "pause", "move_under_fault"))
    assert {f.kind for f in mixed} == {"kill9", "pause", "move_under_fault"}
    held = [f.hold_s for f in mixed if f.kind == "move_under_fault"]
    assert all(0.0 <= hold <= faults.down_s_max for hold in held)
    assert mixed == first(5, 600, ("kill9", "pause", "move_under_fault"))
    assert mixed != first(6, 600, ("kill9", "pause", "move_under_fault"))


def test_moves_are_refused_with_the_proxy_kinds_before_anything_starts() -> None:
    for network in ("latency", "reset_peer,partition"):
        args = ["run", "--kinds", f"kill9,move_under_fault,{network}", "--seed", "1"]
        result = CliRunner().invoke(chaos, args)
        assert result.exit_code == 2, result.output
        assert "has no fault proxy" in result.output or "cannot run in one" in result.output
    args = ["run", "--kinds", "move_under_fault,bandwidth", "--seed", "1"]
    assert "has no fault proxy" in CliRunner().invoke(chaos, args).output
    # With the partition kinds it is not refused: the campaign's own refusals are the only ones.
    args = ["run", "--kinds", "move_under_fault,partition", "--minutes", "0", "--seed", "1"]
    result = CliRunner().invoke(chaos, args)
    assert result.exit_code == 2, result.output
    assert "--minutes must be > 0" in result.output


def test_only_a_full_idle_shard_with_every_node_up_can_move() -> None:
    assert moves.movable(view(CHAINS), 3) == {0: ["d"], 1: ["a"], 2: ["d"]}
    assert moves.movable(view(CHAINS, down=("d",)), 3) == {}
    busy = view(CHAINS, moving={0: ("d", "a")}, catching={1: ["a"]})
    assert moves.movable(busy, 3) == {2: ["d"]}
    short = view({0: ["a", "b"], 1: ["b", "c", "d"]})
    assert moves.movable(short, 3) == {1: ["a"]}


def test_the_plan_is_the_seeds_and_moves_onto_the_node_outside_the_chain() -> None:
    plans = [moves.plan(random.Random(seed), view(CHAINS), 3) for seed in range(200)]
    assert plans == [moves.plan(random.Random(seed), view(CHAINS), 3) for seed in range(200)]
    for plan in plans:
        assert plan is not None
        chain = CHAINS[plan["shard"]]
        assert plan["source"] in chain
        assert plan["target"] not in chain
        assert plan["tail"] == chain[-1]
        assert 0.0 <= plan["delay_s"] <= moves.strike_delay_s_max
    assert {p["strike"] for p in plans if p} == set(moves.STRIKES)
    assert {p["shard"] for p in plans if p} == set(CHAINS)
    assert moves.plan(random.Random(1), view(CHAINS, down=("a",)), 3) is None


def test_partition_strikes_are_drawn_only_in_network_namespaces() -> None:
    # isinstance is all strikes_for reads: no namespace is made here.
    assert moves.strikes_for(LocalCluster.__new__(LocalCluster)) == moves.STRIKES
    in_netns = moves.strikes_for(NetnsCluster.__new__(NetnsCluster))
    assert in_netns == moves.STRIKES + moves.PARTITION_STRIKES
    with pytest.raises(ValueError, match="no fault proxy"):
        moves.add_spare(ProxiedCluster.__new__(ProxiedCluster))
    plans = [moves.plan(random.Random(seed), view(CHAINS), 3, in_netns) for seed in range(300)]
    assert plans == [moves.plan(random.Random(s), view(CHAINS), 3, in_netns) for s in range(300)]
    assert {p["strike"] for p in plans if p} == set(in_netns)
    for plan in plans:
        assert plan is not None
        if plan["strike"] in moves.PARTITION_STRIKES:
            assert plan["how"] in ("drop", "reject")
        else:
            assert "how" not in plan
    assert {p["how"] for p in plans if p and "how" in p} == {"drop", "reject"}
    # Without namespaces the draw is what it was before partitions existed: same seeds, same plans.
    plain = [moves.plan(random.Random(seed), view(CHAINS), 3) for seed in range(300)]
    assert plain == [
        moves.plan(random.Random(s), view(CHAINS), 3, moves.STRIKES) for s in range(300)
    ]
    assert all(p and p["strike"] in moves.STRIKES for p in plain)


def test_a_strike_aims_at_its_node_and_a_cut_has_its_sides() -> None:
    move = {"shard": 0, "source": "b", "target": "d", "tail": "c"}
    members = ["a", "b", "c", "d", "m1", "m2", "m3"]
    aimed = {
        "kill_target": "d", "pause_target": "d", "kill_source": "b", "kill_tail": "c",
        "cut_target_from_tail": "d", "isolate_source": "b", "isolate_tail": "c",
    }  # fmt: skip
    assert set(aimed) == set(moves.STRIKES + moves.PARTITION_STRIKES)
    for strike, node in aimed.items():
        assert moves.struck_node({**move, "strike": strike}) == node, strike
    cut = {**move, "strike": "cut_target_from_tail"}
    assert moves.cut_sides(cut, members) == (["d"], ["c"])
    alone = {**move, "strike": "isolate_source"}
    assert moves.cut_sides(alone, members) == (["b"], ["a", "c", "d", "m1", "m2", "m3"])
    alone = {**move, "strike": "isolate_tail"}
    assert moves.cut_sides(alone, members) == (["c"], ["a", "b", "d", "m1", "m2", "m3"])


def test_a_moves_end_is_read_from_the_view() -> None:
    move = {"shard": 0, "source": "b", "target": "d"}
    assert moves.outcome(view(CHAINS, moving={0: ("d", "b")}), move) is None
    assert moves.outcome(view({**CHAINS, 0: ["a", "c", "d"]}), move) == "completed"
    assert moves.outcome(view(CHAINS), move) == "cancelled"
    assert moves.outcome(view({**CHAINS, 0: ["a", "b", "d"]}), move) == "kept"


@dataclass
class FakeCluster:
    """What ``membership.converged`` reads: the leader's view, each node's status."""

    the_view: dict[str, Any]
    statuses: dict[str, dict[str, Any] | None]
    ids: list[str] = field(default_factory=lambda: list(NODES))
    replicas: int = 3

    def status(self, node: str) -> dict[str, Any] | None:
        return self.statuses.get(node)


def replica(role: str, seq: int) -> dict[str, Any]:
    return {"role": role, "last_seq": seq, "committed_seq": seq, "upstream_linked": True}


def statuses(chains: dict[int, list[str]], seq: int) -> dict[str, dict[str, Any] | None]:
    found: dict[str, dict[str, Any] | None] = {n: {"epoch": 7, "shards": {}} for n in NODES}
    for shard, chain in chains.items():
        for position, node in enumerate(chain):
            role = "head" if position == 0 else "tail" if position == len(chain) - 1 else "middle"
            status = found[node]
            assert status is not None
            status["shards"][str(shard)] = replica(role, seq)
    return found


def converged(fake: FakeCluster, monkeypatch: Any) -> dict[int, int] | None:
    monkeypatch.setattr(membership, "manager_view", lambda _cluster: fake.the_view)
    return membership.converged(cast(LocalCluster, fake))


def test_convergence_waits_for_full_chains_and_no_move_not_for_the_spare(
    monkeypatch: Any,
) -> None:
    fake = FakeCluster(view(CHAINS), statuses(CHAINS, 40))
    assert converged(fake, monkeypatch) == {0: 40, 1: 40, 2: 40}
    # A node outside every chain (the spare just added) is not waited for.
    spare = {0: ["a", "b", "c"], 1: ["b", "c", "a"], 2: ["c", "a", "b"]}
    fake = FakeCluster(view(spare), statuses(spare, 9))
    assert converged(fake, monkeypatch) == {0: 9, 1: 9, 2: 9}
    # A move pending, a short chain, or a lagging member is not converged.
    fake = FakeCluster(view(CHAINS, moving={0: ("d", "a")}), statuses(CHAINS, 40))
    assert converged(fake, monkeypatch) is None
    short = {**CHAINS, 0: ["a", "b"]}
    fake = FakeCluster(view(short), statuses(short, 40))
    assert converged(fake, monkeypatch) is None
    fake = FakeCluster(view(CHAINS), statuses(CHAINS, 40))
    lagging = fake.statuses["d"]
    assert lagging is not None
    lagging["shards"]["1"] = replica("tail", 39)
    assert converged(fake, monkeypatch) is None
