"""Operator moves struck by faults (docs/testing.md, "Moves under faults"): the campaign's spare
node, and the ``move_under_fault`` kind.

A campaign whose kinds include ``move_under_fault`` gets one node beyond the chains' three,
started and added as an operator adds one (``LocalCluster.add_outside_node``, then the signed
``add-node`` request ``kayos ctl add-node`` sends). Each fault asks the manager, with the signed
``move-shard`` request ``kayos ctl move-shard`` sends, to move one replica of a shard onto the
node outside that shard's chain, and while the target copies from the tail strikes the move's
target, its source or the shard's tail (kill -9 and restart, or SIGSTOP of the target; in
network namespaces also a partition of the target from the tail, or of the source or the tail
from every other member, healed after), then waits, bounded, until the manager holds no move for
the shard. The cluster is reached only through its public APIs (node and manager HTTP), process
signals and the namespaces' rules.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

from chaos.procs.membership import all_up, chains, manager_view
from chaos.procs.netfaults import CUT_HOWS, ProxiedCluster, held_cut
from chaos.procs.netns import NetnsCluster, NetnsError
from kayos.client.operator import post_operator_until
from kayos.local.cluster import LocalCluster
from kayos.local.processes import ClusterError

KIND_WEIGHTS: dict[str, int] = {"move_under_fault": 3}
KINDS = frozenset(KIND_WEIGHTS)
STRIKES = ("kill_target", "kill_source", "kill_tail", "pause_target")
# Drawn as well only in network namespaces (a NetnsCluster): the target cut from the shard's tail
# (its upstream in the copy), the source or the tail cut from every other node and manager member.
PARTITION_STRIKES = ("cut_target_from_tail", "isolate_source", "isolate_tail")

# The spare node's id: the one after the chains' nodes (a, b, c -> d).
SPARE_NODE = "d"
# One signed operator request, retried through an election or a stale epoch.
operator_timeout_s = 30.0
# Before a move: how long to wait for a shard that can move (every node up, a full chain, no
# move or catch-up pending, a node outside the chain): a kill of an earlier fault must have been
# healed by the manager first (detection window, catch-up and rejoin, with room for busy cores).
settle_timeout_s = 60.0
# After the strike: how long the manager gets to finish or cancel the move. A cancelled move's
# target is seen down within the detection window; a finished one copies a few MB at most here.
move_end_timeout_s = 90.0
# The strike lands this long (drawn from 0 .. the bound by the fault's seed) after the manager
# took the move: at once, mid-copy, or around the join.
strike_delay_s_max = 0.5
# A SIGSTOP of the target, and a partition strike, last 0.2 s plus twice the fault's hold (0-2 s):
# 0.2-4.2 s. Past the
# campaign's 1 s suspect bound (most of them) the manager cancels the move (a catch-up goes on
# only on an up node); a shorter one the move must ride out.
pause_s_base = 0.2
# A bounded poll of the manager's view.
poll_s = 0.05


def add_spare(cluster: LocalCluster, node: str = SPARE_NODE) -> dict[str, Any]:
    """Starts node ``node`` (the spare, or a drain's replacement: chaos/procs/drains.py) and adds
    it to the manager as ``kayos ctl add-node`` does; returns what happened (``error`` if the
    manager did not take it: the moves then find no target)."""
    if isinstance(cluster, ProxiedCluster):
        raise ValueError(
            "move_under_fault and drain_under_fault cannot run with the proxy kinds: the spare "
            "has no fault proxy"
        )
    address = cluster.add_outside_node(node)
    body: dict[str, Any] = {"op": "add-node", "node": node, "host": address.host}
    body |= {"http_port": address.http_port, "bin_port": address.bin_port}
    reply = operator_request(cluster, body)
    if "error" in reply:
        return {"node": node, **reply}
    view = wait_view(cluster, lambda v: node_state(v, node) == "up", settle_timeout_s)
    return {"node": node, "epoch": None if view is None else view["epoch"]}


def movable(view: dict[str, Any], replicas: int) -> dict[int, list[str]]:
    """Per shard that can move now, the up nodes outside its chain that may take a replica (not
    draining: chaos/procs/drains.py): every node in the view up (but the ones drained for good),
    the chain at full length with no move and no catch-up pending."""
    if not all_up(view):
        return {}
    states = {str(n): str(state) for n, state, *_ in view["nodes"]}
    draining = set(view.get("draining", ()))
    found: dict[int, list[str]] = {}
    for shard in view["shards"]:
        chain = list(shard["chain"])
        if len(chain) != replicas or shard["moves"] or shard["catching_up"]:
            continue
        outside = sorted(n for n in states if n not in chain and n not in draining)
        if outside:
            found[int(shard["id"])] = outside
    return found


def strikes_for(cluster: LocalCluster) -> tuple[str, ...]:
    """The strikes a move can draw on ``cluster``: the partitions only in network namespaces."""
    return STRIKES + PARTITION_STRIKES if isinstance(cluster, NetnsCluster) else STRIKES


def plan(
    rng: random.Random, view: dict[str, Any], replicas: int, strikes: tuple[str, ...] = STRIKES
) -> dict[str, Any] | None:
    """The move and strike (one of ``strikes``) for one fault, drawn by ``rng`` from what can
    move in ``view``; a partition strike draws how its cut stops traffic too."""
    candidates = movable(view, replicas)
    if not candidates:
        return None
    shard = rng.choice(sorted(candidates))
    chain = chains(view)[shard]
    move: dict[str, Any] = {
        "shard": shard,
        "source": rng.choice(chain),
        "target": rng.choice(candidates[shard]),
        "tail": chain[-1],
        "strike": rng.choice(strikes),
        "delay_s": round(rng.uniform(0.0, strike_delay_s_max), 3),
    }
    if move["strike"] in PARTITION_STRIKES:
        move["how"] = rng.choice(CUT_HOWS)
    return move


def struck_node(move: dict[str, Any]) -> str:
    """The node a move's strike is aimed at (for a cut: the node cut off, or the target)."""
    role = {"kill_source": "source", "isolate_source": "source"}
    role |= {"kill_tail": "tail", "isolate_tail": "tail"}
    return str(move[role.get(str(move["strike"]), "target")])


def cut_sides(move: dict[str, Any], members: list[str]) -> tuple[list[str], list[str]]:
    """A partition strike's two sides: the target and the tail, or the struck node and every
    other member."""
    if move["strike"] == "cut_target_from_tail":
        return [move["target"]], [move["tail"]]
    struck = struck_node(move)
    return [struck], [member for member in members if member != struck]


def outcome(view: dict[str, Any], move: dict[str, Any]) -> str | None:
    """``completed`` (the target in the chain, the source out), ``cancelled`` (the target not in
    it), ``kept`` (both in it: the move ended as an addition, because the source's leaving would
    have left the shard short, docs/manager.md rule 7), or None while still pending."""
    shard = next(s for s in view["shards"] if int(s["id"]) == move["shard"])
    if shard["moves"]:
        return None
    chain = list(shard["chain"])
    if move["target"] not in chain:
        return "cancelled"
    return "completed" if move["source"] not in chain else "kept"


def move_under_fault(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    """One operator move struck by a fault; never raises for what the cluster did: a refused
    move, a move still pending at the bound or a failed restart is in the result (``move``,
    ``unexpected``). ``node`` seeds the draw with the schedule; the move picks its own nodes."""
    rng = random.Random(f"move-{index}-{node}-{hold_s}")
    view = wait_view(cluster, lambda v: movable(v, cluster.replicas), settle_timeout_s)
    move = None if view is None else plan(rng, view, cluster.replicas, strikes_for(cluster))
    if view is None or move is None:
        last = manager_view(cluster)
        return {"move": "none_possible", "chains": None if last is None else chains(last)}
    body = {"op": "move-shard", "shard": move["shard"]}
    reply = operator_request(cluster, {**body, "source": move["source"], "target": move["target"]})
    if "error" in reply:
        return {"move": "refused", **move, **reply}
    began = time.monotonic()
    time.sleep(move["delay_s"])  # when the strike lands in the copy: the fault's own timing
    during = wait_view(cluster, lambda v: v, 0.0)
    move["struck_pending"] = during is not None and outcome(during, move) is None
    struck, problems = strike(cluster, move, hold_s)
    end = wait_view(cluster, lambda v: outcome(v, move), move_end_timeout_s)
    result: dict[str, Any] = {
        **move,
        "struck": struck,
        "move": "pending_at_bound" if end is None else outcome(end, move),
        "move_s": round(time.monotonic() - began, 2),
    }
    if end is None:
        problems.append(
            f"shard {move['shard']}'s move {move['source']}->{move['target']} still pending "
            f"{move_end_timeout_s:.0f} s after the {move['strike']}"
        )
    if problems:
        result["unexpected"] = problems
    return result


def strike(cluster: LocalCluster, move: dict[str, Any], hold_s: float) -> tuple[str, list[str]]:
    """Lands ``move``'s strike (a process strike or a partition, healed at the end); returns the
    node struck and what went wrong doing it."""
    struck = struck_node(move)
    if move["strike"] in PARTITION_STRIKES:
        return struck, strike_cut(cluster, move, hold_s)
    return struck, strike_process(cluster, struck, move["strike"], hold_s)


def strike_process(cluster: LocalCluster, struck: str, strike: str, hold_s: float) -> list[str]:
    """kill -9 and restart after ``hold_s``, or SIGSTOP for ``pause_s_base + 2 * hold_s``; the
    struck node is running again at the end (or the failure to start it is returned)."""
    try:
        if strike == "pause_target":
            pid = cluster.pid(struck)
            if pid is None:
                return [f"node {struck} was not running for the pause"]
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(pause_s_base + 2 * hold_s)  # the pause's own length
            finally:
                os.kill(pid, signal.SIGCONT)
            return []
        if cluster.running(struck):
            cluster.kill(struck, signal.SIGKILL)
        time.sleep(hold_s)  # the node's down time: the fault's own length
        cluster.processes.pop(struck, None)
        cluster.start(struck)
    except (ClusterError, OSError) as error:
        return [f"{strike} of {struck}: {error}"[:500]]
    return []


def strike_cut(cluster: LocalCluster, move: dict[str, Any], hold_s: float) -> list[str]:
    """The move's partition for ``pause_s_base + 2 * hold_s``, healed after whatever happened."""
    sides = cut_sides(move, cluster.members())
    try:
        held_cut(cluster, sides, move["how"], pause_s_base + 2 * hold_s)
    except NetnsError as error:
        return [f"{move['strike']} {sides}: {error}"[:500]]
    return []


def operator_request(cluster: LocalCluster, body: dict[str, Any]) -> dict[str, Any]:
    """The manager's reply to a signed operator request, or ``{"error": why}``."""
    try:
        return post_operator_until(cluster.identity, cluster.manager_urls, body, operator_timeout_s)
    except (ClusterError, OSError, ValueError, RuntimeError) as error:  # TimeoutError is OSError
        return {"error": str(error)[:300]}


def node_state(view: dict[str, Any], node: str) -> str | None:
    return next((str(s) for n, s, *_ in view["nodes"] if n == node), None)


def wait_view(cluster: LocalCluster, condition: Any, timeout_s: float) -> dict[str, Any] | None:
    """The manager leader's view once ``condition(view)`` is truthy, polled until ``timeout_s``;
    None if it never was (or no leader answered)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            view = manager_view(cluster)
        except (OSError, ValueError):
            view = None
        if view is not None and condition(view):
            return view
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)  # a bounded poll of a condition
