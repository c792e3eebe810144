"""The ``kayos`` command line: the root group, and where each of its commands lives.

- ``produce``, ``consume``: kayos/cli/data.py;
- ``node``, ``manager``, ``up``, ``init``, ``check``: kayos/cli/cluster.py;
- ``ctl ...``: kayos/cli/ctl/; ``bench ...``: kayos/cli/bench.py;
- ``kestrel``, ``import-kestrel``: kestrel_compat/;
- ``chaos ...``: the fault-injection harness, chaos/cli.py. The product does not import the
  harness: the root group loads it by name when that command is asked for (``load_chaos``, the
  one place under kayos/ that may import chaos, tests/unit/house/test_layering.py).
"""

from __future__ import annotations

import click

from kayos import __version__
from kayos.cli import cluster
from kayos.cli.bench import bench
from kayos.cli.ctl.main import ctl
from kayos.cli.data import consume, produce
from kestrel_compat.cli import kestrel
from kestrel_compat.migration.cli import import_kestrel

# The command loaded only when asked for (``load_chaos``).
CHAOS = "chaos"


def load_chaos() -> click.Command:
    """``kayos chaos`` (chaos/cli.py), imported when the command is asked for."""
    from chaos.cli import chaos

    return chaos


class RootGroup(click.Group):
    """The ``kayos`` group: its commands, and ``chaos`` loaded on first use (also for ``--help``,
    which lists it like the others)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), CHAOS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == CHAOS and CHAOS not in self.commands:
            self.add_command(load_chaos(), CHAOS)
        return super().get_command(ctx, cmd_name)


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kayos")
def cli() -> None:
    """Kayos: a fault-tolerant, durable, de-duplicating message queue cluster."""


for command in (produce, consume, *cluster.COMMANDS, bench, ctl, kestrel, import_kestrel):
    cli.add_command(command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
