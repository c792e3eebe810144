"""The scale bench's pure parts (kayos.bench.scale.model and the figures of kayos.bench.scale.run):
the capacity model, the per-role attribution of measured CPU, /proc/PID/stat's CPU seconds and the
parameters' bounds; figures are given, no cluster runs."""

from __future__ import annotations

import pytest

from kayos.bench.scale.model import (
    RoleCosts,
    attribute,
    capacity_msgs_per_s,
    host_loads,
    predict_msgs_per_s,
    role_at,
)
from kayos.bench.scale.run import (
    ScaleBenchParameters,
    merge_drives,
    model_figures,
    ratios,
    stat_cpu_seconds,
)

pytestmark = pytest.mark.unit

COSTS = RoleCosts(head=5e-6, middle=4e-6, tail=3e-6)
DEDICATED = [("a", "b", "c"), ("d", "e", "f")]
ROTATED = [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")]


def test_roles_are_head_then_middles_then_tail() -> None:
    assert [role_at(i, 4) for i in range(4)] == ["head", "middle", "middle", "tail"]
    assert role_at(0, 1) == "head"
    with pytest.raises(ValueError, match="outside"):
        role_at(3, 3)


def test_a_message_costs_one_head_n_minus_two_middles_and_one_tail() -> None:
    assert COSTS.per_message(3) == pytest.approx(12e-6)
    assert COSTS.per_message(5) == pytest.approx(20e-6)
    assert COSTS.per_message(2) == pytest.approx(8e-6)


def test_costs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="> 0"):
        RoleCosts(head=0.0, middle=1e-6, tail=1e-6)


def test_one_chain_is_bound_by_its_busiest_member() -> None:
    assert predict_msgs_per_s([DEDICATED[0]], COSTS, 0.15) == pytest.approx(0.15 / 5e-6)


def test_disjoint_chains_add_up() -> None:
    one = predict_msgs_per_s([DEDICATED[0]], COSTS, 0.15)
    assert predict_msgs_per_s(DEDICATED, COSTS, 0.15) == pytest.approx(2 * one)


def test_rotated_shards_spread_every_role_over_every_host() -> None:
    loads = host_loads(ROTATED, COSTS)
    assert loads == pytest.approx(dict.fromkeys("abc", 1.2e-05 / 3))
    predicted = predict_msgs_per_s(ROTATED, COSTS, 0.15)
    assert predicted == pytest.approx(3 * 0.15 / 12e-6)
    assert capacity_msgs_per_s(3, 0.15, 3, COSTS) == pytest.approx(predicted)


def test_the_busiest_host_bounds_an_uneven_placement() -> None:
    # a is the head of both chains: it spends a head's cost on every message.
    chains = [("a", "b", "c"), ("a", "c", "b")]
    assert host_loads(chains, COSTS)["a"] == pytest.approx(5e-6)
    assert predict_msgs_per_s(chains, COSTS, {"a": 0.1, "b": 1.0, "c": 1.0}) == pytest.approx(
        0.1 / 5e-6
    )


def test_capacity_grows_with_hosts_and_falls_with_replication() -> None:
    assert capacity_msgs_per_s(6, 1.0, 3, COSTS) == pytest.approx(
        2 * capacity_msgs_per_s(3, 1.0, 3, COSTS)
    )
    assert capacity_msgs_per_s(6, 1.0, 5, COSTS) < capacity_msgs_per_s(6, 1.0, 3, COSTS)
    with pytest.raises(ValueError, match="replication"):
        capacity_msgs_per_s(2, 1.0, 3, COSTS)


def test_shares_must_cover_every_message_once() -> None:
    with pytest.raises(ValueError, match="summing to 1"):
        host_loads(DEDICATED, COSTS, [0.5, 0.4])
    with pytest.raises(ValueError, match="at least one chain"):
        host_loads([], COSTS)


def test_nodes_with_one_role_give_that_roles_cost_and_idle_nodes_none() -> None:
    cpu = {"a": 0.05, "b": 0.0, "c": 0.0, "d": 1.0, "e": 0.8, "f": 0.6}
    found = attribute([DEDICATED[1]], cpu, [200_000])
    assert found["roles"] == pytest.approx({"head": 5e-6, "middle": 4e-6, "tail": 3e-6})
    assert found["nodes"]["a"]["roles"] == "idle"
    assert found["nodes"]["a"]["cpu_s_per_msg"] is None
    assert found["nodes"]["d"]["messages"] == 200_000


def test_a_role_is_the_mean_of_the_nodes_that_carry_it_alone() -> None:
    cpu = {"a": 1.0, "b": 0.8, "c": 0.6, "d": 1.2, "e": 0.8, "f": 0.6}
    found = attribute(DEDICATED, cpu, [200_000, 200_000])
    assert found["roles"]["head"] == pytest.approx(5.5e-6)


def test_nodes_with_several_roles_are_attributed_to_none() -> None:
    found = attribute(ROTATED, {"a": 0.6, "b": 0.6, "c": 0.6}, [50_000, 50_000, 50_000])
    assert found["roles"] == {}
    assert found["nodes"]["b"]["roles"] == "head+middle+tail"
    assert found["nodes"]["b"]["cpu_s_per_msg"] == pytest.approx(0.6 / 150_000)


def test_attribution_needs_a_count_per_chain() -> None:
    with pytest.raises(ValueError, match="one committed count per chain"):
        attribute(DEDICATED, {"a": 1.0}, [1])


def _case(chains: list[list[str]], msgs_per_s: int, roles: dict[str, float]) -> dict[str, object]:
    return {"chains": chains, "msgs_per_s": msgs_per_s, "role_cpu_s_per_msg": roles}


def test_the_model_predicts_every_case_from_the_one_shard_costs() -> None:
    roles = {"head": 5e-6, "middle": 4e-6, "tail": 3e-6}
    cases = {
        "6n-1s": _case([["d", "e", "f"]], 30_000, roles),
        "6n-2s": _case([list(c) for c in DEDICATED], 50_000, roles),
        "3n-3s": _case([list(c) for c in ROTATED], 30_000, {}),
    }
    model = model_figures(cases, 0.15)
    assert model is not None
    assert model["costs_from"] == "6n-1s"
    rows = model["predictions"]
    assert rows["6n-1s"]["predicted_msgs_per_s"] == 30_000
    assert rows["6n-2s"]["predicted_msgs_per_s"] == 60_000
    assert rows["6n-2s"]["error"] == pytest.approx(0.2)
    assert rows["3n-3s"]["predicted_msgs_per_s"] == round(0.45 / 12e-6)
    assert ratios(cases) == {"6n-2s_vs_6n-1s": pytest.approx(1.67)}


def test_without_a_one_role_case_there_is_no_model() -> None:
    assert model_figures({"3n-3s": _case([list(c) for c in ROTATED], 1, {})}, 0.15) is None


def test_cpu_seconds_are_read_after_the_command_name() -> None:
    # The command name may hold spaces and brackets; utime 250 and stime 50 ticks follow.
    line = "4242 (python (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0"
    assert stat_cpu_seconds(line, 100) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="not a /proc"):
        stat_cpu_seconds("4242 (x) S 1", 100)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"node_cpu": 0.01}, "node_cpu"),
        ({"node_cpu": 1.5}, "node_cpu"),
        ({"seconds": 0}, "seconds"),
        ({"in_flight": 0}, "in_flight"),
        ({"cases": ("6n-1s", "9n-9s")}, "9n-9s"),
        ({"cases": ()}, "none"),
    ],
)
def test_parameters_out_of_bounds_are_refused(given: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScaleBenchParameters(**given)  # type: ignore[arg-type]


def test_a_cases_windows_merge_into_one() -> None:
    window = {"shards": [0, 1], "latencies": [0.1]}
    first = {**window, "wall": 10.0, "cpu": {"a": 1.0}, "committed": [100, 200], "errors": 0}
    second = {**window, "wall": 10.0, "cpu": {"a": 2.0}, "committed": [300, 0], "errors": 2}
    merged = merge_drives([first, second])
    assert merged["wall"] == 20.0
    assert merged["cpu"] == {"a": 3.0}
    assert merged["committed"] == [400, 200]
    assert merged["latencies"] == [0.1, 0.1]
    assert merged["window_msgs_per_s"] == [30, 30]
    assert merged["errors"] == 2
    with pytest.raises(ValueError, match="no window"):
        merge_drives([])
