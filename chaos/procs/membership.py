"""Faults that need the manager (docs/testing.md, "The real-process campaign"), the split-brain
monitor, and the convergence wait of a campaign whose chains change.

With the manager running, a node down past its detection window is spliced out of every chain
and a returning node catches up and rejoins as tail. These faults strike at those moments (right
after a splice, during a rejoin), kill the manager's leader, cut power to every node at once,
damage a minority's stores while they are down, and pause nodes while another is dead. Each ends
with every process running again; the manager then heals the chains by itself.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.managers import member_status
from kayos.local.processes import ClusterError
from kayos.storage.maintenance.check import data_file_of

# How long a membership fault waits for the manager to act (a splice, a catch-up starting): the
# detection window plus a few poll rounds, with room for two busy shared cores.
manager_act_timeout_s = 30.0
# A bounded poll of a condition (a node's or the manager's status).
poll_s = 0.05
# The split-brain monitor's round: every node's and the manager leader's status.
monitor_interval_s = 0.1
# Bit flips: how many bytes of a store's data file a fault flips (each one bit).
bit_flips_max = 8


# --- the manager's view ----------------------------------------------------------------------


def manager_view(cluster: LocalCluster) -> dict[str, Any] | None:
    """The view of the member that leads (None if none answers as leader)."""
    for member in cluster.manager_members:
        if not cluster.running(member.id):
            continue
        status = member_status(member, cluster.identity.secret)
        if status is not None and status.get("leader") == member.id and status.get("ready"):
            view = status.get("view")
            return view if isinstance(view, dict) else None
    return None


def chains(view: dict[str, Any]) -> dict[int, list[str]]:
    return {int(s["id"]): list(s["chain"]) for s in view["shards"]}


def emptied(view: dict[str, Any]) -> set[str]:
    """The nodes drained for good (draining, in no chain: chaos/procs/drains.py stops them):
    whether they are up is no concern of a wait for a whole cluster."""
    held = {member for s in view["shards"] for member in s["chain"]}
    return {str(n) for n in view.get("draining", ()) if n not in held}


def all_up(view: dict[str, Any]) -> bool:
    """Every node in the view up, but the ones drained or removed for good."""
    gone = emptied(view)
    return all(state in ("up", "removed") for n, state, *_ in view["nodes"] if n not in gone)


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float) -> Any:
    """Polls ``condition`` until truthy; ``ClusterError`` naming ``what`` past the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not within {timeout_s}s")
        time.sleep(poll_s)  # a bounded poll of a condition


def spliced_out(cluster: LocalCluster, node: str) -> bool:
    """The manager holds ``node`` down and has spliced it out of every chain it can: a shard's
    last member is never spliced out (docs/manager.md rule 3), so it may stay in those."""
    view = manager_view(cluster)
    if view is None:
        return False
    down = any(n == node and state == "down" for n, state, *_ in view["nodes"])
    return down and all(node not in chain or chain == [node] for chain in chains(view).values())


def caught_or_catching(cluster: LocalCluster, node: str) -> bool:
    """The manager has ``node`` catching up on some shard, or it departed none (it was the last
    member of each, rejoined at once, or held no replica: the spare of chaos/procs/moves.py)."""
    view = manager_view(cluster)
    if view is None:
        return False
    catching = any(node in s["catching_up"] for s in view["shards"])
    return catching or not any(node in s.get("departed", ()) for s in view["shards"])


def catching_up(cluster: LocalCluster, node: str) -> bool:
    view = manager_view(cluster)
    return view is not None and any(node in s["catching_up"] for s in view["shards"])


def converged(cluster: LocalCluster) -> dict[int, int] | None:
    """Each shard's seq once the manager holds every node up, every chain at the cluster's
    replica count with no catch-up or move pending (a node outside a chain, the spare of
    chaos/procs/moves.py, is not waited for there), and every member of each chain reports the
    same last and committed seq, linked to its upstream and not catching up; else None."""
    view = manager_view(cluster)
    if view is None:
        return None
    if not all_up(view):
        return None
    statuses = {node: cluster.status(node) for node in cluster.ids}
    agreed: dict[int, int] = {}
    for shard in view["shards"]:
        chain = list(shard["chain"])
        if len(chain) != cluster.replicas or shard["catching_up"] or shard.get("moves"):
            return None
        seqs: set[int] = set()
        for position, node in enumerate(chain):
            status = statuses.get(node)
            if status is None or int(status.get("epoch", 0)) < int(view["epoch"]):
                return None
            replica = status.get("shards", {}).get(str(shard["id"]))
            if replica is None or replica.get("catching_up") or replica.get("role") == "learner":
                return None
            if position > 0 and replica.get("upstream_linked") is False:
                return None
            seqs.add(int(replica["last_seq"]))
            seqs.add(int(replica["committed_seq"]))
        if len(seqs) != 1:
            return None
        agreed[int(shard["id"])] = seqs.pop()
    return agreed


def wait_converged(cluster: LocalCluster, timeout_s: float) -> dict[int, int]:
    result: dict[int, int] = wait_for(
        lambda: converged(cluster), "the manager rejoining every node, replicas agreeing", timeout_s
    )
    return result


# --- split brain -----------------------------------------------------------------------------


@dataclass(eq=False)
class HeadMonitor(threading.Thread):
    """Polls every node's status and the manager leader's view throughout a campaign and records
    who says it is head of which shard at which topology epoch. A violation: two nodes heads of
    one shard at one epoch, or a node head at the epoch the manager holds while the manager's
    chain names another head."""

    cluster: LocalCluster
    heads: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="chaos-head-monitor", daemon=True)

    def run(self) -> None:
        while not self.stop.wait(monitor_interval_s):
            self.observe()

    def observe(self) -> None:
        self.rounds += 1
        view = manager_view(self.cluster) if self.cluster.manager_members else None
        for node in list(self.cluster.ids):
            if not self.cluster.running(node):
                continue
            status = self.cluster.status(node)
            if status is None:
                continue
            epoch = int(status.get("epoch", 0))
            for shard_id, replica in status.get("shards", {}).items():
                if replica.get("role") != "head":
                    continue
                key = (int(shard_id), epoch)
                seen = self.heads.setdefault(key, set())
                if node not in seen:
                    seen.add(node)
                    if len(seen) > 1:
                        self._violate(f"shard {shard_id} epoch {epoch}: heads {sorted(seen)}")
                if view is not None and int(view["epoch"]) == epoch:
                    head = chains(view).get(int(shard_id), [None])[0]
                    if head != node:
                        self._violate(
                            f"node {node} head of shard {shard_id} at epoch {epoch}; "
                            f"the manager's chain there is {chains(view).get(int(shard_id))}"
                        )

    def _violate(self, message: str) -> None:
        if all(v["message"] != message for v in self.violations):
            self.violations.append({"property": "split_brain", "message": message, "detail": {}})


# --- store damage ----------------------------------------------------------------------------


def damage_stores(data_dir: Path, rng: random.Random, how: str) -> list[dict[str, Any]]:
    """Bit flips in, or a truncation of, each shard store's data file under a (stopped) node's
    directory, chosen by ``rng``; returns what was done to which file."""
    done: list[dict[str, Any]] = []
    shards = data_dir / "shards"
    for store in sorted(shards.iterdir()) if shards.is_dir() else []:
        try:
            path = data_file_of(str(store))
        except FileNotFoundError:
            continue
        size = os.path.getsize(path)
        if size < 2:
            continue
        if how == "truncate":
            cut = rng.randrange(1, size)
            os.truncate(path, cut)
            done.append({"file": path, "truncated_to": cut, "was": size})
            continue
        offsets = sorted(rng.randrange(size) for _ in range(rng.randint(1, bit_flips_max)))
        with open(path, "r+b") as handle:
            for offset in offsets:
                handle.seek(offset)
                byte = handle.read(1)[0]
                handle.seek(offset)
                handle.write(bytes([byte ^ (1 << rng.randrange(8))]))
            handle.flush()
            os.fsync(handle.fileno())
        done.append({"file": path, "flipped": offsets, "size": size})
    return done


# --- the faults ------------------------------------------------------------------------------


def _hold(seconds: float) -> None:
    # The fault's own length (a node kept down or paused), not a wait for a condition.
    time.sleep(seconds)


def _other(cluster: LocalCluster, node: str, step: int = 1) -> str:
    return cluster.ids[(cluster.ids.index(node) + step) % len(cluster.ids)]


def _pause(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def _resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def kill_manager_leader(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    """kill -9 of the manager's leader member, down ``hold_s``, started again."""
    leader = cluster.wait_manager_leader()
    assert leader is not None, "no manager members"
    code = cluster.kill(leader, signal.SIGKILL)
    _hold(hold_s)
    cluster.start(leader)
    return {"member": leader, "exit_code": code}


def splice_then(cluster: LocalCluster, node: str, hold_s: float, second: str) -> dict[str, Any]:
    """kill -9 of ``node``; the moment the manager has spliced it out of every chain, ``second``
    (kill -9 or a SIGSTOP) strikes another node; both come back after ``hold_s``."""
    other = _other(cluster, node)
    cluster.kill(node, signal.SIGKILL)
    began = time.monotonic()
    wait_for(lambda: spliced_out(cluster, node), f"{node} spliced out", manager_act_timeout_s)
    splice_s = round(time.monotonic() - began, 2)
    if second == "kill":
        cluster.kill(other, signal.SIGKILL)
        _hold(hold_s)
        cluster.start(other, wait=False)
    else:
        pid = cluster.pid(other)
        assert pid is not None, f"node {other} is not running"
        _pause(pid)
        try:
            _hold(hold_s)
        finally:
            _resume(pid)
    cluster.start(node, wait=False)
    cluster.wait_ready([node, other] if second == "kill" else [node])
    return {"spliced_after_s": splice_s, "second": other}


def splice_then_kill(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    return splice_then(cluster, node, hold_s, "kill")


def splice_then_pause(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    return splice_then(cluster, node, hold_s, "pause")


def rejoin_then(cluster: LocalCluster, node: str, hold_s: float, victim: str) -> dict[str, Any]:
    """kill -9 of ``node``, spliced out, started again; the moment the manager has it catching
    up, kill -9 of the returning node itself (``victim`` "self") or of the tail it copies from
    ("tail"), down ``hold_s``, started again."""
    cluster.kill(node, signal.SIGKILL)
    wait_for(lambda: spliced_out(cluster, node), f"{node} spliced out", manager_act_timeout_s)
    cluster.start(node)
    wait_for(
        lambda: caught_or_catching(cluster, node), f"{node} catching up", manager_act_timeout_s
    )
    target = node
    if victim == "tail":
        view = manager_view(cluster)
        tails = [c[-1] for c in chains(view).values() if c] if view else []
        target = tails[0] if tails else _other(cluster, node)
    cluster.kill(target, signal.SIGKILL)
    _hold(hold_s)
    cluster.start(target)
    return {"killed": target}


def rejoin_kill_self(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    return rejoin_then(cluster, node, hold_s, "self")


def rejoin_kill_tail(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    return rejoin_then(cluster, node, hold_s, "tail")


def corrupt_down(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    """kill -9 of one node (a minority of three), bit flips in or a truncation of each of its
    stores while it is down, started again: it must salvage and re-fetch (Jepsen's NATS 2.12.1
    file faults)."""
    rng = random.Random(f"corrupt-{node}-{index}-{hold_s}")
    how = rng.choice(("bit_flips", "truncate"))
    cluster.kill(node, signal.SIGKILL)
    done = damage_stores(cluster.data_dir(node), rng, how)
    _hold(hold_s)
    cluster.start(node)
    return {"how": how, "damage": done}


def wipe_down(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    """kill -9 of one node (a minority of three), every store of it deleted while it is down
    (a disk replaced, or an operator's reset), started again: it must take each shard whole,
    by file, from a live member (docs/replication-protocol.md, "Store snapshots"). It strikes
    only once every chain is whole (bounded wait; else it is skipped): wiping a node while it is
    a shard's last member holding the data is the loss of every copy, not a minority fault."""
    if not _wait_whole(cluster, whole_wait_s):
        return {"wiped_shards": [], "skipped": f"chains not whole within {whole_wait_s:.0f} s"}
    cluster.kill(node, signal.SIGKILL)
    shards = cluster.data_dir(node) / "shards"
    wiped = sorted(p.name for p in shards.iterdir()) if shards.is_dir() else []
    shutil.rmtree(shards, ignore_errors=True)
    _hold(hold_s)
    cluster.start(node)
    return {"wiped_shards": wiped}


# How long wipe_down waits for every chain to be whole before it strikes.
whole_wait_s = 60.0


def _wait_whole(cluster: LocalCluster, timeout_s: float) -> bool:
    """Whether, within ``timeout_s``, every shard's chain in the manager's view (without a
    manager: in the newest topology a running node holds) has as many members as the launcher
    made, with nobody catching up."""
    replicas = len(next(iter(cluster.topology.shards.values())).chain)

    def whole() -> bool:
        try:
            view = manager_view(cluster) if cluster.manager_ids else None
        except (OSError, ValueError):
            return False
        if view is not None:
            return all(len(s["chain"]) >= replicas and not s["catching_up"] for s in view["shards"])
        try:
            live = cluster.live_topology()
        except (OSError, KayosError):
            return False
        return all(len(shard.chain) >= replicas for shard in live.shards.values())

    deadline = time.monotonic() + timeout_s
    while not whole():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)  # a bounded poll of a condition
    return True


def power_loss(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    """kill -9 of every node at once, down ``hold_s``, all started again. What this does not
    model: the page cache survives a process kill, so writes not yet fsynced are not lost here as
    they would be on a real power cut (the simulator's and the storage tier's faulty disks cover
    that)."""
    pids = [pid for pid in (cluster.pid(n) for n in cluster.ids) if pid is not None]
    for pid in pids:  # every signal before any wait: as near "at once" as a process gets
        os.kill(pid, signal.SIGKILL)
    codes = {n: cluster.kill(n, signal.SIGKILL) for n in cluster.ids if n in cluster.processes}
    _hold(hold_s)
    for n in cluster.ids:
        cluster.start(n, wait=False)
    cluster.wait_ready(cluster.ids)
    return {"exit_codes": codes}


def kill_with_pauses(cluster: LocalCluster, node: str, hold_s: float) -> dict[str, Any]:
    """kill -9 of one node while every other is SIGSTOPped for ``hold_s`` (one after the
    other, a fraction apart); the split-brain monitor watches the heads meanwhile."""
    cluster.kill(node, signal.SIGKILL)
    paused: list[int] = []
    try:
        for other in cluster.ids:
            pid = cluster.pid(other)
            if other != node and pid is not None:
                _pause(pid)
                paused.append(pid)
                _hold(hold_s / 4)
        _hold(hold_s)
    finally:
        for pid in paused:
            _resume(pid)
    cluster.start(node)
    return {"paused": len(paused)}


# The faults taking (cluster, node, hold_s); corrupt_down also takes the fault's index.
HANDLERS: dict[str, Callable[[LocalCluster, str, float], dict[str, Any]]] = {
    "kill_manager_leader": kill_manager_leader,
    "splice_then_kill": splice_then_kill,
    "splice_then_pause": splice_then_pause,
    "rejoin_kill_self": rejoin_kill_self,
    "rejoin_kill_tail": rejoin_kill_tail,
    "power_loss": power_loss,
    "kill_with_pauses": kill_with_pauses,
    "wipe_down": wipe_down,
}
