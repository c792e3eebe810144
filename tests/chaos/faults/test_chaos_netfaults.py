"""The network fault kinds' pure parts (chaos/procs/netfaults.py, docs/testing.md "Network
faults"): drawn only when named, hold times within their kind's range, a seed replays them, the
two families refused together, and the replay line naming what the schedule needs."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from click.testing import CliRunner

from chaos.cli import chaos
from chaos.procs import faults, netfaults
from chaos.procs.campaign import Config, replay_args

pytestmark = pytest.mark.chaos

NODES = ["a", "b", "c"]


def first(seed: int, count: int, kinds: tuple[str, ...]) -> list[faults.Fault]:
    return list(itertools.islice(faults.schedule(seed, NODES, kinds), count))


def test_network_kinds_are_drawn_only_when_named() -> None:
    assert not set(faults.KINDS) & set(netfaults.KIND_WEIGHTS)
    assert {f.kind for f in first(5, 500, faults.KINDS)} <= set(faults.KINDS)
    kinds = tuple(netfaults.KIND_WEIGHTS)
    drawn = first(5, 2000, kinds)
    assert {f.kind for f in drawn} == set(kinds)
    for fault in drawn:
        low, high = netfaults.HOLD_S[fault.kind]
        assert low <= fault.hold_s <= high, fault
    assert drawn == first(5, 2000, kinds)


def test_the_two_families_are_refused_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot run in one campaign"):
        netfaults.make_cluster(("latency", "partition"), tmp_path)
    result = CliRunner().invoke(chaos, ["run", "--kinds", "latency,partition", "--seed", "1"])
    assert result.exit_code == 2
    assert "cannot run in one campaign" in result.output


def test_the_replay_line_names_what_the_schedule_needs() -> None:
    assert replay_args(Config(seed=1)) == ""
    config = Config(seed=1, faults_max=12, kinds=("partition", "partition_split"), managers=0)
    assert replay_args(config) == " --faults 12 --kinds partition,partition_split --managers 0"
