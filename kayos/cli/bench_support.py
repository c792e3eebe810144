"""What every ``kayos bench`` command shares: the ``--plot`` option and its picture, the
parameters from the options given, the progress line, the report (aligned lines or JSON)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kayos.cli.progress import Progress, wanted
from kayos.errors import KayosError

# What a bench's run gets to report its phases with (``Progress.phase``).
Phase = Callable[[str], None]


def _check_plot(_context: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--plot``'s check, at parse time (before any bench runs): matplotlib is installed (the
    ``plot`` extra) and the picture's directory exists."""
    if value is None:
        return None
    from kayos.bench.plots import missing_matplotlib

    missing = missing_matplotlib()
    if missing is not None:
        raise click.BadParameter(missing)
    directory = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(directory):
        raise click.BadParameter(f"no directory {directory} to write the picture in")
    return value


def plot_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--plot FILE.png``: every bench's picture of its figures (kayos/bench/plots.py)."""
    return click.option(
        "--plot",
        type=click.Path(dir_okay=False),
        default=None,
        callback=_check_plot,
        expose_value=True,
        help="Also draw the figures to this PNG file (needs the plot extra: matplotlib).",
    )(command)


P = TypeVar("P")


def parameters_of(cls: Callable[..., P], given: dict[str, Any]) -> P:
    """A bench's parameters from the options given (None: the parameter's default); a value the
    parameters refuse (a bound, or a manager setting it cannot run with) is the command line's
    error."""
    try:
        return cls(**{k: v for k, v in given.items() if v is not None})
    except (ValueError, KayosError) as exc:
        raise click.BadParameter(str(exc)) from exc


def run_bench(
    name: str, as_json: bool, run: Callable[[Phase], dict[str, Any]], **progress: Any
) -> dict[str, Any]:
    """Runs a bench under a progress line (on a terminal, not with --json)."""
    with Progress(f"bench {name}", enabled=wanted(as_json), **progress) as shown:
        return run(shown.phase)


def draw(name: str, result: dict[str, Any], plot: str | None) -> None:
    """Writes ``name``'s picture of ``result`` to ``plot`` if given (after the figures are out:
    a picture that fails loses no figures)."""
    if plot is None:
        return
    from kayos.bench.plots import write_plot

    write_plot(name, result, plot)
    click.echo(f"bench {name}: picture written to {plot}", err=True)


def bench_report(
    result: dict[str, object],
    as_json: bool,
    out: str | None,
    skip: tuple[str, ...] = (),
    lines: list[str] | None = None,
) -> None:
    """Writes a bench's JSON to ``out`` if given; prints it as JSON, or as ``lines`` if given,
    else as aligned lines."""
    text = json.dumps(result, indent=2)
    if out:
        with open(out, "w") as handle:
            handle.write(text + "\n")
    if as_json:
        click.echo(text)
        return
    if lines is not None:
        for line in lines:
            click.echo(line)
        return
    for name, value in result.items():
        if name not in skip:
            click.echo(f"{name:>26}: {value}")


def load_options(command: Callable[..., None]) -> Callable[..., None]:
    """The live-load options of the benches that measure what a copy costs."""
    command = click.option(
        "--both-loads", is_flag=True, help="Run closed loop, then open loop at --produce-rate."
    )(command)
    return click.option(
        "--produce-rate",
        type=float,
        help="Open-loop producers offering this many msgs/s (drop = achieved / offered).",
    )(command)
