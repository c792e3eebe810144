"""The commands that run a cluster's processes or make its files: ``kayos node`` and ``kayos
manager`` (one process each, in the foreground), ``kayos up`` (a whole local cluster),
``kayos init`` (a topology file for a hand-made cluster) and ``kayos check`` (a shard store,
offline)."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from kayos.identity import ClusterIdentity


@click.command()
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


def _host_port(text: str | None, flag: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (port 1-65535) of a ``--listen-*`` flag, or None when not given."""
    if text is None:
        return None
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter(f"{text!r} is not HOST:PORT (port 1-65535)", param_hint=flag)
    return host, int(port)


@click.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Topology file (TOML, or JSON by extension); see docs/node-api.md.",
)
@click.option("--id", "node_id", required=True, help="This node's id in the topology.")
@click.option("--data", "data_dir", required=True, help="This node's data directory.")
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
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
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve beyond loopback without TLS or without client credentials, on purpose (logged, "
    'and reported as kayos_insecure 1; docs/security.md, "Safe defaults").',
)
@click.option(
    "--credentials-table",
    "credentials_table_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="A credentials table (JSON, docs/security.md) the node takes at start if it is newer "
    "than the one in its data directory.",
)
@click.option(
    "--copy-rate-mb-per-s-max",
    default=None,
    type=click.FloatRange(min=0),
    metavar="MB/S",
    help="Ceiling of any one copy's rate this node serves or writes, MB/s (0: none; default: "
    "limits.copy_rate_mb_per_s_max); see docs/operations.md.",
)
def node(
    config_path: str,
    node_id: str,
    data_dir: str,
    log_level: str,
    listen_http: str | None,
    listen_bin: str | None,
    insecure: bool,
    credentials_table_path: str | None,
    copy_rate_mb_per_s_max: float | None,
) -> None:
    """Run one node of a cluster in the foreground until SIGINT/SIGTERM."""
    import asyncio
    import logging

    from kayos import limits, tlsconfig
    from kayos.auth.table import decode_table
    from kayos.errors import KayosError
    from kayos.manager.member.config import members_from
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
        table = None
        if credentials_table_path is not None:
            with open(credentials_table_path, "rb") as handle:
                table = decode_table(handle.read(limits.credentials_table_bytes_max + 1))
        ceiling = (
            limits.copy_rate_mb_per_s_max
            if copy_rate_mb_per_s_max is None
            else copy_rate_mb_per_s_max
        )
        tls = tlsconfig.files_of(config_path, node_id)
        asyncio.run(
            serve(
                topology,
                node_id,
                data_dir,
                listen=listen,
                managed=managed,
                tls=tls,
                insecure=insecure,
                credentials_table=table,
                copy_rate_mb_per_s_max=ceiling,
                config_path=config_path,
            )
        )
    except KayosError as exc:  # refused at start: a bad file, another cluster's data directory
        raise click.ClickException(f"{exc.code}: {exc}") from exc


@click.command()
@click.option(
    "--topology",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help='The cluster\'s topology file with its [managers."<id>"] tables (docs/manager.md).',
)
@click.option("--id", "member_id", required=True, help="This member's id in [managers].")
@click.option("--data", "data_dir", required=True, help="This member's data directory.")
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve beyond loopback without TLS (logged; the member's status says insecure).",
)
def manager(
    config_path: str, member_id: str, data_dir: str, log_level: str, insecure: bool
) -> None:
    """Run one member of the cluster manager in the foreground until SIGINT/SIGTERM."""
    import asyncio
    import logging

    from kayos import tlsconfig
    from kayos.errors import KayosError
    from kayos.manager.member import config
    from kayos.manager.member.process import serve

    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        setup = config.load(config_path)
        address = setup.member(member_id)
        tls = tlsconfig.files_of(config_path, member_id)
        tlsconfig.check_exposure(f"manager {member_id}", [address.host], tls is not None, insecure)
        tlsconfig.install_member(tlsconfig.MemberTls.load(tls) if tls is not None else None)
        asyncio.run(serve(setup, member_id, data_dir, config_path))
    except KayosError as exc:
        raise click.ClickException(f"{exc.code}: {exc}") from exc


@click.command()
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
@click.option(
    "--manager",
    "manager_specs",
    multiple=True,
    metavar="ID=HOST:RAFT_PORT:HTTP_PORT",
    help="A cluster manager member, with --node; repeat for each (three or five).",
)
@click.option("--replicas", default=None, type=int, help="Chain length (default: min(3, nodes)).")
@click.option("--shards", default=None, type=int, help="Shard count (default: one per node).")
@click.option(
    "--from",
    "from_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Write this topology file again with a new cluster id and secret, keeping everything "
    "else in it (nodes, shards, queues, [managers], [manager], comments), instead of --node.",
)
@click.option("--force", is_flag=True, help="Replace --out if it exists already.")
@click.option(
    "--tls",
    is_flag=True,
    help="TLS on every port and link: write a private CA and a certificate per node and member "
    "(into --tls-dir) and a [tls] table naming them (docs/security.md).",
)
@click.option(
    "--tls-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where --tls writes the certificates (default: a tls directory beside --out).",
)
def init(
    out_path: str,
    node_specs: tuple[str, ...],
    manager_specs: tuple[str, ...],
    replicas: int | None,
    shards: int | None,
    from_path: str | None,
    force: bool,
    tls: bool,
    tls_dir: str | None,
) -> None:
    """Write a topology file for a hand-made cluster, with a new cluster id and a random shared
    secret (the nodes prove it to each other on every replication link). Copy the file to every
    node and manager member, readable by their user only."""
    import os

    from kayos.errors import KayosError
    from kayos.identity import ClusterIdentity, write_private

    if os.path.exists(out_path) and not force:
        raise click.ClickException(f"{out_path} exists; pass --force to replace it")
    if bool(node_specs) == bool(from_path):
        raise click.UsageError("give either --node (one per node) or --from, not both")
    if from_path is not None and (manager_specs or replicas is not None or shards is not None):
        raise click.UsageError("--manager, --replicas and --shards go with --node, not --from")
    try:
        if from_path is not None:
            text, identity, nodes, members = _init_from(from_path, out_path)
        else:
            text, identity, nodes, members = _init_new(
                node_specs, manager_specs, replicas, shards, ClusterIdentity.generate()
            )
        if tls_dir is not None and not tls:
            raise click.UsageError("--tls-dir goes with --tls")
        if tls:
            where = tls_dir or os.path.join(os.path.dirname(os.path.abspath(out_path)), "tls")
            text = _with_certificates(text, where, out_path)
    except KayosError as exc:
        raise click.ClickException(str(exc)) from exc
    write_private(out_path, text)
    click.echo(
        f"wrote {out_path}: cluster {identity.cluster_id}, {nodes} nodes, {members} manager members"
    )


def _with_certificates(text: str, tls_dir: str, out_path: str) -> str:
    """``kayos init --tls``: a CA and a certificate per node and member (for its host) in
    ``tls_dir``, and the file's ``[tls]`` table naming them (refused when it has one already);
    the paths are relative to the file's directory when ``tls_dir`` is below it, so the file and
    the directory can be copied together to every host."""
    import os
    import tomllib

    from kayos.errors import InvalidRequest
    from kayos.local.certs import tls_table, write_cluster_certs

    data = tomllib.loads(text)
    if "tls" in data:
        raise InvalidRequest("the file has a [tls] table already: remove it to write new ones")
    members = {str(name): str(table["host"]) for name, table in data["nodes"].items()}
    for name, table in data.get("managers", {}).items():
        members[str(name)] = str(table["host"])
    write_cluster_certs(tls_dir, members)
    where, home = os.path.abspath(tls_dir), os.path.dirname(os.path.abspath(out_path))
    named = os.path.relpath(where, home) if where.startswith(home + os.sep) else where
    return text.rstrip("\n") + "\n\n" + tls_table(named)


def _init_new(
    node_specs: tuple[str, ...],
    manager_specs: tuple[str, ...],
    replicas: int | None,
    shards: int | None,
    identity: ClusterIdentity,
) -> tuple[str, ClusterIdentity, int, int]:
    """``kayos init --node ...``: rotated shards over the nodes, the members' tables after."""
    from kayos.manager.member.config import MemberAddr, managers_toml, parse_members
    from kayos.topology import NodeAddr, rotated

    addresses = [_address(spec, NodeAddr, "--node", "HTTP_PORT:BIN_PORT") for spec in node_specs]
    members = [
        _address(spec, MemberAddr, "--manager", "RAFT_PORT:HTTP_PORT") for spec in manager_specs
    ]
    count = len(addresses)
    topology = rotated(
        addresses, replicas=min(3, count) if replicas is None else replicas, shard_count=shards
    )
    text = topology.with_identity(identity).dumps_toml()
    if members:
        text += "\n" + managers_toml(members)
    parse_members(tomllib.loads(text))  # a bad id, two members on one port, too many: refused
    return text, identity, count, len(members)


def _init_from(from_path: str, out_path: str) -> tuple[str, ClusterIdentity, int, int]:
    """``kayos init --from FILE``: the file as it is, with a new identity in place of its own
    (a real one is kept). A JSON file is written as JSON."""
    from kayos.errors import InvalidRequest
    from kayos.identity import ClusterIdentity
    from kayos.manager.member.config import parse_members
    from kayos.topology import Topology

    as_json = from_path.endswith(".json")
    if as_json != out_path.endswith(".json"):
        raise click.UsageError("--from and --out must both end in .json, or neither")
    try:
        with open(from_path, encoding="utf-8") as f:
            text = f.read()
        data = json.loads(text) if as_json else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # TOMLDecodeError is a ValueError
        raise InvalidRequest(f"cannot read topology file {from_path}: {exc}") from exc
    topology = Topology.from_json(data)
    members = parse_members(data)
    identity = topology.identity
    if identity is None or identity.is_placeholder:
        identity = ClusterIdentity.generate()
    if as_json:
        fields = {"cluster_id": identity.cluster_id, "secret": identity.secret.hex()}
        text = json.dumps(dict(data, **fields), indent=2) + "\n"
    else:
        text = identity_in_toml(text, identity)
    return text, identity, len(topology.nodes), len(members)


_IDENTITY_KEY = re.compile(r"\s*(cluster_id|secret)\s*=")
_EPOCH_KEY = re.compile(r"\s*epoch\s*=")


def identity_in_toml(text: str, identity: ClusterIdentity) -> str:
    """The TOML topology ``text`` with ``identity``'s two keys in place of its ``cluster_id`` and
    ``secret`` (after ``epoch`` when it has none), every other line as it was. The result is
    parsed again and must equal the original with the two keys changed, or nothing is written."""
    from kayos.errors import InvalidRequest

    lines = text.splitlines(keepends=True)
    tables = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")), len(lines))
    kept: list[str] = []
    at: int | None = None
    for line in lines[:tables]:
        if _IDENTITY_KEY.match(line):
            at = len(kept) if at is None else at
        else:
            kept.append(line)
    if at is None:
        at = next((i + 1 for i, line in enumerate(kept) if _EPOCH_KEY.match(line)), len(kept))
    if at > 0 and not kept[at - 1].endswith("\n"):
        kept[at - 1] += "\n"
    kept[at:at] = [line + "\n" for line in identity.toml_lines()]
    written = "".join(kept + lines[tables:])
    expected = dict(tomllib.loads(text), cluster_id=identity.cluster_id)
    expected["secret"] = identity.secret.hex()
    try:
        same = tomllib.loads(written) == expected
    except tomllib.TOMLDecodeError:
        same = False
    if not same:
        raise InvalidRequest(
            "cannot put the new cluster_id and secret in this file's text (keep both keys on "
            "one line each, before the first table)"
        )
    return written


def _address(spec: str, make: Any, flag: str, ports_shape: str) -> Any:
    """``ID=HOST:PORT:PORT`` of a ``--node`` or ``--manager`` flag."""
    node_id, _, address = spec.partition("=")
    host, _, second = address.rpartition(":") if address.count(":") == 2 else ("", "", "")
    host, _, first = host.rpartition(":") if host else ("", "", "")
    if not (node_id and host and first.isdigit() and second.isdigit()):
        raise click.BadParameter(f"{spec!r}: expected ID=HOST:{ports_shape}", param_hint=flag)
    return make(node_id, host, int(first), int(second))


@click.command()
@click.option(
    "--data",
    "data_dir",
    default="./kayos-data",
    show_default=True,
    help="The data root: the topology file, logs, and each node's and member's data directory.",
)
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
@click.option(
    "--tls",
    is_flag=True,
    help="TLS on every port and link, with a private CA in DATA/tls (docs/security.md).",
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
    tls: bool,
) -> None:
    """Start a local cluster on 127.0.0.1: by default 3 nodes, 3 shards with rotated roles
    (S0 a->b->c, S1 b->c->a, S2 c->a->b), replication factor 3, three cluster manager members
    (docs/manager.md) that splice dead and slow nodes out of chains, and the Kestrel front (memcache
    22133, text 2222, thrift 2229) keeping its items on the cluster. Ctrl-C stops it cleanly."""
    from kayos.local.cluster import LocalCluster
    from kayos.local.kestrel import LocalClusterWithKestrel
    from kayos.local.up import run_foreground

    if not 1 <= replicas <= nodes:
        raise click.BadParameter(f"must be 1 .. {nodes}", param_hint="--replicas")
    options: dict[str, Any] = {
        "nodes": nodes, "replicas": replicas, "shards": shards, "base_port": base_port,
        "managers": managers, "tls": tls,
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


COMMANDS = (check, node, manager, init, up)
