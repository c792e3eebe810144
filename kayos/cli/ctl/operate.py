"""``kayos ctl add-node``, ``drain``, ``move-shard``, ``rebalance``: operator requests to the
cluster manager (docs/manager.md rule 7, ``POST /v1/manager/operator``).

Each request is signed (purpose ``operator``) with the topology file's secret and names the view's
epoch, read first from the managers (a stale epoch is retried a bounded number of times). The long
ones then follow the manager's moves (``GET /v1/manager/status``) until none is pending, printing
progress (a rich progress bar on a terminal, a line per change otherwise, nothing but the
outcome with --json); Ctrl-C stops following, not the moves: the manager's plan goes on, the
command says so and how to resume, and running it again follows the same plan (a drain or
rebalance asked again adds nothing already planned; the same move-shard asked again while it is
pending is accepted as it stands).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from kayos import limits
from kayos.cli.ctl.options import signing_topology_option

_topology = signing_topology_option
_json = click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
_timeout = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_operation_wait_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for the moves while following them (then it stops following; the "
    "moves go on).",
)
_wait = click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Follow the moves until none is pending.",
)


def register(group: click.Group) -> None:
    for command in (add_node, drain, move_shard, rebalance):
        group.add_command(command)


@click.command("add-node")
@click.argument("node")
@click.option("--host", required=True, help="The new node's host (as in its [nodes] table).")
@click.option("--http-port", type=click.IntRange(1, 65535), required=True)
@click.option("--bin-port", type=click.IntRange(1, 65535), required=True)
@_topology
@_json
def add_node(
    node: str, host: str, http_port: int, bin_port: int, topology_path: str, as_json: bool
) -> None:
    """Add NODE, already started with `kayos node`, to the cluster: every node learns its address
    from the next signed topology; it holds no replica until a move, drain or rebalance."""
    body: dict[str, Any] = {"op": "add-node", "node": node, "host": host}
    body.update(http_port=http_port, bin_port=bin_port)
    result = _run(topology_path, body, wait=False, timeout_s=0.0, as_json=as_json)
    _finish(result, as_json, f"added {node}")


@click.command()
@click.argument("node")
@_topology
@_wait
@_timeout
@_json
def drain(node: str, topology_path: str, wait: bool, timeout_s: float, as_json: bool) -> None:
    """Move every replica NODE holds to other nodes, each joining before NODE leaves."""
    result = _run(topology_path, {"op": "drain", "node": node}, wait, timeout_s, as_json, node)
    _finish(result, as_json, f"drained {node}")


@click.command("move-shard")
@click.argument("shard", type=click.IntRange(min=0))
@click.argument("source")
@click.argument("target")
@_topology
@_wait
@_timeout
@_json
def move_shard(
    shard: int,
    source: str,
    target: str,
    topology_path: str,
    wait: bool,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Move SHARD's replica from SOURCE to TARGET (TARGET catches up, joins, then SOURCE leaves)."""
    body = {"op": "move-shard", "shard": shard, "source": source, "target": target}
    result = _run(topology_path, body, wait, timeout_s, as_json)
    _finish(result, as_json, f"moved shard {shard} from {source} to {target}")


@click.command()
@_topology
@_wait
@_timeout
@_json
def rebalance(topology_path: str, wait: bool, timeout_s: float, as_json: bool) -> None:
    """Spread replicas evenly over the up nodes (the manager plans the moves)."""
    result = _run(topology_path, {"op": "rebalance"}, wait, timeout_s, as_json)
    _finish(result, as_json, "rebalanced")


def _finish(result: dict[str, Any], as_json: bool, done: str) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    elif result["ok"]:
        replicas = ", ".join(f"{n}={c}" for n, c in sorted(result.get("replicas", {}).items()))
        click.echo(f"{done} (epoch {result['epoch']}; replicas {replicas})")
    else:
        click.echo(f"{result['op']} failed: {result['error']}", err=True)
    sys.exit(0 if result["ok"] else 1)


def _run(
    topology_path: str,
    body: dict[str, Any],
    wait: bool,
    timeout_s: float,
    as_json: bool,
    draining: str | None = None,
) -> dict[str, Any]:
    from kayos.client.operator import post_operator
    from kayos.errors import KayosError
    from kayos.manager.member.config import load

    try:
        setup = load(topology_path)
    except KayosError as exc:
        raise click.ClickException(f"{topology_path}: {exc}") from exc
    urls = [member.http_url for member in setup.members]
    started = time.monotonic()
    result = asyncio.run(post_operator(setup.identity, urls, body))
    if not result["ok"] or not wait:
        return result
    resume = "kayos " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])
    try:
        with Display(as_json) as show:
            final = asyncio.run(_follow(urls, timeout_s, show, draining))
        if final.get("interrupted"):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        # Only the following stops: the plan is in the manager's replicated view and goes on.
        note = f"the manager's moves go on; run `{resume}` again to follow them to the end"
        if as_json:
            click.echo(json.dumps({**result, "interrupted": True, "resume": resume}, indent=2))
        click.echo(f"\ninterrupted: {note}", err=True)
        sys.exit(130)
    final["seconds"] = round(time.monotonic() - started, 3)
    return {**result, **final}


class Display:
    """Where progress goes while following: a rich progress bar on a terminal, a plain line per
    change otherwise (a pipe, a log), nothing with --json. ``show(progress)`` takes
    ``progress_of_status``'s dict; the bar counts moves done out of every move seen."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.seen: set[tuple[int, str, str]] = set()
        self.last = ""
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Callable[[dict[str, Any]], None]:
        if not self.as_json and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("moves"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.description}"), console=Console(stderr=True), transient=False,
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("", total=None)
        return self.show

    def show(self, progress: dict[str, Any]) -> None:
        if self.as_json:
            return
        pending = {(m["shard"], m["source"], m["target"]) for m in progress.get("moves", [])}
        self.seen |= pending
        line = progress_line(progress)
        if self.bar is not None:
            done = len(self.seen) - len(pending)
            self.bar.update(self.task, total=len(self.seen), completed=done, description=line)
        elif line != self.last:
            click.echo(line, err=True)
        self.last = line

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def progress_line(progress: dict[str, Any]) -> str:
    moves = progress.get("moves", [])
    joined = sum(1 for m in moves if m.get("joined"))
    parts = [f"moves pending {len(moves)} (joined {joined})"]
    parts.append(", ".join(f"shard {m['shard']} {m['source']}->{m['target']}" for m in moves[:4]))
    if progress.get("drain_blocked"):
        parts.append(f"drain blocked on {len(progress['drain_blocked'])} shard(s): add a node")
    replicas = progress.get("replicas", {})
    parts.append("replicas " + " ".join(f"{n}={c}" for n, c in sorted(replicas.items())))
    return "; ".join(p for p in parts if p)


async def _follow(
    urls: list[str],
    timeout_s: float,
    show: Callable[[dict[str, Any]], None],
    draining: str | None,
) -> dict[str, Any]:
    """Polls the managers until no move is pending (and, for a drain, the node holds nothing or
    the drain is blocked), or ``timeout_s``, or Ctrl-C (``{"interrupted": True}``). Bounded by
    the deadline. SIGINT sets a flag the loop checks between polls rather than cancelling the
    task: a cancellation that lands as a request's own timeout fires can be lost (CPython 3.11's
    wait_for), and the command then went on following (seen once in CI, 60 s without exiting)."""
    from kayos.client.operator import fetch_manager
    from kayos.manager.member.http import progress_of_status

    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    deadline = time.monotonic() + timeout_s
    latest: dict[str, Any] = {}
    try:
        while not interrupted.is_set():
            answer = await fetch_manager(urls, limits.ctl_status_timeout_ms_default / 1000)
            if isinstance(answer, dict):
                latest = progress_of_status(answer)
                show(latest)
                held = latest["replicas"].get(draining, 0) if draining else 0
                if not latest["moves"] and (held == 0 or latest["drain_blocked"]):
                    latest["done"] = not latest["drain_blocked"]
                    return latest
            if time.monotonic() >= deadline:
                return {
                    **latest,
                    "done": False,
                    "ok": False,
                    "error": "still moving at the deadline",
                }
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(interrupted.wait(), limits.ctl_progress_poll_ms / 1000)
        return {**latest, "interrupted": True}
    finally:
        loop.remove_signal_handler(signal.SIGINT)
