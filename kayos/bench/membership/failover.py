"""``kayos bench failover``: kill -9 and SIGSTOP of each role of a chain, as producers already
connected through one shared ``kayos.Client`` see them (docs/performance.md, "Failover as
connected producers see it", defines the matrix and every figure).

For each fault x role, ``repeat`` times (interleaved), on a LocalCluster of 3 node processes and 3
manager members with the default bounds: producer threads (``failover_load.SharedProducers``)
write acks=all one message at a time; the fault strikes the node holding the role; the case ends
once every thread had a call sent after the fault acknowledged, plus ``margin_s``, or at
``bound_s``; then the node is let run or started again, the cluster made whole, and the case's
messages read back. A separate phase stalls each node in turn for 300 ms every 2-3 s and counts
the nodes the manager took out of a chain (``false_removals``). The figures are
``failover_figures``' pure functions of what was recorded.

The bench reaches the cluster through the client, the nodes' HTTP API (``LocalCluster.status``,
``live_topology``) and the manager members' (``/v1/manager/status``, ``/v1/manager/changes``);
faults are signals to the processes. The cases run on the thread that started the cluster (its
processes die with that thread): with ``restart`` that thread runs ``kayos up``'s supervisor
loop for the case while another one strikes and watches.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kayos import limits
from kayos.bench.membership.failover_figures import (
    Call,
    all_resumed_at,
    case_summary,
    longest_gap_s,
    removals,
    stall_schedule,
    targets,
    writes_resume_s,
)
from kayos.bench.membership.failover_load import (
    LoopClient,
    SharedProducers,
    marker,
    read_back,
)
from kayos.bench.produce import machine_facts
from kayos.bench.series import BIN_S, counts_per_bin
from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.local.processes import ClusterError
from kayos.local.up import StopSignal, supervise

FAULTS = ("kill9", "sigstop")
ROLES = ("head", "middle", "tail")
ROLE_INDEX = {"head": 0, "middle": 1, "tail": -1}
# What a case records; a case that failed outright records each as None.
FIGURES = ("writes_resume_s", "longest_gap_s", "acks", "errors", "lost", "duplicates")
SHARD = 0
POLL_S = 0.01  # the period of the bounded polls below (conditions, not synchronisation)
# The acknowledgement timeline a case records for its picture starts this long before the fault.
TIMELINE_BEFORE_S = 1.0
# Producer threads end the call they are in when told to stop: at most the client's own request
# timeout, plus its retries' backoff.
PRODUCERS_JOIN_S = limits.client_request_timeout_ms / 1000 + 10.0


@dataclass(frozen=True, slots=True)
class FailoverBenchParameters:
    faults: tuple[str, ...] = FAULTS
    roles: tuple[str, ...] = ROLES
    repeat: int = 5
    producers: int = 4
    restart: bool = False  # kill9: kayos up's supervisor starts the node again during the case
    # The producers' shared client: "sync" (threads sharing one kayos.Client) or "async" (calls
    # in flight at once as tasks of one long-lived kayos.AsyncClient on its own event loop).
    client: str = "sync"
    # kill9 without restart: the killed node's exit is reported to the managers as a supervisor
    # that does not restart reports it (systemd's ExecStopPost, docs/deploy.md); False leaves the
    # manager only its own probe, so the new head holds writes for what may be left of the lease.
    exit_report: bool = True
    bound_s: float = 10.0  # a case not resumed this long after the fault is recorded as not
    margin_s: float = 1.0  # the case runs on this long after every thread resumed
    warmup_s: float = 1.0
    stall_seconds: float = 30.0  # the false-removal phase; 0 leaves it out
    stall_ms: int = 300
    stall_every_s: tuple[float, float] = (2.0, 3.0)
    seed: int | None = None  # the stall schedule's; None: drawn
    whole_timeout_s: float = 120.0  # making the cluster whole again after a case
    value_bytes: int = 100

    def __post_init__(self) -> None:
        if self.client not in ("sync", "async"):
            raise ValueError("client must be sync or async")
        if not self.faults or not set(self.faults) <= set(FAULTS):
            raise ValueError(f"faults must be some of {', '.join(FAULTS)}")
        if not self.roles or not set(self.roles) <= set(ROLES):
            raise ValueError(f"roles must be some of {', '.join(ROLES)}")
        if self.repeat < 1 or self.producers < 1 or self.value_bytes < 1:
            raise ValueError("repeat, producers and value_bytes must be >= 1")
        if self.bound_s <= 0 or self.margin_s < 0 or self.warmup_s < 0:
            raise ValueError("bound_s must be > 0, margin_s and warmup_s >= 0")
        if self.stall_seconds < 0 or self.stall_ms < 1:
            raise ValueError("stall_seconds must be >= 0 and stall_ms >= 1")
        low, high = self.stall_every_s
        if not 0 < low <= high or low <= self.stall_ms / 1000:
            raise ValueError("stall_every_s needs stall_ms / 1000 < low <= high")


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``condition()`` held within ``timeout_s`` (polled every ``POLL_S``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


class Session:
    """The cluster the cases run on and the one client their producers share, made once per
    cluster; ``replace`` starts a fresh cluster (and client) in place of one that is not whole."""

    def __init__(self, root: str, client_kind: str = "sync") -> None:
        self.root = root
        self.client_kind = client_kind
        self.clusters = 0
        self.cluster: LocalCluster | None = None
        self.client: Client | None = None  # markers and read-backs; the producers' too if sync
        self.loop_client: LoopClient | None = None  # the producers' with client "async"

    def open(self) -> None:
        self.clusters += 1
        cluster = LocalCluster(
            os.path.join(self.root, f"cluster-{self.clusters}"),
            nodes=3,
            replicas=3,
            shards=1,
            managers=3,
        )
        cluster.start_all()
        self.cluster = cluster
        self.client = Client(list(cluster.urls.values()), name="bench-failover")
        if self.client_kind == "async":
            self.loop_client = LoopClient(list(cluster.urls.values()), "bench-failover-async")

    def producers_client(self) -> Client | LoopClient:
        """The client every case's producers share on this cluster."""
        return self.loop_client or self.parts()[1]

    def close(self) -> None:
        client, cluster, self.client, self.cluster = self.client, self.cluster, None, None
        loop_client, self.loop_client = self.loop_client, None
        if loop_client is not None:
            loop_client.close()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()

    def replace(self) -> None:
        self.close()
        self.open()

    def parts(self) -> tuple[LocalCluster, Client]:
        assert self.cluster is not None, "the session is not open"
        assert self.client is not None, "the session is not open"
        return self.cluster, self.client

    def chain(self) -> tuple[list[str], int]:
        """The shard's chain and epoch as the nodes hold them."""
        topology = self.parts()[0].live_topology()
        return list(topology.shards[SHARD].chain), topology.epoch

    def whole(self, timeout_s: float) -> bool:
        """Waits until every node runs, the chain holds all of them and every member reports the
        same seqs; whether that happened within ``timeout_s``."""
        cluster = self.parts()[0]
        deadline = time.monotonic() + timeout_s
        if not wait_until(
            lambda: (
                all(cluster.running(n) for n in cluster.ids)
                and sorted(self.chain()[0]) == sorted(cluster.ids)
            ),
            timeout_s,
        ):
            return False
        try:
            cluster.wait_replicated(max(1.0, deadline - time.monotonic()))
        except ClusterError:
            return False
        return True


def start_again(cluster: LocalCluster, node: str) -> None:
    """Starts ``node`` on its data unless it runs (reaping it first if it died unreaped)."""
    if node in cluster.processes and not cluster.running(node):
        cluster.wait_exit(node)
    if not cluster.running(node):
        cluster.start(node)


def strike_and_watch(
    cluster: LocalCluster,
    producers: SharedProducers,
    fault: str,
    node: str,
    parameters: FailoverBenchParameters,
) -> tuple[float, float]:
    """Strikes ``node`` and watches the producers until the case ends; returns (fault, end) times.
    A stopped node gets SIGCONT at the end; a killed one is left to the caller (or the
    supervisor)."""
    pid = cluster.pid(node)
    if pid is None:
        raise ClusterError(f"node {node} is not running: nothing to strike")
    fault_s = time.monotonic()
    os.kill(pid, signal.SIGKILL if fault == "kill9" else signal.SIGSTOP)
    try:
        deadline = fault_s + parameters.bound_s
        threads = range(producers.count)
        while (now := time.monotonic()) < deadline:
            resumed = all_resumed_at(producers.recorded(), fault_s, threads)
            if resumed is not None and now >= resumed + parameters.margin_s:
                return fault_s, now
            time.sleep(POLL_S)
        return fault_s, deadline
    finally:
        if fault == "sigstop":
            os.kill(pid, signal.SIGCONT)


def _strike(
    cluster: LocalCluster,
    producers: SharedProducers,
    fault: str,
    node: str,
    parameters: FailoverBenchParameters,
    record: dict[str, Any],
) -> tuple[float, float]:
    """``strike_and_watch``, with ``kayos up``'s supervisor running on this thread meanwhile when
    ``restart`` is asked for (its lines go in ``record["supervisor"]``)."""
    if not parameters.restart:
        reporter = None
        if fault == "kill9" and parameters.exit_report:
            reporter = threading.Thread(
                target=report_when_exited, args=(cluster, node, record), daemon=True
            )
            reporter.start()
        times = strike_and_watch(cluster, producers, fault, node, parameters)
        if fault == "kill9":
            cluster.wait_exit(node)
        if reporter is not None:
            reporter.join()
        return times
    stop = StopSignal()
    lines: list[str] = []
    box: list[tuple[float, float] | BaseException] = []

    def watched() -> None:
        try:
            box.append(strike_and_watch(cluster, producers, fault, node, parameters))
        except BaseException as exc:  # handed back to the caller's thread below
            box.append(exc)
        finally:
            stop.set()

    watcher = threading.Thread(target=watched, name="bench-failover-watch", daemon=True)
    watcher.start()
    try:
        supervise(cluster, stop, lines.append)
    finally:
        watcher.join()
        stop.close()
    record["supervisor"] = lines
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


def report_when_exited(cluster: LocalCluster, node: str, record: dict[str, Any]) -> None:
    """Waits for ``node``'s process to end and reports its exit to the managers, as a supervisor
    that does not restart it would; what the report came to goes in ``record["exit_report"]``."""
    process = cluster.processes[node]
    code = process.wait()
    record["exit_report"] = cluster.report_exit(node, code)


def run_case(
    session: Session, parameters: FailoverBenchParameters, fault: str, role: str, repetition: int
) -> dict[str, Any]:
    """One repetition of one fault of one role; returns its record (figures included)."""
    cluster, client = session.parts()
    chain, epoch = session.chain()
    node = chain[ROLE_INDEX[role]]
    queue = f"failover-{repetition}-{fault}-{role}"
    record: dict[str, Any] = {"fault": fault, "role": role, "repetition": repetition}
    record.update(node=node, chain_before=chain, epoch_before=epoch, cluster=session.clusters)
    start_seq = marker(client, queue, "start")
    producers = SharedProducers(
        session.producers_client(), queue, parameters.producers, parameters.value_bytes
    )
    producers.start()
    began = time.monotonic()
    try:
        warm = wait_until(
            lambda: (
                time.monotonic() - began >= parameters.warmup_s
                and producers.acked_by_every_thread()
            ),
            parameters.warmup_s + parameters.bound_s,
        )
        if not warm:
            raise ClusterError(f"not every producer had an acknowledgement before the {fault}")
        fault_s, end_s = _strike(cluster, producers, fault, node, parameters, record)
    finally:
        record["producers_stuck"] = producers.finish(PRODUCERS_JOIN_S)
    calls = producers.recorded()
    record.update(case_figures(producers, fault_s, end_s, parameters.bound_s))
    start_again(cluster, node)
    restoring = time.monotonic()
    whole = session.whole(parameters.whole_timeout_s)
    record["whole_again_s"] = round(time.monotonic() - restoring, 2) if whole else None
    if whole:
        record["chain_after"], record["epoch_after"] = session.chain()
        end_seq = marker(client, queue, "end")
        record.update(read_back(client, queue, start_seq, end_seq, calls))
    else:
        record.update(lost=None, duplicates=None)
        record["read_back"] = f"the cluster was not whole within {parameters.whole_timeout_s} s"
    return record


def guarded_case(
    session: Session, parameters: FailoverBenchParameters, fault: str, role: str, repetition: int
) -> dict[str, Any]:
    """``run_case`` on a whole cluster (a fresh one if the last case left it broken). A case that
    fails outright is recorded with its reason and no figures, and the next case gets a fresh
    cluster."""
    fresh = not session.whole(parameters.whole_timeout_s)
    if fresh:
        session.replace()
    try:
        record = run_case(session, parameters, fault, role, repetition)
    except (ClusterError, KayosError, OSError) as exc:
        record = {"fault": fault, "role": role, "repetition": repetition, "node": None}
        record.update(dict.fromkeys(FIGURES))
        record["resume"] = record["failed"] = f"{type(exc).__name__}: {exc}"[:500]
        session.replace()
    record["fresh_cluster"] = fresh
    return record


def case_figures(
    producers: SharedProducers, fault_s: float, end_s: float, bound_s: float
) -> dict[str, Any]:
    """The case's timings and counts from its recorded calls."""
    calls = producers.recorded()
    threads = range(producers.count)
    resume = writes_resume_s(calls, fault_s, end_s)
    in_case = [call for call in calls if call.done_s <= end_s]
    return {
        "writes_resume_s": resume,
        "longest_gap_s": longest_gap_s(calls, fault_s, end_s, threads),
        "resume": None if resume is not None else f"did not resume within {bound_s} s",
        "case_s": round(end_s - fault_s, 3),
        "acks": sum(1 for call in in_case if call.ok),
        "errors": sum(1 for call in in_case if not call.ok),
        "error_kinds": dict(producers.error_kinds),
        "timeline": timeline(calls, fault_s, end_s),
    }


def timeline(calls: list[Call], fault_s: float, end_s: float) -> dict[str, Any]:
    """Acknowledgements and errors per ``BIN_S`` from ``TIMELINE_BEFORE_S`` before the fault to
    the case's end (the failover picture: the fault at ``from_fault_s`` after its start)."""
    start_s = fault_s - TIMELINE_BEFORE_S
    return {
        "bin_s": BIN_S,
        "from_fault_s": -TIMELINE_BEFORE_S,
        "acks": counts_per_bin((c.done_s for c in calls if c.ok), start_s, end_s),
        "errors": counts_per_bin((c.done_s for c in calls if not c.ok), start_s, end_s),
    }


def manager_json(cluster: LocalCluster, path: str) -> dict[str, Any]:
    """``path`` of the manager group's leader (``/v1/manager/status``, ``/changes``)."""
    leader = cluster.wait_manager_leader()
    assert leader is not None, "the bench's cluster has manager members"
    code, body = http_json(cluster.manager_url(leader) + path, timeout_s=5.0)
    if code != 200 or not isinstance(body, dict):
        raise ClusterError(f"the manager answered {path} with {code}: {body}")
    return body


def stall_phase(session: Session, parameters: FailoverBenchParameters, seed: int) -> dict[str, Any]:
    """Every node in turn stopped for ``stall_ms`` every ``stall_every_s`` with the producers
    running; the nodes the manager took out of a chain meanwhile (or within one detection window
    plus 1 s after) are ``false_removals``."""
    cluster, client = session.parts()
    status = manager_json(cluster, "/v1/manager/status")
    epoch = int(status["epoch"])
    chains = {int(s["id"]): list(s["chain"]) for s in status["view"]["shards"]}
    schedule = stall_schedule(
        seed, cluster.ids, parameters.stall_seconds, parameters.stall_ms / 1000,
        parameters.stall_every_s,
    )  # fmt: skip
    queue = "failover-stalls"
    start_seq = marker(client, queue, "start")
    producers = SharedProducers(
        session.producers_client(), queue, parameters.producers, parameters.value_bytes
    )
    producers.start()
    try:
        wait_until(producers.acked_by_every_thread, parameters.bound_s)
        began = time.monotonic()
        for at_s, node in schedule:
            time.sleep(max(0.0, began + at_s - time.monotonic()))  # the schedule itself
            stall(cluster, node, parameters.stall_ms / 1000)
        settle_s = parameters.stall_seconds + limits.manager_detection_window_ms / 1000 + 1.0
        time.sleep(max(0.0, began + settle_s - time.monotonic()))  # the phase's own length
        end_s = time.monotonic()
        changes = manager_json(cluster, "/v1/manager/changes")
    finally:
        stuck = producers.finish(PRODUCERS_JOIN_S)
    found = removals(chains, epoch, changes["changes"])
    calls = producers.recorded()
    figures: dict[str, Any] = {
        "stalls": len(schedule),
        "stall_ms": parameters.stall_ms,
        "false_removals": len(found),
        "removals": found,
        "epoch_before": epoch,
        "epoch_after": int(changes["epoch"]),
        "changes_dropped": changes.get("dropped", 0),
        "acks": sum(1 for call in calls if call.ok and call.done_s <= end_s),
        "errors": sum(1 for call in calls if not call.ok and call.done_s <= end_s),
        "longest_gap_s": longest_gap_s(calls, began, end_s, range(producers.count)),
        "producers_stuck": stuck,
    }
    if session.whole(parameters.whole_timeout_s):
        end_seq = marker(client, queue, "end")
        figures.update(read_back(client, queue, start_seq, end_seq, calls))
    else:
        figures.update(lost=None, duplicates=None)
    return figures


def stall(cluster: LocalCluster, node: str, seconds: float) -> None:
    """SIGSTOP ``node`` for ``seconds``, then SIGCONT."""
    pid = cluster.pid(node)
    if pid is None:
        raise ClusterError(f"node {node} is not running: nothing to stall")
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the stall itself, not a wait for a condition
    finally:
        os.kill(pid, signal.SIGCONT)


def bench_failover(
    parameters: FailoverBenchParameters,
    base: str | None = None,
    echo: Callable[[str], None] = lambda _line: None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Runs the matrix and the stall phase; returns every figure (docs/performance.md).
    ``phase`` is told what runs as it begins (a progress display)."""
    seed = parameters.seed
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    echo(f"bench failover: seed {seed} (--seed {seed} replays the stall schedule)")
    root = base or tempfile.mkdtemp(prefix="kayos-bench-failover-")
    session = Session(root, parameters.client)
    runs: list[dict[str, Any]] = []
    stalls: dict[str, Any] | None = None
    total = parameters.repeat * len(parameters.faults) * len(parameters.roles)
    try:
        phase("starting 3 nodes and 3 managers")
        session.open()
        for repetition in range(parameters.repeat):
            for fault in parameters.faults:
                for role in parameters.roles:
                    phase(f"case {len(runs) + 1}/{total}: {fault} {role} #{repetition + 1}")
                    record = guarded_case(session, parameters, fault, role, repetition)
                    runs.append(record)
                    echo(progress_line(record))
        if parameters.stall_seconds > 0:
            phase(f"stall phase ({parameters.stall_seconds:g} s)")
            if not session.whole(parameters.whole_timeout_s):
                session.replace()
            try:
                stalls = stall_phase(session, parameters, seed)
            except (ClusterError, KayosError, OSError) as exc:
                stalls = {"failed": f"{type(exc).__name__}: {exc}"[:500], "false_removals": None}
            failed = f" ({stalls['failed']})" if "failed" in stalls else ""
            echo(
                f"bench failover: stall phase: {stalls.get('stalls')} stalls, false_removals "
                f"{stalls['false_removals']}{failed}"
            )
    finally:
        session.close()
        if base is None:
            shutil.rmtree(root, ignore_errors=True)
    return summary(parameters, seed, runs, stalls)


def summary(
    parameters: FailoverBenchParameters,
    seed: int,
    runs: list[dict[str, Any]],
    stalls: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON: per fault and role over the repetitions, the stall phase, the targets."""
    cases = {
        fault: {
            role: case_summary([r for r in runs if r["fault"] == fault and r["role"] == role])
            for role in parameters.roles
        }
        for fault in parameters.faults
    }
    false_removals = None if stalls is None else stalls["false_removals"]
    return {
        "seed": seed,
        "cases": cases,
        "false_removals": false_removals,
        "stall": stalls,
        "targets": targets(cases, false_removals),
        "runs": runs,
        "parameters": asdict(parameters) | {"seed": seed},
        "machine": machine_facts(),
    }


def progress_line(record: dict[str, Any]) -> str:
    resume = record["writes_resume_s"]
    shown = f"writes resumed after {resume:.3f} s" if resume is not None else record["resume"]
    return (
        f"bench failover: {record['fault']} {record['role']} ({record['node']}) "
        f"#{record['repetition'] + 1}: {shown}, longest gap "
        f"{record['longest_gap_s']}, lost {record['lost']}, duplicates {record['duplicates']}, "
        f"errors {record['errors']}"
    )


def text_lines(result: dict[str, Any]) -> list[str]:
    """The figures as aligned lines (without --json)."""
    lines = [f"seed {result['seed']}"]
    lines.append(
        f"{'fault':8} {'role':7} {'resume median':>13} {'worst':>7} {'gap median':>10} "
        f"{'worst':>7} {'lost':>5} {'dups':>5} {'errors':>6}"
    )
    for fault, roles in result["cases"].items():
        for role, case in roles.items():
            resume, gap = case["writes_resume_s"], case["longest_gap_s"]
            lines.append(
                f"{fault:8} {role:7} {_shown(resume['median']):>13} {_shown(resume['worst']):>7} "
                f"{_shown(gap['median']):>10} {_shown(gap['worst']):>7} {case['lost']!s:>5} "
                f"{case['duplicates']!s:>5} {case['errors']!s:>6}"
            )
    lines.append(f"false_removals {result['false_removals']}")
    for name, verdict in result["targets"].items():
        lines.append(f"target {name}: {verdict['value']} ({verdict['target']}): {verdict['met']}")
    return lines


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
