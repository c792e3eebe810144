"""``kayos bench``: the benchmarks' commands (kayos/bench/ does the work; each is imported when
its command runs). Each prints comparable figures, as aligned lines or as JSON, and can write the
JSON to a file."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from kayos.cli.address import CREDENTIALS_ENV, credentials_option, deprecated_option
from kayos.cli.bench_support import (
    bench_report,
    draw,
    load_options,
    parameters_of,
    plot_option,
    run_bench,
)
from kayos.cli.progress import Progress, wanted


@click.group()
def bench() -> None:
    """Benchmarks that print comparable figures and write JSON."""


@bench.command("storage")
@click.option("--messages", default=1_000_000, show_default=True, help="Messages to commit.")
@click.option("--per-commit", default=1000, show_default=True, help="Messages per commit.")
@click.option("--seed", default=1, show_default=True, help="Workload seed.")
@click.option("--no-lmdb", is_flag=True, help="Skip the lmdb baseline.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the files.")
@plot_option
def bench_storage_command(
    messages: int,
    per_commit: int,
    seed: int,
    no_lmdb: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """The shard store vs lmdb (sync on, key + seq index) on one workload."""
    from kayos.bench.storage import bench_storage

    result = run_bench(
        "storage",
        as_json,
        lambda phase: bench_storage(
            messages, per_commit, seed, base, with_lmdb=not no_lmdb, phase=phase
        ),
    )
    bench_report(result, as_json, out, skip=("workload",))
    draw("storage", result, plot)


@bench.command("retention")
@click.option("--budget-bytes", type=int, help="Disk budget per node.  [default: 64 MiB]")
@click.option("--volume-factor", type=int, help="Payload produced, in budgets.  [default: 10]")
@click.option("--value-bytes", type=int, help="Bytes per value.  [default: 1000]")
@click.option("--deadline-s", type=float, help="Stop after this long.  [default: 900]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@plot_option
def bench_retention_command(
    budget_bytes: int | None,
    volume_factor: int | None,
    value_bytes: int | None,
    deadline_s: float | None,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """The retention soak: a queue with until_consumed and a consumer keeping up; produces
    volume-factor x budget and reports each node's disk use against the budget."""
    from kayos.bench.retention import RetentionSoakParameters, bench_retention

    given: dict[str, Any] = {
        "budget_bytes": budget_bytes,
        "volume_factor": volume_factor,
        "value_bytes": value_bytes,
        "deadline_s": deadline_s,
    }
    parameters = parameters_of(RetentionSoakParameters, given)
    result = run_bench("retention", as_json, lambda phase: bench_retention(parameters, base, phase))
    bench_report(result, as_json, out, skip=("machine", "parameters", "disk_series"))
    draw("retention", result, plot)
    if not result["within_budget"] or result["consumed"] != result["messages"]:
        sys.exit(1)


@bench.command("produce")
@click.option("--messages", type=int, help="Messages to produce.  [default: 300000]")
@click.option("--batch", type=int, help="Messages per produce call.  [default: 100]")
@click.option("--in-flight", type=int, help="Batches outstanding at once.  [default: 128]")
@click.option("--replicas", type=int, help="Nodes in the shard's chain.  [default: 3]")
@click.option("--singles", type=int, help="One-message acks=all samples.  [default: 2000]")
@click.option(
    "--queue-shards",
    type=int,
    help="Also produce to a queue over this many shards and report the ratio.  [default: 1]",
)
@click.option(
    "--nodes", type=int, help="Node processes (more than --replicas spread the shards' chains)."
)
@click.option(
    "--tls", is_flag=True, help="TLS on every port and link, with a private CA (docs/security.md)."
)
@credentials_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@plot_option
def bench_produce_command(
    messages: int | None,
    batch: int | None,
    in_flight: int | None,
    replicas: int | None,
    singles: int | None,
    queue_shards: int | None,
    nodes: int | None,
    tls: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """A local chain of node processes: produce with acks=all through the client, then consume.
    With --credentials the cluster holds that credential and the client proves it."""
    from kayos.bench.produce import ProduceBenchParameters, bench_produce

    # Options left out keep the defaults of ProduceBenchParameters (the one place they live).
    given = {
        "messages": messages,
        "batch": batch,
        "in_flight": in_flight,
        "replicas": replicas,
        "singles": singles,
        "queue_shards": queue_shards,
        "nodes": nodes,
        "tls": tls or None,
        # --credentials (or KAYOS_CREDENTIALS, which the option sets): the file's credential.
        "credentials": os.environ.get(CREDENTIALS_ENV) or None,
    }
    parameters = parameters_of(ProduceBenchParameters, given)
    result = run_bench("produce", as_json, lambda phase: bench_produce(parameters, base, phase))
    bench_report(result, as_json, out, skip=("series",))
    draw("produce", result, plot)


@bench.command("failover")
@click.option(
    "--kinds",
    "faults",
    default="kill9,sigstop",
    show_default=True,
    help="Fault kinds, comma-separated.",
)
@click.option(
    "--roles", default="head,middle,tail", show_default=True, help="Roles struck, comma-separated."
)
@click.option("--repeat", type=int, help="Repetitions of each fault x role.  [default: 5]")
@click.option("--producers", type=int, help="Producer threads sharing one client.  [default: 4]")
@click.option(
    "--restart", is_flag=True, help="Start a killed node again as kayos up's supervisor would."
)
@click.option(
    "--client",
    "client_kind",
    type=click.Choice(["sync", "async"]),
    default="sync",
    show_default=True,
    help="The producers' shared client: threads sharing one kayos.Client, or calls in flight as "
    "tasks of one kayos.AsyncClient.",
)
@click.option(
    "--exit-report/--no-exit-report",
    default=True,
    show_default=True,
    help="kill9 without --restart: report the killed node's exit to the managers, as a "
    "supervisor that does not restart it would (else the manager has only its own probe).",
)
@click.option(
    "--bound-s",
    type=float,
    help="A case not resumed this long after the fault is recorded null.  [default: 10]",
)
@click.option("--margin-s", type=float, help="The case runs on after resuming.  [default: 1]")
@click.option("--stall-seconds", type=float, help="The stall phase (0: none).  [default: 30]")
@click.option("--seed", type=int, default=None, help="The stall schedule's seed (else drawn).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the clusters.")
@plot_option
def bench_failover_command(
    faults: str,
    roles: str,
    repeat: int | None,
    producers: int | None,
    restart: bool,
    client_kind: str,
    exit_report: bool,
    bound_s: float | None,
    margin_s: float | None,
    stall_seconds: float | None,
    seed: int | None,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """3 nodes + 3 managers: kill -9 and SIGSTOP of each role as connected acks=all producers
    see them (writes_resume_s, longest_gap_s, lost, duplicates), and false_removals under
    300 ms stalls.

    The catch-up figures (catchup_mb_per_s, disk_seq_write_mb_per_s, produce_drop_during_catchup,
    copy_mode, copy_cpu_s_per_gb) are `kayos bench heal`'s, which ran under this name before."""
    from kayos.bench.membership.failover import (
        FailoverBenchParameters,
        bench_failover,
        text_lines,
    )

    given: dict[str, Any] = {
        "faults": tuple(part.strip() for part in faults.split(",") if part.strip()),
        "roles": tuple(part.strip() for part in roles.split(",") if part.strip()),
        "repeat": repeat,
        "producers": producers,
        "restart": restart or None,
        "exit_report": exit_report,
        "client": client_kind,
        "bound_s": bound_s,
        "margin_s": margin_s,
        "stall_seconds": stall_seconds,
        "seed": seed,
    }
    parameters = parameters_of(FailoverBenchParameters, given)
    total = parameters.repeat * len(parameters.faults) * len(parameters.roles)
    with Progress("bench failover", enabled=wanted(as_json), total=total) as shown:

        def echo(line: str) -> None:
            shown.line(line)
            if line.startswith("bench failover: ") and "#" in line:  # a case's line
                shown.advance()

        result = bench_failover(parameters, base, echo=echo, phase=shown.phase)
    bench_report(result, as_json, out, lines=text_lines(result))
    draw("failover", result, plot)


@bench.command("heal")
@click.option(
    "--shard-mb", type=int, help="Size of the shard a returning node copies.  [default: 1024]"
)
@click.option(
    "--detection-window-ms", type=int, help="The manager's detection window.  [default: limits]"
)
@click.option("--slow-window-ms", type=int, help="The manager's slow window.  [default: limits]")
@click.option(
    "--repeat", type=int, help="Runs, each on a fresh cluster: median and range.  [default: 1]"
)
@load_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@plot_option
def bench_heal_command(
    shard_mb: int | None,
    detection_window_ms: int | None,
    slow_window_ms: int | None,
    repeat: int | None,
    produce_rate: float | None,
    both_loads: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """3 nodes + 3 managers, acks=all producers throughout: dead and slow node removal, catch-up
    (catchup_mb_per_s, disk_seq_write_mb_per_s, produce_drop_during_catchup, copy_mode,
    copy_cpu_s_per_gb)."""
    from kayos.bench.membership.heal import HealBenchParameters, bench_heal

    given: dict[str, Any] = {
        "shard_mb": shard_mb,
        "detection_window_ms": detection_window_ms,
        "slow_window_ms": slow_window_ms,
        "repeat": repeat,
        "produce_rate": produce_rate,
        "both_loads": both_loads or None,
    }
    parameters = parameters_of(HealBenchParameters, given)
    result = run_bench("heal", as_json, lambda phase: bench_heal(parameters, base, phase))
    bench_report(result, as_json, out, skip=("runs", "machine"))
    draw("heal", result, plot)


@bench.command("grow")
@click.option("--shard-mb", type=int, help="Each of the 3 shards filled to this.  [default: 64]")
@click.option("--producers", type=int, help="acks=all producer threads.  [default: 4]")
@click.option("--baseline-s", type=float, help="Produce alone before the move.  [default: 10]")
@load_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@plot_option
def bench_grow_command(
    shard_mb: int | None,
    producers: int | None,
    baseline_s: float | None,
    produce_rate: float | None,
    both_loads: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """3 loaded nodes + 3 managers: add a 4th and rebalance; produce rate before/during, bytes."""
    from kayos.bench.membership.grow import GrowBenchParameters, bench_grow

    given: dict[str, Any] = {"shard_mb": shard_mb, "producers": producers}
    given["baseline_s"] = baseline_s
    given["produce_rate"] = produce_rate
    given["both_loads"] = both_loads or None
    parameters = parameters_of(GrowBenchParameters, given)
    result = run_bench("grow", as_json, lambda phase: bench_grow(parameters, base, phase))
    bench_report(result, as_json, out, skip=("machine", "grow_series"))
    draw("grow", result, plot)


@bench.command("restore")
@click.option("--shard-mb", type=int, help="Each of the 4 shards filled to this.  [default: 64]")
@click.option("--producers", type=int, help="acks=all producer threads.  [default: 4]")
@click.option(
    "--grace-s",
    type=float,
    help="The manager's replace_after_ms, in seconds: how long a shard stays short before it "
    "is copied to another node.  [default: 10]",
)
@click.option("--baseline-s", type=float, help="Produce alone before the kill.  [default: 10]")
@click.option(
    "--produce-rate",
    type=float,
    help="Open-loop producers offering this many msgs/s (drop = achieved / offered).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@plot_option
def bench_restore_command(
    shard_mb: int | None,
    producers: int | None,
    grace_s: float | None,
    baseline_s: float | None,
    produce_rate: float | None,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """4 loaded nodes + 3 managers: kill one for good; grace, copy time, kill to full redundancy."""
    from kayos.bench.membership.restore import RestoreBenchParameters, bench_restore

    given: dict[str, Any] = {"shard_mb": shard_mb, "producers": producers, "grace_s": grace_s}
    given |= {"baseline_s": baseline_s, "produce_rate": produce_rate}
    parameters = parameters_of(RestoreBenchParameters, given)
    result = run_bench("restore", as_json, lambda phase: bench_restore(parameters, base, phase))
    bench_report(result, as_json, out, skip=("machine",))
    draw("restore", result, plot)


@bench.command("spark")
@click.option("--rows", type=int, help="Messages to write and read.  [default: 1000000]")
@click.option("--value-bytes", type=int, help="Bytes per value.  [default: 100]")
@click.option("--min-partitions", type=int, help="Spark partitions per read.  [default: 2]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
@plot_option
def bench_spark_command(
    rows: int | None,
    value_bytes: int | None,
    min_partitions: int | None,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """The Spark source (local[2]) against the plain client on a local chain (needs kayos[spark]
    and java): batch write, batch read, availableNow stream read, client read."""
    from kayos.bench.spark import SparkBenchParameters, bench_spark

    given = {"rows": rows, "value_bytes": value_bytes, "min_partitions": min_partitions}
    parameters = parameters_of(SparkBenchParameters, given)
    result = run_bench("spark", as_json, lambda phase: bench_spark(parameters, base, phase))
    bench_report(result, as_json, out)
    draw("spark", result, plot)


@bench.command("kestrel")
@click.option("--clients", default="1,16", show_default=True, help="Client counts, one run each.")
@click.option("--ops", default=20_000, show_default=True, help="Operations per scenario.")
@click.option(
    "--cluster-ops", default=5_000, show_default=True, help="Operations per cluster scenario."
)
@click.option(
    "--local-cluster/--memory",
    "cluster",
    default=False,
    help="Also run the front on a local 3-node chain it starts (default: the memory backend only).",
)
@deprecated_option("--cluster", "old_cluster", is_flag=True, replacement="--local-cluster")
@click.option("--memcached", default=None, metavar="HOST:PORT", help="memcached to compare with.")
@click.option(
    "--workers",
    type=click.Choice(["threads", "processes"]),
    default="threads",
    show_default=True,
    help="What runs each client.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put logs, nodes.")
@plot_option
def bench_kestrel_command(
    clients: str,
    ops: int,
    cluster_ops: int,
    cluster: bool,
    old_cluster: bool,
    memcached: str | None,
    workers: str,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """The Kestrel memcache front under python-memcached clients: set and get/open/close rates,
    against memcached's when one is on PATH or given."""
    from kayos.bench.kestrel.front import KestrelBenchParameters, bench_kestrel

    cluster = cluster or old_cluster
    try:
        counts = tuple(int(count) for count in clients.split(","))
        parameters = KestrelBenchParameters(
            counts, ops, cluster_ops, cluster=cluster, memcached=memcached, workers=workers
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    result = run_bench("kestrel", as_json, lambda phase: bench_kestrel(parameters, base, phase))
    bench_report(result, as_json, out)
    draw("kestrel", result, plot)


@bench.command("scale")
@click.option(
    "--node-cpu",
    type=float,
    help="Each node's CPU cap in cores (a cgroup's quota over its period).  [default: 0.15]",
)
@click.option("--seconds", type=float, help="Timed window of each case.  [default: 10]")
@click.option(
    "--repeat", type=int, help="Repetitions of each case's window, alternating.  [default: 2]"
)
@click.option("--warmup-s", type=float, help="Produce this long before timing.  [default: 3]")
@click.option("--batch", type=int, help="Messages per produce call, per shard.  [default: 100]")
@click.option("--in-flight", type=int, help="Calls outstanding per shard.  [default: 64]")
@click.option("--value-bytes", type=int, help="Bytes per value.  [default: 100]")
@click.option(
    "--cases",
    default="6n-1s,6n-2s,3n-1s,3n-3s",
    show_default=True,
    help="Cases to run, comma-separated (nodes n, shards s of the queue).",
)
@click.option(
    "--cpu-weight",
    type=int,
    help="The bench's cgroup's CPU weight against other processes, in busy processes' worth "
    "(1: none above theirs).  [default: 16]",
)
@click.option(
    "--cgroup-root",
    type=click.Path(file_okay=False),
    default="/sys/fs/cgroup",
    show_default=True,
    help="Where the cgroup hierarchies are mounted (cgroup v1's cpu, or v2's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the clusters.")
@plot_option
def bench_scale_command(
    node_cpu: float | None,
    seconds: float | None,
    repeat: int | None,
    warmup_s: float | None,
    batch: int | None,
    in_flight: int | None,
    value_bytes: int | None,
    cases: str,
    cpu_weight: int | None,
    cgroup_root: str,
    as_json: bool,
    out: str | None,
    base: str | None,
    plot: str | None,
) -> None:
    """Scale-out on this machine: node processes capped by cgroups, acks=all throughput of one
    queue over one shard and over several (6 nodes: 1 and 2 shards of 3; 3 nodes: 1 and 3
    rotated shards), CPU per message by role, and the capacity model's predictions. Needs root
    (a writable cgroup cpu controller); exits 2 where there is none."""
    from kayos.bench.scale.cgroups import CgroupUnavailable
    from kayos.bench.scale.run import ScaleBenchParameters, bench_scale, text_lines

    given: dict[str, Any] = {
        "node_cpu": node_cpu,
        "seconds": seconds,
        "repeat": repeat,
        "warmup_s": warmup_s,
        "batch": batch,
        "in_flight": in_flight,
        "value_bytes": value_bytes,
        "cases": tuple(part.strip() for part in cases.split(",") if part.strip()),
        "weight": cpu_weight,
    }
    parameters = parameters_of(ScaleBenchParameters, given)
    try:
        result = run_bench(
            "scale",
            as_json,
            lambda phase: bench_scale(parameters, base, phase, cgroup_root),
        )
    except CgroupUnavailable as exc:
        click.echo(f"bench scale: {exc}", err=True)
        sys.exit(2)
    bench_report(result, as_json, out, lines=text_lines(result))
    draw("scale", result, plot)
