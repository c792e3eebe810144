"""Helpers of the chaos tests: a real-process campaign that must end clean, the skip of tests that
need network namespaces, and canned manager views for the deterministic parts of the campaign's
fault kinds."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from chaos.procs import faults, netns
from chaos.procs.campaign import Config, Report, run
from kayos import tlsconfig

# Load between faults (seconds): shorter than a campaign's default, to keep CI near 2 minutes.
GAP_S = (0.1, 0.4)


def checked_campaign(
    tmp_path: Path,
    *,
    kinds: tuple[str, ...],
    managers: int,
    faults_max: int,
    fault_phase_s: float,
    credentials: bool = False,
    tls: bool = False,
) -> Report:
    """A campaign from a printed seed (KAYOS_CHAOS_SEED, else random) that must end with no
    violation, something acknowledged, nothing lost and heads seen by the split-brain monitor."""
    seed = int(os.environ.get("KAYOS_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"chaos seed {seed} (replay: KAYOS_CHAOS_SEED={seed}, or kayos chaos run --seed {seed})")
    try:
        report = run(
            Config(
                seed=seed,
                fault_phase_s=fault_phase_s,
                faults_max=faults_max,
                kinds=kinds,
                managers=managers,
                gap_s=GAP_S,
                base_dir=tmp_path / "cluster",
                echo=print,
                credentials=credentials,
                tls=tls,
            )
        )
    finally:
        if tls:
            tlsconfig.install(None)  # this process speaks plain again after
    print(json.dumps(report.to_json(), indent=2))
    assert report.violations == [], f"seed {seed}: {report.violations}"
    assert report.acked > 0
    assert report.lost == 0
    assert report.heads_seen > 0, "the split-brain monitor saw no head"
    return report


NETNS_REASON = netns.unavailable_reason()


needs_netns = pytest.mark.skipif(
    NETNS_REASON is not None, reason=f"partitions need network namespaces: {NETNS_REASON}"
)


NODES = ["a", "b", "c", "d"]


def first(seed: int, count: int, kinds: tuple[str, ...]) -> list[faults.Fault]:
    """The first ``count`` faults of ``kinds`` the schedule draws from ``seed`` over ``NODES``."""
    return list(itertools.islice(faults.schedule(seed, NODES, kinds), count))


def view(
    chains: dict[int, list[str]],
    *,
    down: tuple[str, ...] = (),
    moving: dict[int, tuple[str, str]] | None = None,
    catching: dict[int, list[str]] | None = None,
) -> dict[str, Any]:
    """A manager view (``GET /v1/manager/view``'s shape) of ``NODES`` at epoch 7 with ``chains``;
    nodes ``down``, moves in progress (shard -> (source, target)) and learners catching up."""
    moving, catching = moving or {}, catching or {}
    return {
        "epoch": 7,
        "nodes": [[n, "down" if n in down else "up", 0] for n in NODES],
        "shards": [
            {
                "id": shard,
                "chain": chain,
                "departed": [],
                "catching_up": catching.get(shard, []),
                "moves": [list(moving[shard])] if shard in moving else [],
            }
            for shard, chain in chains.items()
        ],
    }


CHAINS = {0: ["a", "b", "c"], 1: ["b", "c", "d"], 2: ["c", "a", "b"]}
