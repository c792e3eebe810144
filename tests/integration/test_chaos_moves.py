"""A short real-process campaign of operator moves struck by faults (chaos/procs/moves.py,
docs/testing.md "Moves under faults"): three `kayos node` processes, three manager members, a
spare fourth node added as an operator adds one, acks=all producers and committing groups
throughout; each fault moves one replica onto the node outside its shard's chain and kills the
target, the source or the tail, or pauses the target, while the copy runs. Zero violations, and
every move ends, completed or cancelled, within its bound.

The seed is random unless KAYOS_CHAOS_SEED is set; it is printed, and the report's `replay` line
(`kayos chaos run --seed S --faults 8 --kinds move_under_fault`) replays the same faults.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from chaos.procs.campaign import Config, run

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

FAULTS = 8
# The fault phase's bound: 8 moves take ~30-60 s here; the count, not this, ends a normal run.
FAULT_PHASE_S = 240.0
GAP_S = (0.1, 0.4)


def test_moves_struck_by_kills_and_pauses_lose_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("KAYOS_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"chaos seed {seed} (replay: KAYOS_CHAOS_SEED={seed})")
    report = run(
        Config(
            seed=seed,
            fault_phase_s=FAULT_PHASE_S,
            faults_max=FAULTS,
            kinds=("move_under_fault",),
            managers=3,
            gap_s=GAP_S,
            base_dir=tmp_path / "cluster",
            echo=print,
        )
    )
    summary = report.to_json()
    print(json.dumps(summary, indent=2))
    assert report.violations == [], f"seed {seed}: {report.violations}"
    assert report.faults == {"move_under_fault": FAULTS}, f"seed {seed}: {report.faults}"
    assert report.spare.get("node") == "d", report.spare
    assert "error" not in report.spare, report.spare
    # Every move was taken by the manager and ended one way or the other within its bound.
    ended = report.moves.get("completed", 0) + report.moves.get("cancelled", 0)
    assert ended == FAULTS, f"seed {seed}: {report.moves}"
    assert summary["moves"] == report.moves
    assert report.acked > 0
    assert report.lost == 0
    assert report.heads_seen > 0, "the split-brain monitor saw no head"
