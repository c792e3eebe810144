"""The Ports reference: every port a Kayos process listens on, who connects to it, and the port
``kayos up`` gives it by default.

The defaults are read from the code: ``kayos up``'s options (``--base-port``, ``--nodes``,
``--managers``, the Kestrel ports), the addresses a ``LocalCluster`` built with them hands out
(nothing is started; the cluster's directory is not touched), and the Kestrel front's
``ServerConfig`` for ``kayos kestrel`` started alone.
"""

from __future__ import annotations

import tempfile
from typing import Any

import click

from kayos.cli.cluster import up
from kayos.cli.reference.markdown import GENERATED_NOTE, code, table
from kayos.local.cluster import LocalCluster
from kestrel_compat.core.config import ServerConfig


def option_default(command: click.Command, name: str) -> Any:
    """The default of ``command``'s option whose Python name is ``name``."""
    for param in command.params:
        if param.name == name:
            return param.default
    raise KeyError(f"{command.name} has no option {name}")


def run_of(ports: list[int]) -> str:
    """``[7101, 7102, 7103]`` -> ``7101-7103``."""
    if not ports:
        return "none"
    return str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"


def local_ports() -> dict[str, list[int]]:
    """The ports ``kayos up`` with its defaults gives its nodes and manager members."""
    with tempfile.TemporaryDirectory(prefix="kayos-ports-") as base_dir:
        cluster = LocalCluster(
            base_dir,
            nodes=option_default(up, "nodes"),
            base_port=option_default(up, "base_port"),
            managers=option_default(up, "managers"),
        )
        nodes = list(cluster.topology.nodes.values())
        members = cluster.manager_members
        return {
            "http": [node.http_port for node in nodes],
            "bin": [node.bin_port for node in nodes],
            "raft": [member.raft_port for member in members],
            "manager_http": [member.http_port for member in members],
        }


def render() -> str:
    local = local_ports()
    server = ServerConfig()
    kestrel = {
        "port": (option_default(up, "kestrel_port"), server.port),
        "text": (option_default(up, "kestrel_text_port"), server.text_port),
        "thrift": (option_default(up, "kestrel_thrift_port"), server.thrift_port),
    }
    rows = [
        [
            "node HTTP",
            code('nodes."<id>".http_port'),
            "clients (`kayos.Client` and `AsyncClient`: consume, group commits, the topology "
            "and its watch; the Kestrel front and the Spark source through them), operators "
            "(`kayos ctl`, curl), the manager's leader (`GET /v1/status` every poll, its watch, "
            "signed topologies and orders), Prometheus (`GET /metrics`)",
            run_of(local["http"]),
            "`--base-port`",
        ],
        [
            "node binary",
            code('nodes."<id>".bin_port'),
            "the node's downstream in each chain (a downstream member connects to its upstream "
            "and pulls the shard's log: middle to head, tail to middle), learners copying a "
            "shard, and clients' `PRODUCE` and `WAIT_COMMITTED`",
            run_of(local["bin"]),
            "`--base-port` (+100)",
        ],
        [
            "manager Raft",
            code('managers."<id>".raft_port'),
            "the other manager members only (pysyncobj, encrypted with the cluster secret)",
            run_of(local["raft"]),
            "`--base-port` (+200)",
        ],
        [
            "manager HTTP",
            code('managers."<id>".http_port'),
            "`kayos ctl` (status and operator requests), nodes (reports of a lost neighbour), "
            "`kayos up`'s supervisor (a node's exit)",
            run_of(local["manager_http"]),
            "`--base-port` (+300)",
        ],
    ]
    names = {"port": "memcache", "text": "text", "thrift": "thrift"}
    flags = {
        "port": "--kestrel-port",
        "text": "--kestrel-text-port",
        "thrift": "--kestrel-thrift-port",
    }
    for key, (up_default, alone_default) in kestrel.items():
        rows.append(
            [
                f"Kestrel {names[key]}",
                code(f"server.{key}_port" if key != "port" else "server.port"),
                f"Kestrel {names[key]} clients",
                f"{up_default} (`kayos kestrel` alone: {alone_default})",
                f"`{flags[key]}` (0: none)",
            ]
        )
    parts = [
        "# Ports",
        f"*{GENERATED_NOTE}*",
        "Every port a Kayos process listens on. A cluster's ports come from its topology file "
        "([Configuration](configuration.md)); the defaults below are the ones `kayos up` gives "
        "a local cluster with its default options (node i on HTTP base+i and binary "
        "base+100+i, manager member i on Raft base+200+i and HTTP base+300+i), all on "
        "127.0.0.1. `kayos node --listen-http HOST:PORT` / `--listen-bin HOST:PORT` bind "
        "elsewhere than the topology's address (a proxy in front). Every process binds all "
        "its ports before it contacts any peer, and a port in use ends it with one line naming "
        'the port and the flag that moves it ([HTTP API, "Owners, locks and ports"]'
        "(../node-api.md#owners-locks-and-ports)).",
        table(["port", "set by", "who connects", "default (`kayos up`)", "moved by"], rows),
        "A firewall between hosts must let nodes reach each other's binary and HTTP ports, "
        "manager members each other's Raft ports, nodes the members' HTTP ports, and clients "
        "the nodes' ports ([Deploy](../deploy.md)).",
    ]
    return "\n\n".join(parts) + "\n"
