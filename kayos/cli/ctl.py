"""``kayos ctl``: operating a running cluster. The fetching is here; what it means is decided by the
pure functions of kayos/cli/status_view.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import click

from kayos import limits
from kayos.cli.data import SEED_DEFAULT
from kayos.cli.status_view import NodeAnswer, render, summarise, unreachable


@click.group()
def ctl() -> None:
    """Look at and operate a running cluster (through the nodes' HTTP API)."""


@ctl.command()
@click.option(
    "--url",
    "urls",
    multiple=True,
    default=[SEED_DEFAULT],
    show_default=True,
    help="A node's HTTP base URL to read the topology from (repeatable: tried in turn).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_status_timeout_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for each node's reply.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON schema instead.")
def status(urls: tuple[str, ...], timeout_s: float, as_json: bool) -> None:
    """Topology, every node's reachability, every chain link's state and lag, whether each shard is
    fully replicated, and alerts. Exits 0 when healthy, 1 when degraded (any alert), 2 when no
    node could be reached. See docs/operations.md, "kayos ctl status"."""
    summary = asyncio.run(fetch_summary([url.rstrip("/") for url in urls], timeout_s))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        click.echo(render(summary, click.style if colour else _plain), color=colour)
    sys.exit(summary["exit_code"])


def _plain(text: str, **_: Any) -> str:
    return text


async def fetch_summary(urls: list[str], timeout_s: float) -> dict[str, Any]:
    """The topology from the first of ``urls`` that serves it, then every node's status at once."""
    from kayos.client.http import HttpTransport
    from kayos.errors import KayosError
    from kayos.topology import Topology

    transport = HttpTransport()
    await transport.open()
    try:
        errors: list[str] = []
        for url in urls:
            try:
                reply = await transport.request("GET", f"{url}/v1/topology", timeout_s=timeout_s)
                topology = Topology.from_json(reply)
                break
            except KayosError as exc:
                errors.append(str(exc))
        else:
            return unreachable(urls, "; ".join(errors))

        async def ask(url: str) -> NodeAnswer:
            try:
                answer = await transport.request("GET", f"{url}/v1/status", timeout_s=timeout_s)
            except KayosError as exc:
                return f"{type(exc).__name__}: {exc}"
            return answer if isinstance(answer, dict) else f"not a status reply: {answer!r:.80}"

        nodes = list(topology.nodes.values())
        answers = await asyncio.gather(*(ask(node.http_url) for node in nodes))
        return summarise(url, topology, {n.id: a for n, a in zip(nodes, answers, strict=True)})
    finally:
        await transport.close()


@ctl.command()
@click.argument("queue")
@click.option("--url", default=SEED_DEFAULT, show_default=True, help="A node's HTTP base URL.")
@click.option("--max-age-ms", type=click.IntRange(min=1), help="Drop entries older than this.")
@click.option("--max-bytes", type=click.IntRange(min=1), help="Keep at most this many bytes.")
@click.option(
    "--until-consumed", is_flag=True, help="Drop what every registered group has consumed."
)
@click.option("--keep-all", is_flag=True, help="Clear the policy: keep everything.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.produce_commit_timeout_ms / 1000 + 5,
    show_default=True,
    help="Seconds to wait for the reply.",
)
def retention(
    queue: str,
    url: str,
    max_age_ms: int | None,
    max_bytes: int | None,
    until_consumed: bool,
    keep_all: bool,
    timeout_s: float,
) -> None:
    """Show QUEUE's retention policy and floor, or set it (any option; --keep-all clears it).
    Prints the node's JSON reply. See docs/retention.md."""
    policy: dict[str, Any] = {}
    if max_age_ms is not None:
        policy["max_age_ms"] = max_age_ms
    if max_bytes is not None:
        policy["max_bytes"] = max_bytes
    if until_consumed:
        policy["until_consumed"] = True
    if keep_all and policy:
        raise click.UsageError("--keep-all clears the policy; give it alone")
    body = policy if (policy or keep_all) else None
    reply = asyncio.run(_retention_call(url.rstrip("/"), queue, body, timeout_s))
    click.echo(json.dumps(reply, indent=2))


async def _retention_call(
    url: str, queue: str, body: dict[str, Any] | None, timeout_s: float
) -> Any:
    """GET from the node at ``url``, or PUT at the head of the queue's shard (from the topology)."""
    from kayos.client.http import HttpTransport
    from kayos.errors import KayosError
    from kayos.topology import Topology

    transport = HttpTransport()
    await transport.open()
    try:
        if body is None:
            target = url
            method = "GET"
        else:
            topology = Topology.from_json(
                await transport.request("GET", f"{url}/v1/topology", timeout_s=timeout_s)
            )
            target = topology.nodes[topology.chain_for(queue).head].http_url
            method = "PUT"
        try:
            return await transport.request(
                method, f"{target}/v1/queues/{queue}/retention", timeout_s=timeout_s, body=body
            )
        except KayosError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    finally:
        await transport.close()
