"""``python -m kayos`` runs the ``kayos`` command line."""

from __future__ import annotations

from kayos.cli.main import cli

if __name__ == "__main__":
    cli()
