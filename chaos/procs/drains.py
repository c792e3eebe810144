"""Operator drains struck by faults (docs/testing.md, "Drains under faults"): the
``drain_under_fault`` kind.

It runs on the campaign's spare node (chaos/procs/moves.py ``add_spare``). Each fault waits for a
settled cluster, asks the manager, with the signed ``drain`` request ``kayos ctl drain NODE``
sends, to empty a node drawn by the fault's seed, and while the manager moves its replicas away
strikes with the strikes of ``move_under_fault`` (kill -9 of the drained node, of a move's target
or of the shard's tail, SIGSTOP of the target; in network namespaces the partitions too), heals,
waits, bounded, until the manager holds no move and the node no replica, then sends the signed
``rebalance`` request (``kayos ctl rebalance``) and waits, bounded, again.

A drained node stays ``draining`` in the manager's view (docs/manager.md, "Undoing a drain" is
not decided): it never takes a replica again, so the rebalance spreads replicas over the other
nodes, and the drained node runs on empty (faults still strike it). A drain needs a node outside
each of the drained node's chains: when only ``replicas`` nodes can take replicas, the fault first
adds a replacement node (``e``, ``f``, ... as an operator adds one, the spare's path), at most
``REPLACEMENTS`` of them in a campaign; past that a fault finds no drain (``none_possible``).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from typing import Any

from chaos.procs import moves
from chaos.procs.membership import all_up, chains, manager_view
from chaos.procs.netfaults import CUT_HOWS
from kayos.local.cluster import LocalCluster
from kayos.local.processes import ClusterError

KIND_WEIGHTS: dict[str, int] = {"drain_under_fault": 3}
KINDS = frozenset(KIND_WEIGHTS)
# The nodes a campaign may add, in order, so that a drain has somewhere to go: each one is one
# more `kayos node` process on the box for the rest of the campaign.
REPLACEMENTS = tuple("efghijklmnopqrstuvwxyz")
# After the strike: how long the manager gets to empty the drained node (a move per shard it
# held, one after another when a struck target cancels one and the manager starts it again).
drain_end_timeout_s = 120.0
# After the rebalance request: how long its moves get (none struck).
rebalance_end_timeout_s = 90.0
# How long leaving a Watch waits for its thread (one poll of the manager at most).
watch_join_timeout_s = 10.0


def takers(view: dict[str, Any]) -> list[str]:
    """The nodes that may take a replica: up and not draining, by id."""
    draining = set(view.get("draining", ()))
    return sorted(str(n) for n, state, *_ in view["nodes"] if state == "up" and n not in draining)


def settled(view: dict[str, Any], replicas: int) -> bool:
    """Every node up (but the ones drained for good), every chain at ``replicas`` members with no
    move or catch-up pending, and no draining node left in a chain."""
    if not all_up(view):
        return False
    draining = set(view.get("draining", ()))
    return all(
        len(s["chain"]) == replicas
        and not s["moves"]
        and not s["catching_up"]
        and not draining & set(s["chain"])
        for s in view["shards"]
    )


def drainable(view: dict[str, Any], replicas: int) -> list[str]:
    """The nodes a drain can empty now: in a settled view, every taker holding a replica, when
    there are more takers than ``replicas`` (so each shard has one outside its chain)."""
    nodes = takers(view)
    if not settled(view, replicas) or len(nodes) <= replicas:
        return []
    held = {member for chain in chains(view).values() for member in chain}
    return [n for n in nodes if n in held]


def plan(
    rng: random.Random, view: dict[str, Any], replicas: int, strikes: tuple[str, ...]
) -> dict[str, Any] | None:
    """The node to drain and the strike (one of ``strikes``) for one fault, drawn by ``rng``
    from ``view``; a partition strike draws how its cut stops traffic too."""
    nodes = drainable(view, replicas)
    if not nodes:
        return None
    drain: dict[str, Any] = {
        "node": rng.choice(nodes),
        "strike": rng.choice(strikes),
        "delay_s": round(rng.uniform(0.0, moves.strike_delay_s_max), 3),
    }
    if drain["strike"] in moves.PARTITION_STRIKES:
        drain["how"] = rng.choice(CUT_HOWS)
    return drain


def aimed(drain: dict[str, Any], before: dict[str, Any], during: dict[str, Any]) -> dict[str, Any]:
    """The move the strike is aimed at, as ``move_under_fault`` names one (shard, source, target,
    tail): the drained node's first pending move in ``during``; with none pending (not started
    yet, or done), its first shard in ``before`` and, as target, the member that shard gained
    since (else the shard's tail)."""
    node = drain["node"]
    pending = sorted(
        (int(s["id"]), str(target))
        for s in during["shards"]
        for target, source in s["moves"]
        if source == node
    )
    now = chains(during)
    if pending:
        shard, target = pending[0]
    else:
        shard = min(i for i, chain in chains(before).items() if node in chain)
        gained = [n for n in now[shard] if n not in chains(before)[shard]]
        target = gained[0] if gained else now[shard][-1]
    return {**drain, "shard": shard, "source": node, "target": target, "tail": now[shard][-1]}


def observe(pending: dict[tuple[int, str], str], view: dict[str, Any]) -> Counter[str]:
    """Updates ``pending`` ((shard, target) -> source: the moves seen pending) from ``view`` and
    counts the ones that ended since: ``completed`` (the target in the chain, the source out),
    ``cancelled`` (the target not in it), ``other``."""
    now = chains(view)
    current = {(int(s["id"]), str(t)): str(src) for s in view["shards"] for t, src in s["moves"]}
    ended: Counter[str] = Counter()
    for key, source in list(pending.items()):
        if key in current:
            continue
        shard, target = key
        del pending[key]
        chain = now.get(shard, [])
        if target not in chain:
            ended["cancelled"] += 1
        else:
            ended["completed" if source not in chain else "other"] += 1
    pending.update(current)
    return ended


def drained(view: dict[str, Any], node: str | None, replicas: int) -> bool:
    """No move or catch-up pending, every chain at ``replicas`` members at least and (for a
    drain) ``node`` in none: a drained node struck down is spliced out of a shard whose move a
    struck target cancelled, and is in no chain until it rejoins, to be moved out again."""
    return all(
        not s["moves"] and not s["catching_up"] and len(s["chain"]) >= replicas
        for s in view["shards"]
    ) and all(node not in s["chain"] for s in view["shards"])


def blocked(view: dict[str, Any], node: str) -> bool:
    return any(kind == "drain_blocked" and who == node for kind, _shard, who in view["alerts"])


class Watch:
    """The manager leader's view, polled in a thread from before a request until its moves end,
    counting the moves as they end (``observe``): a strike, a kill or pause of seconds, would
    otherwise hide the moves that start and end while it lasts."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.pending: dict[tuple[int, str], str] = {}
        self.ended: Counter[str] = Counter()
        self.last: dict[str, Any] | None = None
        self.polls = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drain-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(watch_join_timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                view = manager_view(self.cluster)
            except (OSError, ValueError):
                view = None
            if view is not None:
                with self._lock:
                    self.ended += observe(self.pending, view)
                    self.last = view
                    self.polls += 1
            self._stop.wait(moves.poll_s)  # the poll's round; set() ends it at once

    def view(self) -> dict[str, Any] | None:
        with self._lock:
            return self.last

    def until(self, condition: Any, timeout_s: float) -> dict[str, Any] | None:
        """The latest view once ``condition(view)`` holds, polled until ``timeout_s``; else
        None. Only views whose poll began after the call count (the second poll on), so a
        request answered before the call is in them."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            first = self.polls + 2
        while True:
            with self._lock:
                view, polls = self.last, self.polls
            if view is not None and polls >= first and condition(view):
                return view
            if time.monotonic() >= deadline:
                return None
            time.sleep(moves.poll_s)  # a bounded poll of a condition

    def counts(self) -> dict[str, int]:
        """The moves' ends so far, and ``pending``: the ones still held."""
        with self._lock:
            found = dict(self.ended)
            if self.pending:
                found["pending"] = len(self.pending)
        return dict(sorted(found.items()))


def room(cluster: LocalCluster) -> dict[str, Any] | None:
    """Once settled, a replacement node added when only ``replicas`` nodes take replicas: what
    the add did, None if nothing was added; ``error`` when no replacement is left or the
    manager did not settle."""
    view = moves.wait_view(cluster, lambda v: settled(v, cluster.replicas), moves.settle_timeout_s)
    if view is None:
        return {"error": f"not settled within {moves.settle_timeout_s:.0f} s"}
    if len(takers(view)) > cluster.replicas:
        return None
    known = {str(n) for n, *_ in view["nodes"]}
    fresh = [n for n in REPLACEMENTS if n not in cluster.ids and n not in known]
    if not fresh:
        return {"error": f"every replacement ({', '.join(REPLACEMENTS)}) already added"}
    return moves.add_spare(cluster, fresh[0])


def drain_under_fault(
    cluster: LocalCluster, node: str, hold_s: float, index: int
) -> dict[str, Any]:
    """One operator drain struck by a fault, then a rebalance; never raises for what the cluster
    did: a refused request, a drain still pending at the bound or a failed restart is in the
    result (``drain``, ``unexpected``). ``node`` seeds the draw with the schedule."""
    rng = random.Random(f"drain-{index}-{node}-{hold_s}")
    added = room(cluster)
    extra = {} if added is None else {"added": added}
    if added is not None and "error" in added:
        return {"drain": "none_possible", **extra}
    replicas = cluster.replicas
    before = moves.wait_view(cluster, lambda v: drainable(v, replicas), moves.settle_timeout_s)
    drain = None if before is None else plan(rng, before, replicas, moves.strikes_for(cluster))
    if before is None or drain is None:
        last = manager_view(cluster)
        return {"drain": "none_possible", **extra, "chains": None if last is None else chains(last)}
    with Watch(cluster) as watch:
        reply = moves.operator_request(cluster, {"op": "drain", "node": drain["node"]})
        if "error" in reply:
            return {"drain": "refused", **drain, **extra, **reply}
        began = time.monotonic()
        time.sleep(drain["delay_s"])  # when the strike lands in the moves: the fault's own timing
        during = watch.view() or before
        move = aimed(drain, before, during)
        move["struck_pending"] = not drained(during, drain["node"], replicas)
        struck, problems = moves.strike(cluster, move, hold_s)
        end = watch.until(lambda v: drained(v, drain["node"], replicas), drain_end_timeout_s)
        last = watch.view()
        outcome = "completed" if end is not None else "pending_at_bound"
        if end is None and last is not None and blocked(last, drain["node"]):
            outcome = "blocked"
        result: dict[str, Any] = {
            **move,
            **extra,
            "struck": struck,
            "drain": outcome,
            "drain_s": round(time.monotonic() - began, 2),
            "moves": watch.counts(),
        }
    if outcome != "completed":
        problems.append(
            f"drain of {drain['node']} {outcome} {drain_end_timeout_s:.0f} s after the "
            f"{drain['strike']}"
        )
    if outcome == "completed":
        problems += retire(cluster, drain["node"])
        added = room(cluster)
        if added is not None:
            result["replaced_by"] = added
    problems += rebalance(cluster, result)
    if problems:
        result["unexpected"] = problems
    return result


def retire(cluster: LocalCluster, node: str, sig: int = signal.SIGTERM) -> list[str]:
    """Stops the drained ``node`` for good (SIGTERM) and drops it from the cluster's nodes, so the
    campaign neither restarts it nor draws faults on it; what went wrong is returned. It stays
    in the manager's view, draining and soon down (the campaign does not remove it)."""
    try:
        if cluster.running(node):
            cluster.kill(node, sig)  # waits for the exit (SIGKILL past its bound)
    except (ClusterError, OSError) as error:
        return [f"stopping the drained {node}: {error}"[:500]]
    finally:
        cluster.processes.pop(node, None)
        if node in cluster.ids:
            cluster.ids.remove(node)
    return []


def rebalance(cluster: LocalCluster, result: dict[str, Any]) -> list[str]:
    """The signed rebalance request and a bounded wait for its moves; their ends go in
    ``result["rebalance"]``, what went wrong is returned."""
    with Watch(cluster) as watch:
        reply = moves.operator_request(cluster, {"op": "rebalance"})
        if "error" in reply:
            result["rebalance"] = {"error": reply["error"]}
            return [f"rebalance refused: {reply['error']}"]
        end = watch.until(lambda v: drained(v, None, cluster.replicas), rebalance_end_timeout_s)
        result["rebalance"] = watch.counts()
    if end is None:
        return [f"rebalance moves still pending {rebalance_end_timeout_s:.0f} s after it"]
    return []
