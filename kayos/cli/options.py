"""Command-line pieces several `kayos ctl` modules share (one definition each)."""

from __future__ import annotations

import click

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
