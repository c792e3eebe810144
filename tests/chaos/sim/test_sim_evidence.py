"""The simulated manager's evidence of death (chaos/sim/evidence.py; docs/testing.md, "The
simulator"): a crash and a ``reject`` partition from the manager are spliced out at once, a pause
and a ``drop`` partition only by the window, a partition between nodes only by nothing (the
manager's own probe finds the node alive), and a restart proves only the old incarnation dead. The
planted bug ``trust_reported_refusal`` takes the members' reports as proof."""

from __future__ import annotations

import pytest

from chaos.sim import SimConfig
from chaos.sim.evidence import hold_after_proof, node_gone
from chaos.sim.run import Fault, Sim
from kayos.manager import SpliceChain
from kayos.manager.view import Config, ManagerView

pytestmark = pytest.mark.chaos

SEED = 5
STRUCK = "n2"
AT_MS = 500.0


def started(plant: str | None = None) -> Sim:
    """A run with no scheduled faults, its workload going, at ``AT_MS``."""
    print("world seed:", SEED, "plant:", plant)
    sim = Sim(SEED, SimConfig(), plant)
    for node in sim.nodes.values():
        node.start()
    sim.client.start()
    sim.world.run_until(AT_MS)
    assert sim.manager.view.node(STRUCK).state == "up"  # type: ignore[union-attr]
    return sim


def state_after(sim: Sim, fault: Fault, ms: float) -> str:
    sim.inject(fault)
    sim.world.run_until(AT_MS + ms)
    node = sim.manager.view.node(STRUCK)
    assert node is not None
    return node.state


def test_a_crash_is_spliced_out_at_once() -> None:
    sim = started()
    assert state_after(sim, Fault(AT_MS, "kill", STRUCK, hold_ms=5_000), 60) == "down"
    assert sim.manager.evidence.node_gone == 1
    assert all(STRUCK not in shard.chain for shard in sim.manager.view.shards)


@pytest.mark.parametrize("kind", ["pause", "partition"])
def test_silence_is_only_the_window(kind: str) -> None:
    sim = started()
    fault = Fault(AT_MS, kind, STRUCK, hold_ms=5_000, cut="drop")
    assert state_after(sim, fault, 450) in ("up", "suspect")
    assert sim.manager.evidence.node_gone == 0
    sim.world.run_until(AT_MS + SimConfig().detection_window_ms + 150)
    assert sim.manager.view.node(STRUCK).state == "down"  # type: ignore[union-attr]
    assert sim.manager.evidence.node_gone == 0


def test_a_reject_partition_from_the_manager_is_spliced_out_at_once() -> None:
    sim = started()
    fault = Fault(AT_MS, "partition", STRUCK, hold_ms=5_000, cut="reject")
    assert state_after(sim, fault, 200) == "down"
    assert sim.manager.evidence.node_gone >= 1
    # Refused is not proof of a dead process: the lease of the live node still counts.
    assert not sim.manager.evidence.proven


def test_a_partition_between_nodes_only_removes_nobody() -> None:
    sim = started()
    fault = Fault(AT_MS, "partition_nodes", STRUCK, hold_ms=5_000, cut="reject")
    assert state_after(sim, fault, 1_000) == "up"
    assert sim.manager.evidence.node_gone == 0


def test_trusting_a_reported_refusal_removes_nodes_the_manager_reaches() -> None:
    sim = started("trust_reported_refusal")
    fault = Fault(AT_MS, "partition_nodes", STRUCK, hold_ms=5_000, cut="reject")
    state_after(sim, fault, 100)
    # Each side reports the other: every node, all of them alive and heard, is made down, and
    # the chains keep only their last member (rule 3).
    assert sim.manager.evidence.node_gone >= 2
    assert all(node.state == "down" for node in sim.manager.view.nodes)
    assert all(len(shard.chain) == 1 for shard in sim.manager.view.shards)


def test_a_restart_proves_the_old_incarnation_dead_and_splices_nothing() -> None:
    sim = started()
    node = sim.nodes[STRUCK]
    before = node.incarnation
    assert state_after(sim, Fault(AT_MS, "kill", STRUCK, hold_ms=0.0), 50) == "up"
    assert node.incarnation == before + 1
    assert (STRUCK, before) in sim.manager.evidence.proven
    assert sim.manager.evidence.node_gone == 0
    assert all(STRUCK in shard.chain for shard in sim.manager.view.shards)


def test_node_gone_downs_a_live_node_and_splices_it_out() -> None:
    view = ManagerView.bootstrap(Config(), ["n1", "n2", "n3"], (("n1", "n2", "n3"),))
    gone, actions = node_gone(view, "n1")
    assert gone.node("n1").state == "down"  # type: ignore[union-attr]
    assert [a.chain for a in actions if isinstance(a, SpliceChain)] == [("n2", "n3")]
    again, more = node_gone(gone, "n1")
    assert again == gone
    assert more == []


def test_a_new_head_holds_what_is_left_of_a_lease_unless_its_holder_is_void() -> None:
    heads: list[tuple[int, str | None]] = [(1, "n1"), (2, "n2")]
    grants = {"n1": {1: (1_000.0, 7)}}
    left = hold_after_proof("n2", heads, grants, set(), {"n1": 7}, 0.0, 1_100.0, 350.0)
    assert left == 250.0
    void = {("n1", 7)}
    assert hold_after_proof("n2", heads, grants, void, {"n1": 7}, 0.0, 1_100.0, 350.0) == 0.0
    # The head restarted since (incarnation 8): grants to 7 count no more, but 8 may hold one
    # from an earlier leader, so the election bound stays.
    later = hold_after_proof("n2", heads, grants, void, {"n1": 8}, 900.0, 1_100.0, 350.0)
    assert later == 150.0
