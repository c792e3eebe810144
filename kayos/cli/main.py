"""The ``kayos`` command line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from chaos.cli import chaos
from kayos import __version__
from kayos.cli.ctl import ctl
from kayos.cli.data import consume, produce
from kestrel_compat.cli import kestrel
from kestrel_compat.migration.cli import import_kestrel


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kayos")
def cli() -> None:
    """Kayos: a fault-tolerant, durable, de-duplicating message queue cluster."""


@cli.command()
@click.argument("path", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(path: str, as_json: bool) -> None:
    """Verify a shard store offline (CRCs, tree order, counts, index agreement).

    Exits 0 when the store is sound; 1 with the offset of the first problem otherwise."""
    from kayos.storage.maintenance.check import check_store

    report = check_store(path)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "path": report.path,
                    "ok": report.ok,
                    "offset": report.offset,
                    "problem": report.problem,
                    "headers": report.headers,
                    "nodes": report.nodes,
                    "entries": report.entries,
                    "last_seq": report.last_seq,
                    "notes": report.notes,
                }
            )
        )
    elif report.ok:
        click.echo(
            f"OK {report.path}: last seq {report.last_seq}, {report.entries} entries, "
            f"{report.nodes} nodes, {report.headers} headers"
        )
        for note in report.notes:
            click.echo(f"  note: {note}")
    else:
        click.echo(f"FAIL {report.path} at offset {report.offset}: {report.problem}", err=True)
    sys.exit(0 if report.ok else 1)


@cli.group()
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
def bench_storage_command(
    messages: int,
    per_commit: int,
    seed: int,
    no_lmdb: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
) -> None:
    """The shard store vs lmdb (sync on, key + seq index) on one workload."""
    from kayos.bench.storage import bench_storage

    result = bench_storage(messages, per_commit, seed, base, with_lmdb=not no_lmdb)
    _bench_report(result, as_json, out, skip=("workload",))


def _bench_report(
    result: dict[str, object], as_json: bool, out: str | None, skip: tuple[str, ...] = ()
) -> None:
    """Writes a bench's JSON to ``out`` if given; prints it as JSON or as aligned lines."""
    text = json.dumps(result, indent=2)
    if out:
        with open(out, "w") as handle:
            handle.write(text + "\n")
    if as_json:
        click.echo(text)
        return
    for name, value in result.items():
        if name not in skip:
            click.echo(f"{name:>26}: {value}")


@bench.command("retention")
@click.option("--budget-bytes", type=int, help="Disk budget per node.  [default: 64 MiB]")
@click.option("--volume-factor", type=int, help="Payload produced, in budgets.  [default: 10]")
@click.option("--value-bytes", type=int, help="Bytes per value.  [default: 1000]")
@click.option("--deadline-s", type=float, help="Stop after this long.  [default: 900]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
def bench_retention_command(
    budget_bytes: int | None,
    volume_factor: int | None,
    value_bytes: int | None,
    deadline_s: float | None,
    as_json: bool,
    out: str | None,
    base: str | None,
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
    try:
        parameters = RetentionSoakParameters(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    result = bench_retention(parameters, base)
    _bench_report(result, as_json, out, skip=("machine", "parameters"))
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
def bench_produce_command(
    messages: int | None,
    batch: int | None,
    in_flight: int | None,
    replicas: int | None,
    singles: int | None,
    queue_shards: int | None,
    nodes: int | None,
    as_json: bool,
    out: str | None,
    base: str | None,
) -> None:
    """A local chain of node processes: produce with acks=all through the client, then consume."""
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
    }
    try:
        parameters = ProduceBenchParameters(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    _bench_report(bench_produce(parameters, base), as_json, out)


def _load_options(command: Callable[..., None]) -> Callable[..., None]:
    """The live-load options of the benches that measure what a copy costs."""
    command = click.option(
        "--both-loads", is_flag=True, help="Run closed loop, then open loop at --produce-rate."
    )(command)
    return click.option(
        "--produce-rate",
        type=float,
        help="Open-loop producers offering this many msgs/s (drop = achieved / offered).",
    )(command)


@bench.command("failover")
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
@_load_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
def bench_failover_command(
    shard_mb: int | None,
    detection_window_ms: int | None,
    slow_window_ms: int | None,
    repeat: int | None,
    produce_rate: float | None,
    both_loads: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
) -> None:
    """3 nodes + 3 managers, acks=all producers throughout: dead and slow node removal, catch-up."""
    from kayos.bench.failover import FailoverBenchParameters, bench_failover
    from kayos.errors import KayosError

    given: dict[str, Any] = {
        "shard_mb": shard_mb,
        "detection_window_ms": detection_window_ms,
        "slow_window_ms": slow_window_ms,
        "repeat": repeat,
        "produce_rate": produce_rate,
        "both_loads": both_loads or None,
    }
    try:
        parameters = FailoverBenchParameters(**{k: v for k, v in given.items() if v is not None})
    except (ValueError, KayosError) as exc:
        raise click.BadParameter(str(exc)) from exc
    _bench_report(bench_failover(parameters, base), as_json, out, skip=("runs", "machine"))


@bench.command("grow")
@click.option("--shard-mb", type=int, help="Each of the 3 shards filled to this.  [default: 64]")
@click.option("--producers", type=int, help="acks=all producer threads.  [default: 4]")
@click.option("--baseline-s", type=float, help="Produce alone before the move.  [default: 10]")
@_load_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
def bench_grow_command(
    shard_mb: int | None,
    producers: int | None,
    baseline_s: float | None,
    produce_rate: float | None,
    both_loads: bool,
    as_json: bool,
    out: str | None,
    base: str | None,
) -> None:
    """3 loaded nodes + 3 managers: add a 4th and rebalance; produce rate before/during, bytes."""
    from kayos.bench.grow import GrowBenchParameters, bench_grow
    from kayos.errors import KayosError

    given: dict[str, Any] = {"shard_mb": shard_mb, "producers": producers}
    given["baseline_s"] = baseline_s
    given["produce_rate"] = produce_rate
    given["both_loads"] = both_loads or None
    try:
        parameters = GrowBenchParameters(**{k: v for k, v in given.items() if v is not None})
    except (ValueError, KayosError) as exc:
        raise click.BadParameter(str(exc)) from exc
    _bench_report(bench_grow(parameters, base), as_json, out, skip=("machine",))


@bench.command("spark")
@click.option("--rows", type=int, help="Messages to write and read.  [default: 1000000]")
@click.option("--value-bytes", type=int, help="Bytes per value.  [default: 100]")
@click.option("--min-partitions", type=int, help="Spark partitions per read.  [default: 2]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--out", type=click.Path(), default=None, help="Also write the JSON to this file.")
@click.option("--dir", "base", type=click.Path(), default=None, help="Where to put the cluster.")
def bench_spark_command(
    rows: int | None,
    value_bytes: int | None,
    min_partitions: int | None,
    as_json: bool,
    out: str | None,
    base: str | None,
) -> None:
    """The Spark source (local[2]) against the plain client on a local chain (needs kayos[spark]
    and java): batch write, batch read, availableNow stream read, client read."""
    from kayos.bench.spark import SparkBenchParameters, bench_spark

    given = {"rows": rows, "value_bytes": value_bytes, "min_partitions": min_partitions}
    try:
        parameters = SparkBenchParameters(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    _bench_report(bench_spark(parameters, base), as_json, out)


@bench.command("kestrel")
@click.option("--clients", default="1,16", show_default=True, help="Client counts, one run each.")
@click.option("--ops", default=20_000, show_default=True, help="Operations per scenario.")
@click.option(
    "--cluster-ops", default=5_000, show_default=True, help="Operations per cluster scenario."
)
@click.option(
    "--cluster/--memory",
    default=False,
    help="Also run the front on a local 3-node chain (default: the memory backend only).",
)
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
def bench_kestrel_command(
    clients: str,
    ops: int,
    cluster_ops: int,
    cluster: bool,
    memcached: str | None,
    workers: str,
    as_json: bool,
    out: str | None,
    base: str | None,
) -> None:
    """The Kestrel memcache front under python-memcached clients: set and get/open/close rates,
    against memcached's when one is on PATH or given."""
    from kayos.bench.kestrel import KestrelBenchParameters, bench_kestrel

    try:
        counts = tuple(int(count) for count in clients.split(","))
        parameters = KestrelBenchParameters(
            counts, ops, cluster_ops, cluster=cluster, memcached=memcached, workers=workers
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    _bench_report(bench_kestrel(parameters, base), as_json, out)


def _host_port(text: str | None, flag: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (port 1-65535) of a ``--listen-*`` flag, or None when not given."""
    if text is None:
        return None
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter(f"{text!r} is not HOST:PORT (port 1-65535)", param_hint=flag)
    return host, int(port)


@cli.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Topology file (TOML, or JSON by extension); see docs/node-api.md.",
)
@click.option("--id", "node_id", required=True, help="This node's id in the topology.")
@click.option("--data", "data_dir", required=True, help="This node's data directory.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--listen-http",
    default=None,
    metavar="HOST:PORT",
    help="Bind the HTTP face here instead of the topology's address (a proxy in front).",
)
@click.option(
    "--listen-bin",
    default=None,
    metavar="HOST:PORT",
    help="Bind the binary port here instead of the topology's address (a proxy in front).",
)
def node(
    config_path: str,
    node_id: str,
    data_dir: str,
    log_level: str,
    listen_http: str | None,
    listen_bin: str | None,
) -> None:
    """Run one node of a cluster in the foreground until SIGINT/SIGTERM."""
    import asyncio
    import logging

    from kayos.control.config import members_from
    from kayos.errors import KayosError
    from kayos.node.server import Listen, serve
    from kayos.topology import Topology

    listen = Listen(
        _host_port(listen_http, "--listen-http"), _host_port(listen_bin, "--listen-bin")
    )
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        topology = Topology.load(config_path)
        # Manager members in the file: the chains can be spliced, so heads need a lease.
        managed = bool(members_from(config_path))
        asyncio.run(serve(topology, node_id, data_dir, listen=listen, managed=managed))
    except KayosError as exc:  # refused at start: a bad file, another cluster's data directory
        raise click.ClickException(f"{exc.code}: {exc}") from exc


@cli.command()
@click.option(
    "--topology",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help='The cluster\'s topology file with its [managers."<id>"] tables (docs/manager.md).',
)
@click.option("--id", "member_id", required=True, help="This member's id in [managers].")
@click.option("--data", "data_dir", required=True, help="This member's data directory.")
@click.option("--log-level", default="INFO", show_default=True)
def manager(config_path: str, member_id: str, data_dir: str, log_level: str) -> None:
    """Run one member of the cluster manager in the foreground until SIGINT/SIGTERM."""
    import asyncio
    import logging

    from kayos.control import config
    from kayos.control.member import serve
    from kayos.errors import KayosError

    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        setup = config.load(config_path)
        setup.member(member_id)
        asyncio.run(serve(setup, member_id, data_dir))
    except KayosError as exc:
        raise click.ClickException(f"{exc.code}: {exc}") from exc


@cli.command()
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The topology file to write (mode 0600).",
)
@click.option(
    "--node",
    "node_specs",
    multiple=True,
    metavar="ID=HOST:HTTP_PORT:BIN_PORT",
    help="A node; repeat for each (shards get rotated roles: shard i starts at node i).",
)
@click.option("--replicas", default=None, type=int, help="Chain length (default: min(3, nodes)).")
@click.option("--shards", default=None, type=int, help="Shard count (default: one per node).")
@click.option(
    "--from",
    "from_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Keep the nodes and shards of this topology file (one without a cluster id and "
    "secret, say) instead of --node.",
)
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def init(
    out_path: str,
    node_specs: tuple[str, ...],
    replicas: int | None,
    shards: int | None,
    from_path: str | None,
    force: bool,
) -> None:
    """Write a topology file for a hand-made cluster, with a new cluster id and a random shared
    secret (the nodes prove it to each other on every replication link). Copy the file to every
    node, readable by the node's user only."""
    import os

    from kayos.errors import KayosError
    from kayos.identity import ClusterIdentity, write_private
    from kayos.topology import NodeAddr, Topology, rotated

    if os.path.exists(out_path) and not force:
        raise click.ClickException(f"{out_path} exists; pass --force to replace it")
    if bool(node_specs) == bool(from_path):
        raise click.UsageError("give either --node (one per node) or --from, not both")
    try:
        if from_path is not None:
            topology = Topology.load(from_path)
        else:
            addresses = [_node_address(spec, NodeAddr) for spec in node_specs]
            count = len(addresses)
            topology = rotated(
                addresses,
                replicas=min(3, count) if replicas is None else replicas,
                shard_count=shards,
            )
        identity = topology.identity
        if identity is None or identity.is_placeholder:
            identity = ClusterIdentity.generate()
        text = topology.with_identity(identity).dumps_toml()
    except KayosError as exc:
        raise click.ClickException(str(exc)) from exc
    write_private(out_path, text)
    click.echo(f"wrote {out_path}: cluster {identity.cluster_id}, {len(topology.nodes)} nodes")


def _node_address(spec: str, make: Any) -> Any:
    node_id, _, address = spec.partition("=")
    host, _, ports = address.rpartition(":") if address.count(":") == 2 else ("", "", "")
    host, _, http_port = host.rpartition(":") if host else ("", "", "")
    if not (node_id and host and http_port.isdigit() and ports.isdigit()):
        raise click.BadParameter(
            f"{spec!r}: expected ID=HOST:HTTP_PORT:BIN_PORT", param_hint="--node"
        )
    return make(node_id, host, int(http_port), int(ports))


@cli.command()
@click.option("--data", "data_dir", default="./kayos-data", show_default=True, help="Data root.")
@click.option("--nodes", default=3, show_default=True, help="Node processes to start.")
@click.option("--replicas", default=3, show_default=True, help="Chain length of every shard.")
@click.option("--shards", default=None, type=int, help="Shard count (default: one per node).")
@click.option(
    "--base-port",
    default=7101,
    show_default=True,
    help="Node i listens on HTTP base+i and binary base+100+i.",
)
@click.option(
    "--kestrel-port",
    default=22133,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="The Kestrel memcache front, items on this cluster; 0: no front.",
)
@click.option(
    "--kestrel-text-port",
    default=2222,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Its text port; 0: none.",
)
@click.option(
    "--kestrel-thrift-port",
    default=2229,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Its thrift port; 0: none.",
)
@click.option(
    "--managers",
    default=3,
    show_default=True,
    type=click.IntRange(0, 7),
    help="Manager members (Raft raft base+200+i, HTTP base+300+i); 0: no manager.",
)
def up(
    data_dir: str,
    nodes: int,
    replicas: int,
    shards: int | None,
    base_port: int,
    kestrel_port: int,
    kestrel_text_port: int,
    kestrel_thrift_port: int,
    managers: int,
) -> None:
    """Start a local cluster on 127.0.0.1: by default 3 nodes, 3 shards with rotated roles
    (S0 a->b->c, S1 b->c->a, S2 c->a->b), replication factor 3, three cluster manager members
    (docs/manager.md) that splice dead and slow nodes out of chains, and the Kestrel front (memcache
    22133, text 2222, thrift 2229) keeping its items on the cluster. Ctrl-C stops it cleanly."""
    from kayos.kestrel_process import LocalClusterWithKestrel
    from kayos.launcher import LocalCluster, run_foreground

    if not 1 <= replicas <= nodes:
        raise click.BadParameter(f"must be 1 .. {nodes}", param_hint="--replicas")
    options: dict[str, Any] = {
        "nodes": nodes, "replicas": replicas, "shards": shards, "base_port": base_port,
        "managers": managers,
    }  # fmt: skip
    cluster = (
        LocalClusterWithKestrel(
            data_dir,
            kestrel_port=kestrel_port,
            text_port=kestrel_text_port or None,
            thrift_port=kestrel_thrift_port or None,
            **options,
        )
        if kestrel_port
        else LocalCluster(data_dir, **options)
    )
    code = run_foreground(cluster, click.echo)
    if code == 0:
        click.echo("kayos up: stopped cleanly")
    sys.exit(code)


cli.add_command(produce)
cli.add_command(consume)
cli.add_command(ctl)
cli.add_command(kestrel)
cli.add_command(import_kestrel)
cli.add_command(chaos)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
