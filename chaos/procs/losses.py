"""A node lost for good (docs/testing.md, "Losses for good"): the ``lose_for_good`` kind.

It runs on the campaign's spare node (chaos/procs/moves.py ``add_spare``), like the drains. Each
fault waits for a settled cluster (adding a replacement node first when only ``replicas`` nodes
take replicas, as drains do), then kills -9 a node that holds replicas, drawn by the fault's
seed, deletes its whole data directory (the host is gone with its disk) and never starts it
again. Nobody acts: the manager splices the node out, waits out its grace (``replace_after_ms``,
set short for the campaign: ``campaign_replace_after_ms``) and copies each shard the node held to
a node holding no replica of it, by store file (docs/manager.md rule 10). The fault waits,
bounded, until every chain is back to ``replicas`` members with no copy pending, records the
seconds from the kill, and then does what the operator does last: ``kayos ctl remove-node``.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from chaos.procs import drains, moves
from chaos.procs.membership import chains, manager_view
from kayos.local.cluster import LocalCluster

KIND_WEIGHTS: dict[str, int] = {"lose_for_good": 2}
KINDS = frozenset(KIND_WEIGHTS)
# The manager's grace in a campaign that draws this kind: long enough that a kill -9 of the
# other kinds (down at most 2 s) is back within it, short enough that a campaign sees many.
campaign_replace_after_ms = 4_000
# After the kill: how long the manager gets to splice, wait out the grace and copy every shard.
restore_timeout_s = 120.0
# How long `kayos ctl remove-node` may take (it retries through elections).
remove_timeout_s = 30.0


def restored(view: dict[str, Any], lost: str, replicas: int) -> bool:
    """Every chain at ``replicas`` members, none of them ``lost``, with no copy or move pending."""
    return all(
        len(s["chain"]) == replicas
        and lost not in s["chain"]
        and not s["catching_up"]
        and not s["moves"]
        for s in view["shards"]
    )


def lose_for_good(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    """One node lost for good and the cluster restoring its redundancy by itself; never raises
    for what the cluster did: a restore still pending at the bound is in the result
    (``restore``, ``unexpected``). ``node`` and ``hold_s`` only seed the draw."""
    rng = random.Random(f"lose-{index}-{node}-{hold_s}")
    added = drains.room(cluster)
    extra = {} if added is None else {"added": added}
    if added is not None and "error" in added:
        return {"restore": "none_possible", **extra}
    replicas = cluster.replicas
    before = moves.wait_view(
        cluster, lambda v: drains.drainable(v, replicas), moves.settle_timeout_s
    )
    candidates = [] if before is None else drains.drainable(before, replicas)
    if before is None or not candidates:
        last = manager_view(cluster)
        found = None if last is None else chains(last)
        return {"restore": "none_possible", **extra, "chains": found}
    lost = rng.choice(candidates)
    held = sorted(i for i, chain in chains(before).items() if lost in chain)
    began = time.monotonic()
    problems = _kill_for_good(cluster, lost)
    end = moves.wait_view(cluster, lambda v: restored(v, lost, replicas), restore_timeout_s)
    result: dict[str, Any] = {"lost": lost, "held": held, **extra}
    if end is None:
        result["restore"] = "pending_at_bound"
        problems.append(f"redundancy not restored {restore_timeout_s:.0f} s after losing {lost}")
    else:
        result["restore"] = "completed"
        result["kill_to_full_redundancy_s"] = round(time.monotonic() - began, 2)
        result["chains"] = chains(end)
    problems += remove_node(cluster, lost)
    if problems:
        result["unexpected"] = problems
    return result


def _kill_for_good(cluster: LocalCluster, node: str) -> list[str]:
    """kill -9 of ``node``, dropped from the cluster's nodes (never started again, no fault drawn
    on it) and its data directory deleted."""
    problems = drains.retire(cluster, node, signal.SIGKILL)
    shutil.rmtree(cluster.data_dir(node), ignore_errors=True)
    return problems


def remove_node(cluster: LocalCluster, node: str) -> list[str]:
    """``kayos ctl remove-node NODE``, as the operator runs it; what went wrong is returned."""
    command = [sys.executable, "-m", "kayos", "ctl", "remove-node", node]
    command += ["--topology", str(cluster.topology_path), "--timeout", str(remove_timeout_s)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=remove_timeout_s + 10, env=cluster.env
        )
    except subprocess.TimeoutExpired:
        return [f"kayos ctl remove-node {node} did not exit"]
    if done.returncode != 0:
        return [f"kayos ctl remove-node {node} exited {done.returncode}: {done.stderr[-300:]}"]
    return []
