"""Command-line pieces several `kayos ctl` modules share (one definition each)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kayos import limits
from kayos.cli.address import (
    TOPOLOGY_DEFAULT,
    cluster_option,
    credentials_option,
    note_unused_cluster_env,
)

Command = TypeVar("Command", bound=Callable[..., Any])

__all__ = [
    "TOPOLOGY_DEFAULT",
    "cluster_nodes_option",
    "json_option",
    "nodes_option",
    "signing_topology_option",
    "timeout_option",
    "topology_option",
]


def _note_env(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    note_unused_cluster_env(ctx, value)
    return value


# The --topology option of a command that only asks the cluster manager: the members' addresses
# and the secret that signs the request are in the file, and nodes are not asked (so the command
# takes no --cluster).
_signing_topology = click.option(
    "--topology",
    "topology_path",
    default=TOPOLOGY_DEFAULT,
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    callback=_note_env,
    help="The cluster's topology file: its secret signs the request and its [managers] are asked "
    "(the nodes are not, so there is no --cluster).",
)


def signing_topology_option(command: Command) -> Command:
    """``--topology`` of a command that asks the managers, and ``--credentials``: the signed order
    needs none, but following the manager's status does where the cluster holds credentials."""
    return credentials_option(_signing_topology(command))


def topology_option(why: str = "") -> Callable[[Command], Command]:
    """The --topology option of a command that asks the nodes (status, compact, check, queue
    ...): without --cluster its nodes are asked; ``why`` says what else the command reads in it."""
    return click.option(
        "--topology",
        "topology_path",
        default=TOPOLOGY_DEFAULT,
        show_default=True,
        type=click.Path(dir_okay=False),
        help="The cluster's topology file: without --cluster or $KAYOS_CLUSTER its nodes are "
        f"asked{'; ' + why if why else ''}.",
    )


# The nodes to ask: --cluster, and --url, its name before (docs/operations.md, "Naming the
# cluster").
nodes_option = cluster_option("--url", topology=True)
# The same for a command that came after --cluster (so it has no old name).
cluster_nodes_option = cluster_option(topology=True)

timeout_option = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_status_timeout_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for each node's reply to a small request.",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the documented JSON instead."
)
