"""Command-line pieces several `kayos ctl` modules share (one definition each)."""

from __future__ import annotations

import click

from kayos import limits

# Where `kayos up` writes the cluster's topology file (and its secret).
TOPOLOGY_DEFAULT = "./kayos-data/cluster.toml"

# The --topology option of a command that signs a request to the manager.
signing_topology_option = click.option(
    "--topology",
    "topology_path",
    default=TOPOLOGY_DEFAULT,
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The topology file: the cluster secret signs the request; its [managers] are asked.",
)

# The options of the commands that read the cluster's nodes (compact, check, queue ...).
topology_option = click.option(
    "--topology",
    "topology_path",
    default=TOPOLOGY_DEFAULT,
    show_default=True,
    help="The topology file: its nodes are asked for the cluster's current topology (and its "
    "secret signs the requests that change state).",
)
url_option = click.option(
    "--url",
    "urls",
    multiple=True,
    help="A node's HTTP base URL to read the topology from (repeatable; default: the "
    "--topology file's nodes, tried in turn).",
)
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
