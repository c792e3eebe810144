"""A short real-process campaign of operator moves struck by faults (chaos/procs/moves.py,
docs/testing.md "Moves under faults"): three `kayos node` processes, three manager members, a
spare fourth node added as an operator adds one, acks=all producers and committing groups
throughout; each fault moves one replica onto the node outside its shard's chain and kills the
target, the source or the tail, or pauses the target, while the copy runs. Zero violations, and
every move ends, completed, cancelled or kept as an addition, within its bound.

`test_moves_struck_by_partitions_lose_nothing` runs moves with the partition kinds in network
namespaces (root and ip netns with iptables only; skipped elsewhere, saying why): the spare gets a
namespace of its own, the partition kinds cut it like any member, and a move's strike may be a
cut (the target from the tail, the source or the tail from everyone) as well as a kill or pause.

The seed is random unless KAYOS_CHAOS_SEED is set; it is printed, and the report's `replay` line
(`kayos chaos run --seed S --faults 8 --kinds move_under_fault`) replays the same faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.history import Note, load_jsonl
from chaos.procs import moves, netfaults
from tests.support.chaos import checked_campaign, needs_netns

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(420)]

FAULTS = 8
# The fault phase's bound: 8 moves take ~30-60 s here; the count, not this, ends a normal run.
FAULT_PHASE_S = 240.0


def test_moves_struck_by_kills_and_pauses_lose_nothing(tmp_path: Path) -> None:
    report = checked_campaign(
        tmp_path,
        kinds=("move_under_fault",),
        managers=3,
        faults_max=FAULTS,
        fault_phase_s=FAULT_PHASE_S,
    )
    assert report.faults == {"move_under_fault": FAULTS}, f"seed {report.seed}: {report.faults}"
    assert report.spare.get("node") == "d", report.spare
    assert "error" not in report.spare, report.spare
    # Every move was taken by the manager and ended one way or the other within its bound.
    ended = sum(report.moves.get(how, 0) for how in ("completed", "cancelled", "kept"))
    assert ended == FAULTS, f"seed {report.seed}: {report.moves}"
    assert report.to_json()["moves"] == report.moves


NETNS_FAULTS = 10


@needs_netns
def test_moves_struck_by_partitions_lose_nothing(tmp_path: Path) -> None:
    kinds = ("move_under_fault", *netfaults.NETNS_KIND_WEIGHTS)
    report = checked_campaign(
        tmp_path, kinds=kinds, managers=3, faults_max=NETNS_FAULTS, fault_phase_s=FAULT_PHASE_S
    )
    assert report.network == "NetnsCluster"
    assert sum(report.faults.values()) == NETNS_FAULTS, f"seed {report.seed}: {report.faults}"
    assert report.spare.get("node") == "d", report.spare
    assert "error" not in report.spare, report.spare
    done = [
        event.detail
        for event in load_jsonl(report.history)
        if isinstance(event, Note) and event.what == "fault done"
    ]
    struck = [d for d in done if "strike" in d]
    # Every move the manager took ended one way or the other within its bound; a partition
    # strike's cut was between members of the run (the spare's namespace among them).
    ended = sum(report.moves.get(how, 0) for how in ("completed", "cancelled", "kept"))
    assert ended == len(struck) == sum(report.moves.values()), f"seed {report.seed}: {report.moves}"
    for detail in struck:
        assert detail["strike"] in moves.STRIKES + moves.PARTITION_STRIKES
    print("strikes:", sorted((d["strike"], d["move"]) for d in struck))
