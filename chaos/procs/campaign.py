"""A real-process fault campaign: a ``LocalCluster`` of ``kayos node`` processes, the workload of
``chaos.procs.workload`` throughout, the seeded faults of ``chaos.procs.faults`` one after another
for a bounded time, then heal, converge, drain and check (``chaos.checker``).

The report (``Report.to_json``) is what ``kayos chaos run --json`` prints; docs/testing.md says
how to read it.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import checker
from chaos.history import Event, Note, Produce, Recorder, dump_jsonl
from chaos.procs import drains, faults, guard, losses, membership, moves, netfaults
from chaos.procs.workload import Consumer, Producer, join_timeout_s
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.processes import ClusterError
from kayos.manager.member.config import Config as ManagerConfig
from kayos.storage.maintenance.check import check_store, data_file_of

# Convergence after the heal: every replica of every shard at the same seq. A restarted node
# catches up within seconds; this bound only trips if a chain never heals.
converge_timeout_s = 120.0
# The drain: each group reads until a finished snapshot reaches its shard's final seq.
drain_timeout_s = 120.0
# Load between two faults: the gap is drawn from this range (seconds) by the schedule's seed.
gap_s_min = 0.2
gap_s_max = 1.0
# Before the first fault the load runs alone this long, so there is something to lose.
warmup_s = 1.0
# The manager's bounds in a campaign: short, so that kills and pauses of a few seconds splice
# nodes out and their return rejoins them (chains change throughout the run). The window is
# below the links' silence bound here, so a paused node is spliced out while its links stand.
campaign_detection_window_ms = 2_000
campaign_suspect_after_ms = 1_000


@dataclass
class Config:
    seed: int
    fault_phase_s: float = 60.0
    faults_max: int | None = None
    nodes: int = 3
    shards: int = 3
    producers: int = 3
    groups_per_queue: int = 1
    kinds: tuple[str, ...] = faults.KINDS
    managers: int = 3
    gap_s: tuple[float, float] = (gap_s_min, gap_s_max)
    base_dir: Path | None = None
    # The cluster holds client credentials: the workload proves its own, and strangers also
    # knock with stolen-but-wrong ones (chaos/procs/guard.py, docs/security.md).
    credentials: bool = False
    # TLS on every port and link (docs/security.md): the workload and the probes connect inside
    # it with the cluster's client context.
    tls: bool = False
    history_path: Path | None = None
    echo: Callable[[str], None] = field(default=lambda _line: None)


@dataclass
class Report:
    seed: int
    duration_s: float = 0.0
    fault_phase_s: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    second_process: dict[str, int] = field(default_factory=dict)
    # move_under_fault's moves by how each ended (chaos/procs/moves.py), and the spare node.
    moves: dict[str, int] = field(default_factory=dict)
    # drain_under_fault's drains by how each ended, and the ends of the moves the drains and
    # rebalances made (chaos/procs/drains.py).
    drains: dict[str, int] = field(default_factory=dict)
    drain_moves: dict[str, int] = field(default_factory=dict)
    # lose_for_good's ends, and each completed one's seconds from the kill to full redundancy.
    losses: dict[str, int] = field(default_factory=dict)
    restore_s: list[float] = field(default_factory=list)
    spare: dict[str, Any] = field(default_factory=dict)
    hostile_requests: int = 0
    strangers_refused: int = 0
    # Requests strangers made with stolen-but-wrong credentials (every one must be refused).
    stolen_credential_tries: int = 0
    produce_calls: dict[str, int] = field(default_factory=dict)
    heads_seen: int = 0
    epoch_max: int = 0
    acked: int = 0
    lost: int = 0
    delivered: int = 0
    snapshots: int = 0
    unavailability_s: dict[str, float] = field(default_factory=dict)
    unavailability_by_kind_s: dict[str, float | None] = field(default_factory=dict)
    unavailability_alone_by_kind_s: dict[str, float | None] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)
    base_dir: str = ""
    history: str = ""
    # The cluster the kinds needed (chaos.procs.netfaults.make_cluster): LocalCluster,
    # ProxiedCluster (fault proxies) or NetnsCluster (network namespaces).
    network: str = "LocalCluster"
    # What the replay line needs beyond the seed (the kinds, managers and fault count when not
    # the CLI's defaults).
    replay_args: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "ok": self.ok,
            "duration_s": round(self.duration_s, 1),
            "fault_phase_s": round(self.fault_phase_s, 1),
            "faults_total": sum(self.faults.values()),
            "faults": self.faults,
            "second_process": self.second_process,
            **({"moves": self.moves, "spare": self.spare} if self.spare else {}),
            **({"drains": self.drains, "drain_moves": self.drain_moves} if self.drains else {}),
            **({"losses": self.losses, "restore_s": self.restore_s} if self.losses else {}),
            "hostile_requests": self.hostile_requests,
            "strangers_refused": self.strangers_refused,
            "stolen_credential_tries": self.stolen_credential_tries,
            "produce_calls": self.produce_calls,
            "heads_seen": self.heads_seen,
            "epoch_max": self.epoch_max,
            "acked": self.acked,
            "lost": self.lost,
            "delivered": self.delivered,
            "snapshots": self.snapshots,
            "longest_unavailability_s": self.unavailability_s,
            "longest_unavailability_by_kind_s": self.unavailability_by_kind_s,
            "longest_unavailability_alone_by_kind_s": self.unavailability_alone_by_kind_s,
            "violations": self.violations,
            "base_dir": self.base_dir,
            "history": self.history,
            "replay": f"kayos chaos run --seed {self.seed}{self.replay_args}",
            "network": self.network,
        }


def queues_one_per_shard(cluster: LocalCluster, prefix: str = "chaos") -> dict[int, str]:
    """A queue name for each shard (``prefix-N`` names, hashed as the client hashes them)."""
    found: dict[int, str] = {}
    for number in range(10_000):
        queue = f"{prefix}-{number}"
        found.setdefault(cluster.topology.shard_for(queue), queue)
        if len(found) == len(cluster.topology.shards):
            return dict(sorted(found.items()))
    raise AssertionError("no queue name found for some shard")


def longest_gaps(
    produces: list[Produce], shard_of: dict[str, int], start_s: float, end_s: float
) -> dict[str, float]:
    """Per shard: the longest stretch of the fault phase with no acks=all produce acknowledged
    (each gap ends at an acknowledgement; the phase's start and end close the first and last)."""
    times: dict[int, list[float]] = {shard: [start_s, end_s] for shard in set(shard_of.values())}
    for produce in produces:
        if produce.outcome == "ok" and start_s <= produce.at_s <= end_s:
            times[shard_of[produce.queue]].append(produce.at_s)
    gaps = {}
    for shard, points in sorted(times.items()):
        points.sort()
        gaps[str(shard)] = round(max(b - a for a, b in itertools.pairwise(points)), 2)
    return gaps


@dataclass(frozen=True)
class FaultSpan:
    """One fault as the history has it: from its ``fault`` note to its ``fault done`` note;
    ``whole``: every shard's chain was as long as at the start when it began (a history from
    before the note said so counts as whole)."""

    kind: str
    start_s: float
    end_s: float
    whole: bool = True


def chains_whole(cluster: LocalCluster) -> bool:
    """Whether every shard's chain, in the newest topology a running node holds, is as long as
    the launcher made it: no member spliced out, catching up or rejoining."""
    try:
        live = cluster.live_topology()
    except (OSError, KayosError):
        return False
    return all(
        shard_id in live.shards and len(live.shards[shard_id].chain) == len(shard.chain)
        for shard_id, shard in cluster.topology.shards.items()
    )


def fault_spans(events: list[Event]) -> list[FaultSpan]:
    """The faults of a history in the order they began; a fault with no ``fault done`` note (a
    run that broke off) ends where it began."""
    began: dict[int, tuple[str, float, bool]] = {}
    ended: dict[int, float] = {}
    for event in events:
        if isinstance(event, Note) and event.what == "fault":
            whole = bool(event.detail.get("whole", True))
            began[int(event.detail["index"])] = (str(event.detail["kind"]), event.at_s, whole)
        elif isinstance(event, Note) and event.what == "fault done":
            ended[int(event.detail["index"])] = event.at_s
    spans = [
        FaultSpan(kind, at_s, ended.get(index, at_s), whole)
        for index, (kind, at_s, whole) in began.items()
    ]
    return sorted(spans, key=lambda span: span.start_s)


def longest_gaps_by_kind(
    produces: list[Produce],
    shard_of: dict[str, int],
    spans: list[FaultSpan],
    start_s: float,
    end_s: float,
    *,
    alone: bool = False,
) -> dict[str, float | None]:
    """Per fault kind: the longest stretch with no acks=all produce acknowledged on a shard that
    is charged to a fault of that kind (docs/testing.md, "Reading a report"). The stretches are
    ``longest_gaps``' (on one shard, from one acknowledgement to the next, the phase's start and
    end closing the first and last). Each is charged to the fault in progress when it began, else
    to the last fault that began before it ended (the one writes were waiting out); one that
    ended before any fault began is charged to none. None for a kind charged nothing.
    ``alone``: only stretches charged to a fault that began on whole chains (``chains_whole``)
    and that no other fault was in progress in, or in the ``ALONE_MARGIN_S`` before (what a fault
    leaves behind, a killed node rejoining, outlasts its span): what one fault costs by itself."""
    times: dict[int, list[float]] = {shard: [start_s, end_s] for shard in set(shard_of.values())}
    for produce in produces:
        if produce.outcome == "ok" and start_s <= produce.at_s <= end_s:
            times[shard_of[produce.queue]].append(produce.at_s)
    longest: dict[str, float | None] = dict.fromkeys(sorted({span.kind for span in spans}))
    for points in times.values():
        points.sort()
        for before, after in itertools.pairwise(points):
            span = charged_fault(spans, before, after)
            if alone and span is not None:
                others = touching(spans, before - ALONE_MARGIN_S, after)
                if not span.whole or any(other is not span for other in others):
                    continue
            if span is not None:
                longest[span.kind] = round(max(longest[span.kind] or 0.0, after - before), 2)
    return longest


# A stretch counts as one fault's alone only if no other fault was in progress this long before
# it began (``longest_gaps_by_kind``): a node killed or paused rejoins within about a second of
# its span's end.
ALONE_MARGIN_S = 1.0


def touching(spans: list[FaultSpan], began_s: float, ended_s: float) -> list[FaultSpan]:
    """The faults in progress at some moment from ``began_s`` to ``ended_s``."""
    return [s for s in spans if s.start_s <= ended_s and s.end_s >= began_s]


def charged_fault(spans: list[FaultSpan], began_s: float, ended_s: float) -> FaultSpan | None:
    """The fault a stretch from ``began_s`` to ``ended_s`` is charged to (``spans`` in the order
    they began): the one in progress at ``began_s``, else the last to begin before ``ended_s``."""
    in_progress = [s for s in spans if s.start_s <= began_s <= s.end_s]
    if in_progress:
        return in_progress[-1]
    begun = [s for s in spans if s.start_s < ended_s]
    return begun[-1] if begun else None


def check_stores(cluster: LocalCluster) -> list[dict[str, Any]]:
    """``kayos check`` of every store of every (stopped) node: a sound file is part of the
    promise too, whatever the consumers happened to read."""
    found = []
    for node in cluster.ids:
        shards = cluster.data_dir(node) / "shards"
        for store in sorted(shards.iterdir()) if shards.is_dir() else []:
            try:
                data_file_of(str(store))
            except FileNotFoundError:
                # A learner stopped mid-snapshot (a move's target killed while it copied) leaves
                # its directory without a store file (kayos/node/replicas/learners.py): nothing
                # to check.
                continue
            report = check_store(str(store))
            if not report.ok:
                found.append(
                    {
                        "property": "store",
                        "message": f"node {node} shard {store.name}: {report.problem}",
                        "detail": {"path": report.path, "offset": report.offset},
                    }
                )
    return found


def replay_args(config: Config) -> str:
    """The ``kayos chaos run`` options beyond ``--seed`` that replay ``config``'s schedule."""
    args = "" if config.faults_max is None else f" --faults {config.faults_max}"
    if config.kinds != faults.KINDS:
        args += f" --kinds {','.join(config.kinds)}"
    if config.managers != Config.managers:
        args += f" --managers {config.managers}"
    return args


def run(config: Config) -> Report:
    """Runs one campaign; the cluster is stopped whatever happens."""
    began = time.monotonic()
    report = Report(config.seed, replay_args=replay_args(config))
    base = config.base_dir or Path(tempfile.mkdtemp(prefix=f"kayos-chaos-{config.seed}-"))
    report.base_dir = str(base)
    cluster = _start_cluster(config, base, report)
    try:
        credentials = guard.enable_credentials(cluster, base) if config.credentials else None
    except BaseException:
        cluster.stop()
        raise
    with guard.credentials_in_env(credentials):
        return _run(config, report, base, began, cluster)


def _run(config: Config, report: Report, base: Path, began: float, cluster: LocalCluster) -> Report:
    """The campaign on its started cluster: load, faults, heal, drain, check; the cluster is
    wound down whatever happens."""
    recorder = Recorder()
    producers: list[Producer] = []
    consumers: list[Consumer] = []
    monitor = membership.HeadMonitor(cluster)
    monitor.start()
    try:
        queues = queues_one_per_shard(cluster)
        shard_of = {queue: shard for shard, queue in queues.items()}
        recorder.note("topology", queues=shard_of, chains=cluster.describe())
        seeds = list(cluster.urls.values())
        producers = [
            Producer(n, seeds, list(queues.values()), recorder, config.seed)
            for n in range(config.producers)
        ]
        consumers = [
            Consumer(queue, f"g{g}", seeds, recorder)
            for queue in queues.values()
            for g in range(config.groups_per_queue)
        ]
        for worker in [*producers, *consumers]:
            worker.start()
        time.sleep(warmup_s)  # load alone before the first fault; not a synchronisation
        phase_start = recorder.now_s()
        _fault_phase(cluster, config, recorder, report)
        phase_end = recorder.now_s()
        report.fault_phase_s = phase_end - phase_start
        _heal(cluster, recorder, config)
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join(join_timeout_s)
        _converge_and_drain(cluster, config, recorder, consumers, shard_of, report)
        events = recorder.snapshot_of_events()
        # Written before the check as well as after it: a long campaign's history is hours of
        # work, and a check that does not finish (or a box that restarts) must not lose it.
        dump_jsonl(events, config.history_path or base / "history.jsonl")
        _judge(events, shard_of, (phase_start, phase_end), report)
    finally:
        _wind_down(cluster, monitor, [*producers, *consumers], report)
        history = config.history_path or base / "history.jsonl"
        dump_jsonl(recorder.snapshot_of_events(), history)
        report.history = str(history)
        report.duration_s = time.monotonic() - began
    return report


def restore_config(kinds: tuple[str, ...]) -> dict[str, int]:
    """The manager's grace before it restores redundancy: short when the campaign loses nodes
    for good (chaos/procs/losses.py), else the default (longer than any other fault's down
    time, so no other kind triggers a copy)."""
    if losses.KINDS & set(kinds):
        return {"replace_after_ms": losses.campaign_replace_after_ms}
    return {}


def _start_cluster(config: Config, base: Path, report: Report) -> LocalCluster:
    """The campaign's cluster, started (with a spare node when a kind moves shards to one);
    stopped again if it does not start."""
    cluster = netfaults.make_cluster(
        config.kinds,
        base,
        nodes=config.nodes,
        replicas=config.nodes,
        shards=config.shards,
        managers=config.managers,
        tls=config.tls,
        manager_config=ManagerConfig(
            detection_window_ms=campaign_detection_window_ms,
            suspect_after_ms=campaign_suspect_after_ms,
            **restore_config(config.kinds),
        ),
    )
    report.network = type(cluster).__name__
    try:
        cluster.start_all()
        if config.managers and faults.SPARE_KINDS & set(config.kinds):
            report.spare = moves.add_spare(cluster)
    except BaseException:
        cluster.stop()
        netfaults.close(cluster)
        raise
    return cluster


def _converge_and_drain(
    cluster: LocalCluster,
    config: Config,
    recorder: Recorder,
    consumers: list[Consumer],
    shard_of: dict[str, int],
    report: Report,
) -> None:
    """After the heal: every replica of every shard at the same seq (else a ``converge``
    violation), then every group reads to its shard's final seq."""
    try:
        if config.managers:
            final = membership.wait_converged(cluster, converge_timeout_s)
        else:
            final = cluster.wait_replicated(converge_timeout_s)
    except ClusterError as error:
        report.violations.append(
            {
                "property": "converge",
                "message": str(error)[:300],
                "detail": {
                    "manager": membership.manager_view(cluster),
                    "nodes": {node: cluster.status(node) for node in cluster.ids},
                },
            }
        )
    else:
        recorder.note("converged", seqs=final)
        _drain(consumers, {queue: final[shard] for queue, shard in shard_of.items()}, report)


def _judge(
    events: list[Event], shard_of: dict[str, int], phase: tuple[float, float], report: Report
) -> None:
    """The checker's verdict on the history, and the produce outcomes and longest gaps of the
    fault phase ``phase`` (start and end on the recorder's clock)."""
    verdict = checker.check(events)
    report.violations += [violation.to_json() for violation in verdict.violations]
    report.acked = verdict.acked_versions
    report.lost = verdict.lost_versions
    report.delivered = verdict.delivered_messages
    report.snapshots = verdict.snapshots
    produces = [event for event in events if isinstance(event, Produce)]
    report.produce_calls = dict(Counter(produce.outcome for produce in produces))
    report.unavailability_s = longest_gaps(produces, shard_of, *phase)
    spans = fault_spans(events)
    report.unavailability_by_kind_s = longest_gaps_by_kind(produces, shard_of, spans, *phase)
    report.unavailability_alone_by_kind_s = longest_gaps_by_kind(
        produces, shard_of, spans, *phase, alone=True
    )


def _wind_down(
    cluster: LocalCluster,
    monitor: membership.HeadMonitor,
    workers: list[Producer | Consumer],
    report: Report,
) -> None:
    """Stops the head monitor (its findings go in the report), the workload and the cluster,
    then checks every store the cluster leaves."""
    monitor.stop.set()
    monitor.join(join_timeout_s)
    report.violations += monitor.violations
    report.heads_seen = len(monitor.heads)
    report.epoch_max = max((epoch for _shard, epoch in monitor.heads), default=0)
    for worker in workers:
        worker.stop.set()
    cluster.stop()
    netfaults.close(cluster)
    for worker in workers:
        worker.join(join_timeout_s)
    report.violations += check_stores(cluster)


def _fault_phase(cluster: LocalCluster, config: Config, recorder: Recorder, report: Report) -> None:
    rng = random.Random(f"{config.seed}-gaps")
    deadline = time.monotonic() + config.fault_phase_s
    kinds: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    moved: Counter[str] = Counter()
    drained: Counter[str] = Counter()
    drain_moves: Counter[str] = Counter()
    kinds_drawn = tuple(k for k in config.kinds if config.managers or k not in faults.MANAGER_KINDS)
    for fault in faults.schedule(config.seed, cluster.ids, kinds_drawn):
        if time.monotonic() >= deadline or (
            config.faults_max is not None and fault.index >= config.faults_max
        ):
            break
        time.sleep(rng.uniform(*config.gap_s))  # load between faults; not a sync
        config.echo(f"fault {fault.index}: {fault.kind} {fault.node} {fault.hold_s}s")
        recorder.note("fault", **fault.to_json(), whole=chains_whole(cluster))
        try:
            _restart_missing(cluster, recorder)
            result = faults.inject(cluster, fault)
        except (ClusterError, OSError, AssertionError, KeyError) as error:
            result = {"unexpected": [f"{fault.kind} on {fault.node} failed: {error}"]}
        recorder.note("fault done", index=fault.index, **result)
        kinds[fault.kind] += 1
        if fault.kind == "second_process" and "outcome" in result:
            outcomes[str(result["outcome"])] += 1
        if fault.kind in moves.KINDS:
            moved[str(result.get("move", "failed"))] += 1
        if fault.kind in drains.KINDS:
            drained[str(result.get("drain", "failed"))] += 1
            drain_moves.update(result.get("moves", {}))
            rebalanced = result.get("rebalance", {}).items()
            drain_moves.update({f"rebalance_{k}": n for k, n in rebalanced if isinstance(n, int)})
        if fault.kind in losses.KINDS:
            report.losses[str(result.get("restore", "failed"))] = (
                report.losses.get(str(result.get("restore", "failed")), 0) + 1
            )
            if "kill_to_full_redundancy_s" in result:
                report.restore_s.append(float(result["kill_to_full_redundancy_s"]))
        report.hostile_requests += int(result.get("requests", 0))
        report.strangers_refused += int(bool(result.get("refused", False)))
        report.stolen_credential_tries += int(result.get("stolen_tries", 0))
        for what in result.get("unexpected", []):
            report.violations.append(
                {"property": "fault", "message": what, "detail": fault.to_json()}
            )
        died = cluster.exited()
        for node, code in died.items():
            report.violations.append(
                {
                    "property": "fault",
                    "message": f"node {node} exited by itself ({code})",
                    "detail": {"log": str(cluster.log_path(node))},
                }
            )
            cluster.processes.pop(node, None)
    report.faults = dict(sorted(kinds.items()))
    report.second_process = dict(sorted(outcomes.items()))
    report.moves = dict(sorted(moved.items()))
    report.drains = dict(sorted(drained.items()))
    report.drain_moves = dict(sorted(drain_moves.items()))


def _restart_missing(cluster: LocalCluster, recorder: Recorder) -> None:
    """Starts any process a fault that failed half-way left stopped (its failure is already a
    violation), so the next fault finds the cluster whole."""
    for member in cluster.members():
        if not cluster.running(member):
            recorder.note("restart missing", node=member)
            cluster.processes.pop(member, None)
            cluster.start(member)


def _heal(cluster: LocalCluster, recorder: Recorder, config: Config) -> None:
    """Every node up (a fault always restarts what it stopped; a node that died is restarted)."""
    for node in cluster.members():
        if not cluster.running(node):
            config.echo(f"heal: starting {node}")
            cluster.start(node)
    recorder.note("healed")


def _drain(consumers: list[Consumer], final: dict[str, int], report: Report) -> None:
    for consumer in consumers:
        consumer.drain_to = final[consumer.queue]
    deadline = time.monotonic() + drain_timeout_s
    for consumer in consumers:
        if not consumer.drained.wait(max(0.0, deadline - time.monotonic())):
            report.violations.append(
                {
                    "property": "drain",
                    "message": f"{consumer.name} did not reach seq "
                    f"{final[consumer.queue]} within {drain_timeout_s}s",
                    "detail": {},
                }
            )


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)
