"""``kayos ctl``: operating a running cluster. The group, and its ``status``, ``retention`` and
``remove-node``; the fetching is here, what it means is decided by the pure functions of
kayos/cli/ctl/status/. The group's other commands live beside it and are added below."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import click

from kayos import limits
from kayos.cli.address import ClusterAddress, cluster_option
from kayos.cli.ctl.cluster_read import fetch_summary
from kayos.cli.ctl.options import nodes_option, signing_topology_option, topology_option
from kayos.cli.ctl.queue_view import retention_policy
from kayos.cli.ctl.status.manager import with_manager
from kayos.cli.ctl.status.view import render


@click.group()
def ctl() -> None:
    """Look at and operate a running cluster (through the nodes' HTTP API)."""


@ctl.command()
@nodes_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_status_timeout_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for each node's reply.",
)
@topology_option("its [managers] are asked for the manager's view (none when it does not exist)")
@click.option(
    "--manager",
    "manager_urls",
    multiple=True,
    help="A manager member's HTTP base URL (repeatable); overrides --topology's members.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON schema instead.")
def status(
    cluster: ClusterAddress,
    timeout_s: float,
    topology_path: str,
    manager_urls: tuple[str, ...],
    as_json: bool,
) -> None:
    """Topology, every node's reachability, every chain link's state and lag, whether each shard is
    fully replicated, each replica's repair state, each consumer group's lag in messages and
    seconds, the manager's view (leader, epoch, node states;
    its members from the --topology file or --manager) and alerts. Exits 0 when healthy, 1 when
    degraded (any alert), 2 when no node could be reached. See docs/operations.md, "kayos ctl
    status"."""
    from kayos.client.operator import fetch_manager

    managers = _manager_urls(topology_path, manager_urls)
    urls = list(cluster.urls)
    summary = asyncio.run(fetch_summary(urls, timeout_s, cluster.hint(), groups=True))
    answer = asyncio.run(fetch_manager(managers, timeout_s)) if managers else None
    summary = with_manager(summary, answer, managers)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        click.echo(render(summary, click.style if colour else _plain), color=colour)
    sys.exit(summary["exit_code"])


def _plain(text: str, **_: Any) -> str:
    return text


@ctl.command()
@click.argument("queue")
@cluster_option("--url")
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
    cluster: ClusterAddress,
    max_age_ms: int | None,
    max_bytes: int | None,
    until_consumed: bool,
    keep_all: bool,
    timeout_s: float,
) -> None:
    """Show QUEUE's retention policy and floor, or set it (any option; --keep-all clears it).
    Prints the node's JSON reply. See docs/retention.md."""
    policy = retention_policy(max_age_ms, max_bytes, until_consumed)
    if keep_all and policy:
        raise click.UsageError("--keep-all clears the policy; give it alone")
    body = policy if (policy or keep_all) else None
    reply = asyncio.run(_retention_call(list(cluster.urls), queue, body, timeout_s))
    click.echo(json.dumps(reply, indent=2))


async def _retention_call(
    urls: list[str], queue: str, body: dict[str, Any] | None, timeout_s: float
) -> Any:
    """GET from the first of ``urls`` that answers, or PUT at the head of the queue's shard (from
    the topology the first that answers serves)."""
    from kayos.cli.ctl.common import CtlError, live_topology, with_transport
    from kayos.client.http import HttpTransport
    from kayos.errors import KayosError, OperationTimeoutError, UnavailableError

    async def call(transport: HttpTransport) -> Any:
        path = f"/v1/queues/{queue}/retention"
        if body is not None:
            topology = await live_topology(transport, urls, timeout_s)
            head = topology.nodes[topology.chain_for(queue).head].http_url
            try:
                return await transport.request("PUT", head + path, timeout_s=timeout_s, body=body)
            except KayosError as exc:
                raise CtlError(f"{type(exc).__name__}: {exc}") from exc
        errors = []
        for url in urls:
            try:
                return await transport.request("GET", url + path, timeout_s=timeout_s)
            except (UnavailableError, OperationTimeoutError) as exc:  # the next node may answer
                errors.append(f"{type(exc).__name__}: {exc}")
            except KayosError as exc:
                raise CtlError(f"{type(exc).__name__}: {exc}") from exc
        raise CtlError("; ".join(errors))

    return await with_transport(call)


def _manager_urls(topology_path: str, given: tuple[str, ...]) -> list[str]:
    if given:
        return [url.rstrip("/") for url in given]
    if not os.path.exists(topology_path):
        return []
    from kayos.errors import KayosError
    from kayos.manager.member.config import members_from

    try:
        return [member.http_url for member in members_from(topology_path)]
    except KayosError as exc:
        raise click.ClickException(f"{topology_path}: {exc}") from exc


@ctl.command("remove-node")
@click.argument("node")
@signing_topology_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.manager_apply_timeout_ms / 1000,
    show_default=True,
    help="Seconds to wait for the manager to commit the removal.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the reply as JSON.")
def remove_node(node: str, topology_path: str, timeout_s: float, as_json: bool) -> None:
    """Remove NODE from the cluster for good: the manager splices it out of every chain and it
    never rejoins on its own (docs/manager.md). Exits 0 once the manager committed it, 1 if it
    refused or no member could be reached."""
    from kayos.errors import KayosError
    from kayos.manager.member.config import load

    try:
        setup = load(topology_path)
    except KayosError as exc:
        raise click.ClickException(f"{topology_path}: {exc}") from exc
    body = {"node": node}
    from kayos.signing import sign

    message = {"body": body, "mac": sign(setup.identity, "remove-node", body)}
    urls = [member.http_url for member in setup.members]
    result = asyncio.run(_remove(urls, message, timeout_s))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result["ok"]:
        click.echo(f"removed {node}: state {result['state']}, epoch {result['epoch']}")
    else:
        click.echo(f"remove-node {node} failed: {result['error']}", err=True)
    sys.exit(0 if result["ok"] else 1)


@ctl.command("node-exited")
@click.argument("node")
@signing_topology_option
@click.option(
    "--data",
    "data_dir",
    required=True,
    help="The node's data directory (its process wrote its incarnation there).",
)
@click.option(
    "--code",
    default="-1",
    show_default=True,
    help="The process's exit status as its supervisor saw it (systemd's $EXIT_STATUS: a number, "
    "or a signal's name, reported as -1).",
)
def node_exited(node: str, topology_path: str, data_dir: str, code: str) -> None:
    """Tell the manager that NODE's process has exited, as a supervisor that saw it exit does
    (systemd's ExecStopPost, docs/deploy.md): the leader takes it as proof of death, so the new
    head of each shard NODE led takes writes at once (docs/manager.md, "Evidence and proof of
    death"). Exits 0 once the leader took it, 1 if no member did."""
    from kayos.errors import KayosError
    from kayos.local.exits import report_exit
    from kayos.manager.member.config import load

    try:
        setup = load(topology_path)
    except KayosError as exc:
        raise click.ClickException(f"{topology_path}: {exc}") from exc
    urls = [member.http_url for member in setup.members]
    status = int(code) if code.lstrip("-").isdigit() else -1
    outcome = report_exit(setup.identity, urls, node, data_dir, status)
    click.echo(f"node-exited {node}: {outcome}")
    sys.exit(0 if outcome.startswith("reported") else 1)


async def _remove(urls: list[str], message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Tries each member; a follower's ``not_leader`` names the leader, asked next."""
    from kayos.client.http import HttpTransport
    from kayos.errors import KayosError, NotLeaderError

    transport = HttpTransport()
    await transport.open()
    errors: list[str] = []
    queue = list(urls)
    try:
        for _ in range(2 * len(urls) + 1):  # each member, plus a redirect each: bounded
            if not queue:
                break
            url = queue.pop(0)
            try:
                reply = await transport.request(
                    "POST", f"{url}/v1/manager/remove-node", timeout_s=timeout_s, body=message
                )
            except NotLeaderError as exc:
                errors.append(f"{url}: {exc}")
                if exc.redirect:
                    queue.insert(0, exc.redirect)
                continue
            except KayosError as exc:
                errors.append(f"{url}: {exc.code}: {exc}")
                if exc.code in ("invalid_request", "unauthenticated"):
                    break  # every member would say the same
                continue
            if isinstance(reply, dict):
                return {"ok": True, "manager": url, **reply, "error": None}
        return {"ok": False, "error": "; ".join(errors) or "no manager member"}
    finally:
        await transport.close()


def _register_commands() -> None:
    """add-node, drain, move-shard, rebalance live in kayos/cli/ctl/operate.py; compact and check in
    kayos/cli/ctl/maintenance.py; the queue commands in kayos/cli/ctl/queue.py; the credentials
    commands in kayos/cli/ctl/credentials.py; the secret's rotation in kayos/cli/ctl/secret.py."""
    from kayos.cli.ctl import credentials, maintenance, operate, queue, secret

    credentials.register(ctl)
    operate.register(ctl)
    secret.register(ctl)
    maintenance.register(ctl)
    queue.register(ctl)


_register_commands()
