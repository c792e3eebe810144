"""The deterministic simulator (chaos/sim/, docs/testing.md "The simulator"): a seed replays
exactly, the unplanted simulator passes the CI seeds, and each planted bug is found within 1,000
seeds. Every seed used is printed, so a failure names the command that replays it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from chaos import checker
from chaos.cli import chaos
from chaos.sim import FAULT_KINDS, PLANTS, SimConfig, run_seed, run_seeds, schedule
from kayos.errors import InvalidRequest

pytestmark = pytest.mark.chaos

CI_SEEDS = range(200)
PLANT_SEEDS_MAX = 1_000


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(7), run_seed(7)
    print("seed 7:", first.replay())
    assert first.to_json() == second.to_json()
    assert first.history == second.history


def test_the_schedule_is_a_function_of_the_seed() -> None:
    config = SimConfig()
    assert schedule(3, config) == schedule(3, config)
    assert schedule(3, config) != schedule(4, config)
    kinds = {fault.kind for seed in range(20) for fault in schedule(seed, config)}
    assert kinds == set(FAULT_KINDS)


def test_a_run_injects_faults_and_records_a_history() -> None:
    report = run_seed(11)
    print("seed 11:", json.dumps(report.to_json()["faults"]))
    assert sum(report.faults.values()) >= 5
    assert report.acked > 0
    assert report.snapshots > 0
    assert report.commits > 0
    verdict = checker.check(report.history)
    assert verdict.acked_versions == report.acked


def test_the_unplanted_simulator_passes_the_ci_seeds() -> None:
    summary = run_seeds(CI_SEEDS)
    result = summary.to_json()
    print(
        f"seeds {CI_SEEDS.start}..{CI_SEEDS.stop - 1}: {result['seeds_per_s']} seeds/s,"
        f" faults {result['faults']}, acked {result['acked']}, failed {summary.failed}"
    )
    assert summary.seeds == len(CI_SEEDS)
    assert not summary.failed, (
        f"failing seeds {summary.failed}: replay with kayos chaos sim --seed S --seeds 1"
    )


@pytest.mark.parametrize("plant", PLANTS)
def test_a_planted_bug_is_found_within_1000_seeds(plant: str) -> None:
    summary = run_seeds(range(PLANT_SEEDS_MAX), plant=plant, stop_at_first=True)
    assert summary.failed, f"{plant} not found in {PLANT_SEEDS_MAX} seeds"
    seed = summary.failed[0]
    report = summary.first_failure
    assert report is not None
    print(f"{plant}: found at seed {seed}: {report.replay()}")
    print([v["property"] for v in report.violations])
    # The failing seed replays exactly.
    assert run_seed(seed, plant=plant).to_json() == report.to_json()


# A reject partition cuts n3, the sole member of shard 0 (head and tail) holding a lease, from
# the manager and the other nodes, not from the clients; the manager's probe is refused, and
# n1, just caught up, becomes head. Voiding n3's lease (no hold) lets n1 commit a group's mark
# while n3 still serves snapshots from below it (docs/campaigns.md, "Found by the simulator").
REFUSAL_SEED = 166
REFUSAL_FINDS = {"order", "hwm"}


@pytest.mark.parametrize("plant", ["trust_reported_refusal", "refused_skips_hold"])
def test_a_refusal_taken_as_the_end_of_a_lease_is_found_at_its_seed(plant: str) -> None:
    report = run_seed(REFUSAL_SEED, plant=plant)
    print(f"{plant}: {report.replay()}", [v["property"] for v in report.violations])
    assert not report.ok
    assert {v["property"] for v in report.violations} == REFUSAL_FINDS


def test_a_refused_probe_splices_but_keeps_the_hold_at_the_same_seed() -> None:
    report = run_seed(REFUSAL_SEED)
    print(report.replay(), report.to_json()["manager"])
    assert report.ok, report.violations
    assert report.node_gone_alive > 0  # the reject partition's live node was spliced out


def test_an_unknown_plant_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="unknown plant"):
        run_seed(1, plant="no_such_bug")


def test_cli_sim_reports_and_replays() -> None:
    runner = CliRunner()
    result = runner.invoke(chaos, ["sim", "--seeds", "2", "--seed", "1", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == (0 if report["ok"] else 1)
    assert report["seeds"] == 2
    assert set(report["faults"]) == set(FAULT_KINDS)
    plant = "head_counts_no_ack"
    found = run_seeds(range(PLANT_SEEDS_MAX), plant=plant, stop_at_first=True).failed
    assert found, f"{plant} not found in {PLANT_SEEDS_MAX} seeds"
    seed = found[0]
    planted = runner.invoke(
        chaos, ["sim", "--seeds", "1", "--seed", str(seed), "--plant", plant, "--json"]
    )
    assert planted.exit_code == 1
    body = json.loads(planted.stdout)
    assert body["failed_seeds"] == [seed]
    assert body["replay"] == f"kayos chaos sim --seed {seed} --seeds 1 --plant {plant}"
    assert body["first_failure"]["violations"]


def test_cli_sim_refuses_a_bad_count() -> None:
    result = CliRunner().invoke(chaos, ["sim", "--seeds", "0"])
    assert result.exit_code == 2
