"""The deterministic parts of ``drain_under_fault`` (chaos/procs/drains.py): the kind is opt-in,
needs the manager and the spare, and is seeded in the schedule; the drained node and the strike
are drawn from the manager's view by the fault's seed; the strike's aim, the ends of the moves and
of the drain are read from views; a replacement node is added only when no drain could finish.
The faults themselves run against real processes (``kayos chaos run --kinds drain_under_fault``;
docs/testing.md "Drains under faults")."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from chaos.cli import chaos
from chaos.procs import drains, faults, membership, moves
from chaos.procs.netfaults import ProxiedCluster
from kayos.local.cluster import LocalCluster
from tests.support.chaos import CHAINS, first, view

pytestmark = pytest.mark.chaos

NETNS_STRIKES = moves.STRIKES + moves.PARTITION_STRIKES
# Every shard on a, b and c; d (the spare) holds nothing.
FULL = {0: ["a", "b", "c"], 1: ["b", "c", "a"], 2: ["c", "a", "b"]}


def drain_view(
    chains: dict[int, list[str]],
    *,
    draining: tuple[str, ...] = (),
    alerts: tuple[tuple[str, int, str], ...] = (),
    **kwargs: Any,
) -> dict[str, Any]:
    return {**view(chains, **kwargs), "draining": list(draining), "alerts": list(alerts)}


def test_drains_are_drawn_only_when_named_and_need_the_manager_and_the_spare() -> None:
    assert "drain_under_fault" not in faults.KINDS
    assert "drain_under_fault" in faults.ALL_KINDS
    assert "drain_under_fault" in faults.MANAGER_KINDS
    assert {"move_under_fault", "drain_under_fault", "lose_for_good"} == faults.SPARE_KINDS
    kinds = ("kill9", "pause", "drain_under_fault")
    mixed = first(11, 600, kinds)
    assert {f.kind for f in mixed} == set(kinds)
    held = [f.hold_s for f in mixed if f.kind == "drain_under_fault"]
    assert all(0.0 <= hold <= faults.down_s_max for hold in held)
    assert mixed == first(11, 600, kinds)
    assert mixed != first(12, 600, kinds)


def test_drains_are_refused_with_the_proxy_kinds_before_anything_starts() -> None:
    for network in ("latency", "bandwidth", "reset_peer,timeout"):
        args = ["run", "--kinds", f"kill9,drain_under_fault,{network}", "--seed", "1"]
        result = CliRunner().invoke(chaos, args)
        assert result.exit_code == 2, result.output
        assert "drain_under_fault cannot run with the proxy kinds" in result.output
        assert "no fault proxy" in result.output
    args = ["run", "--kinds", "drain_under_fault,partition", "--minutes", "0", "--seed", "1"]
    result = CliRunner().invoke(chaos, args)
    assert result.exit_code == 2, result.output
    assert "--minutes must be > 0" in result.output


def test_a_drain_needs_a_settled_view_and_a_node_outside_each_chain() -> None:
    assert drains.takers(drain_view(FULL)) == ["a", "b", "c", "d"]
    assert drains.drainable(drain_view(FULL), 3) == ["a", "b", "c"]
    assert drains.drainable(drain_view(CHAINS), 3) == ["a", "b", "c", "d"]
    # Not settled: a node down, a move or catch-up pending, a short chain, a draining member.
    assert drains.drainable(drain_view(FULL, down=("d",)), 3) == []
    assert drains.drainable(drain_view(FULL, moving={1: ("d", "b")}), 3) == []
    assert drains.drainable(drain_view(FULL, catching={2: ["d"]}), 3) == []
    assert drains.drainable(drain_view({**FULL, 0: ["a", "b"]}), 3) == []
    assert not drains.settled(drain_view(FULL, draining=("a",)), 3)
    # Drained: a in no chain, draining for good; only three nodes take replicas, so no drain
    # could finish until a replacement is added.
    emptied = {0: ["d", "b", "c"], 1: ["b", "c", "d"], 2: ["c", "d", "b"]}
    assert drains.settled(drain_view(emptied, draining=("a",)), 3)
    assert drains.takers(drain_view(emptied, draining=("a",))) == ["b", "c", "d"]
    assert drains.drainable(drain_view(emptied, draining=("a",)), 3) == []


def test_the_plan_is_the_seeds_and_draws_every_drainable_node_and_strike() -> None:
    def plans(strikes: tuple[str, ...]) -> list[dict[str, Any] | None]:
        return [drains.plan(random.Random(s), drain_view(FULL), 3, strikes) for s in range(300)]

    for strikes in (moves.STRIKES, NETNS_STRIKES):
        drawn = plans(strikes)
        assert drawn == plans(strikes)
        assert all(p is not None for p in drawn)
        found = [p for p in drawn if p is not None]
        assert {p["node"] for p in found} == {"a", "b", "c"}
        assert {p["strike"] for p in found} == set(strikes)
        for plan in found:
            assert 0.0 <= plan["delay_s"] <= moves.strike_delay_s_max
            assert ("how" in plan) == (plan["strike"] in moves.PARTITION_STRIKES)
    assert drains.plan(random.Random(1), drain_view(FULL, down=("a",)), 3, moves.STRIKES) is None


def test_the_strike_aims_at_a_pending_move_else_at_what_the_shard_gained() -> None:
    drain = {"node": "b", "strike": "kill_target", "delay_s": 0.1}
    moving = drain_view(FULL, moving={1: ("d", "b"), 2: ("d", "b")}, draining=("b",))
    aimed = drains.aimed(drain, drain_view(FULL), moving)
    assert aimed == {**drain, "shard": 1, "source": "b", "target": "d", "tail": "a"}
    assert moves.struck_node(aimed) == "d"
    assert moves.struck_node({**aimed, "strike": "kill_source"}) == "b"
    # No move pending: the drained node's first shard, the member it gained, the tail now.
    done = {0: ["a", "c", "d"], 1: ["c", "a", "d"], 2: ["c", "a", "d"]}
    aimed = drains.aimed(drain, drain_view(FULL), drain_view(done, draining=("b",)))
    assert (aimed["shard"], aimed["target"], aimed["tail"]) == (0, "d", "d")
    # Not started yet: the shard's tail stands in for the target.
    aimed = drains.aimed(drain, drain_view(FULL), drain_view(FULL, draining=("b",)))
    assert (aimed["shard"], aimed["target"], aimed["tail"]) == (0, "c", "c")


def test_the_moves_ends_and_the_drains_end_are_read_from_views() -> None:
    pending: dict[tuple[int, str], str] = {}
    seen = drains.observe(pending, drain_view(FULL, moving={0: ("d", "a"), 1: ("d", "a")}))
    assert not seen
    assert pending == {(0, "d"): "a", (1, "d"): "a"}
    # Shard 0's move completed; shard 1's was cancelled (d went away) and started again on e.
    later = drain_view({**FULL, 0: ["b", "c", "d"]}, moving={1: ("e", "a")})
    assert drains.observe(pending, later) == {"completed": 1, "cancelled": 1}
    assert pending == {(1, "e"): "a"}
    both = drain_view({**FULL, 1: ["b", "c", "a", "e"]})
    assert drains.observe(pending, both) == {"other": 1}
    assert pending == {}
    assert not drains.drained(later, "a", 3)
    assert not drains.drained(drain_view(FULL), "a", 3)
    assert drains.drained(drain_view(FULL), "e", 3)
    assert drains.drained(drain_view(FULL), None, 3)
    # Spliced out while its move was cancelled: in no chain, but one is short until it rejoins.
    spliced = {0: ["b", "c", "d"], 1: ["b", "c"], 2: ["c", "b", "d"]}
    assert not drains.drained(drain_view(spliced), "a", 3)
    rejoining = drain_view({**spliced, 1: ["b", "c", "e"]}, catching={1: ["a"]})
    assert not drains.drained(rejoining, "a", 3)
    assert drains.drained(drain_view({**spliced, 1: ["b", "c", "e"]}), "a", 3)
    stuck = drain_view(FULL, draining=("a",), alerts=(("drain_blocked", 0, "a"),))
    assert drains.blocked(stuck, "a")
    assert not drains.blocked(stuck, "b")


def test_draining_nodes_are_never_a_moves_target() -> None:
    assert moves.movable(drain_view(FULL), 3) == {0: ["d"], 1: ["d"], 2: ["d"]}
    emptied = {0: ["d", "b", "c"], 1: ["b", "c", "d"], 2: ["c", "d", "b"]}
    assert moves.movable(drain_view(emptied, draining=("a",)), 3) == {}


@dataclass
class RoomCluster:
    """What ``drains.room`` reads: the node ids and replica count."""

    ids: list[str] = field(default_factory=lambda: ["a", "b", "c", "d"])
    replicas: int = 3


def test_a_replacement_is_added_only_when_no_drain_could_finish(monkeypatch: Any) -> None:
    added: list[str] = []
    views = {"now": drain_view(FULL)}

    def add(cluster: RoomCluster, node: str) -> dict[str, Any]:
        cluster.ids.append(node)
        added.append(node)
        return {"node": node, "epoch": 9}

    def wait_view(_cluster: Any, condition: Any, _timeout_s: float) -> dict[str, Any] | None:
        return views["now"] if condition(views["now"]) else None

    monkeypatch.setattr(moves, "wait_view", wait_view)
    monkeypatch.setattr(moves, "add_spare", add)
    monkeypatch.setattr(drains, "REPLACEMENTS", ("e", "f", "g"))
    cluster = RoomCluster()
    assert drains.room(cast(LocalCluster, cluster)) is None
    assert added == []
    emptied = {0: ["d", "b", "c"], 1: ["b", "c", "d"], 2: ["c", "d", "b"]}
    views["now"] = drain_view(emptied, draining=("a",))
    assert drains.room(cast(LocalCluster, cluster)) == {"node": "e", "epoch": 9}
    assert drains.room(cast(LocalCluster, cluster)) == {"node": "f", "epoch": 9}
    assert drains.room(cast(LocalCluster, cluster)) == {"node": "g", "epoch": 9}
    assert added == ["e", "f", "g"]
    assert "already added" in str(drains.room(cast(LocalCluster, cluster)))
    views["now"] = drain_view(emptied, draining=("a",), down=("b",))
    assert "not settled within" in str(drains.room(cast(LocalCluster, cluster)))


def test_a_replacement_is_refused_a_proxied_cluster() -> None:
    with pytest.raises(ValueError, match="drain_under_fault cannot run with the proxy kinds"):
        moves.add_spare(ProxiedCluster.__new__(ProxiedCluster), "e")


def test_the_watch_counts_moves_that_end_between_strikes_and_waits_past_the_request(
    monkeypatch: Any,
) -> None:
    # The views the manager shows one poll after another: a move on shard 0 ends, one on shard 1
    # is cancelled and started again, then every move ends; the last view repeats.
    script = [
        drain_view(FULL),
        drain_view(FULL, moving={0: ("d", "a"), 1: ("d", "a")}),
        drain_view({**FULL, 0: ["b", "c", "d"]}, moving={1: ("e", "a")}),
        drain_view({0: ["b", "c", "d"], 1: ["b", "c", "e"], 2: FULL[2]}),
    ]
    polls = iter(script)
    monkeypatch.setattr(drains, "manager_view", lambda _cluster: next(polls, script[-1]))
    with drains.Watch(cast(LocalCluster, RoomCluster())) as watch:
        end = watch.until(lambda v: drains.drained(v, None, 3), 10.0)
        # The first view has no move either, but only views polled after the call count.
        assert end == script[-1]
    assert watch.counts() == {"cancelled": 1, "completed": 2}
    assert watch.polls >= len(script)


def test_a_node_drained_for_good_is_no_concern_of_the_waits(monkeypatch: Any) -> None:
    # a drained and stopped (down, draining, in no chain): the cluster is whole without it.
    emptied = {0: ["d", "b", "c"], 1: ["b", "c", "d"], 2: ["c", "d", "b"]}
    gone = drain_view(emptied, draining=("a",), down=("a",))
    assert membership.emptied(gone) == {"a"}
    assert membership.all_up(gone)
    assert drains.settled(gone, 3)
    # Down and draining but still in a chain (struck mid-drain): not whole.
    struck = drain_view(FULL, draining=("a",), down=("a",))
    assert membership.emptied(struck) == set()
    assert not membership.all_up(struck)
    assert moves.movable(struck, 3) == {}
    # A replacement is never given the id of a node the view still holds.
    added: list[str] = []
    monkeypatch.setattr(
        moves, "wait_view", lambda _c, condition, _t: gone if condition(gone) else None
    )
    monkeypatch.setattr(moves, "add_spare", lambda _c, node: added.append(node) or {"node": node})
    monkeypatch.setattr(drains, "REPLACEMENTS", ("a", "e"))
    assert drains.room(cast(LocalCluster, RoomCluster(ids=["b", "c", "d"]))) == {"node": "e"}


def test_a_drained_node_is_stopped_and_forgotten(tmp_path: Path) -> None:
    # The launcher's own kill on a real process (a stand-in for `kayos node`), not a fake of it.
    cluster = LocalCluster.__new__(LocalCluster)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cluster.processes = {"b": stand_in}
    cluster.ids = ["a", "b", "c", "d"]
    cluster.stop_timeout_s = 10.0
    cluster._logs = {"b": (tmp_path / "b.log").open("w")}
    try:
        assert drains.retire(cluster, "b") == []
        assert stand_in.poll() == -signal.SIGTERM
        assert cluster.ids == ["a", "c", "d"]
        assert cluster.processes == {}
        assert cluster._logs == {}
        # Already gone: nothing to signal, nothing to forget, nothing wrong.
        assert drains.retire(cluster, "b") == []
    finally:
        stand_in.kill()
        stand_in.wait()
