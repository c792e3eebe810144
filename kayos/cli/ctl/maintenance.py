"""``kayos ctl compact`` and ``kayos ctl check`` (docs/operations.md): the fetching and the
printing; what the answers mean is decided by the pure functions of kayos/cli/ctl/check_view.py."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from kayos import limits
from kayos.cli.address import deprecated_option
from kayos.cli.ctl.check_view import (
    compact_summary,
    digest_range,
    judge,
    render_check,
    render_compact_line,
)
from kayos.cli.ctl.common import (
    CtlError,
    ask,
    emit,
    identity_of,
    live_topology,
    with_transport,
)
from kayos.cli.ctl.options import json_option, nodes_option, timeout_option, topology_option

if TYPE_CHECKING:
    from kayos.cli.address import ClusterAddress
    from kayos.client.http import HttpTransport
    from kayos.identity import ClusterIdentity
    from kayos.topology import Topology


# --- kayos ctl compact ---------------------------------------------------------------------------


@click.command()
@click.option(
    "--node", "nodes", multiple=True, help="Compact this node's stores only (repeatable)."
)
@click.option(
    "--shard", "shards", type=int, multiple=True, help="Compact this shard only (repeatable)."
)
@topology_option("its secret signs the compaction requests")
@nodes_option
@timeout_option
@click.option(
    "--no-wait",
    "no_wait",
    is_flag=True,
    help="Start the compactions and return instead of following them until each is done.",
)
@click.option(
    "--wait-timeout",
    "wait_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_compact_timeout_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for every compaction to finish while following them.",
)
@deprecated_option(
    "--wait",
    "old_wait_s",
    type=click.FloatRange(min=0.0),
    default=None,
    replacement="--wait-timeout SECONDS (--no-wait for 0)",
)
@json_option
def compact(
    nodes: tuple[str, ...],
    shards: tuple[int, ...],
    topology_path: str,
    cluster: ClusterAddress,
    timeout_s: float,
    no_wait: bool,
    wait_s: float,
    old_wait_s: float | None,
    as_json: bool,
) -> None:
    """Compact shard stores now: every replica of every node, or those of --node and --shard.
    Shows each store's progress, then its bytes before and after. Exits 0 when every compaction
    finished, 1 if one failed, a node could not be reached or --wait-timeout ran out."""
    if old_wait_s is not None:
        wait_s, no_wait = old_wait_s, no_wait or old_wait_s == 0
    if no_wait:
        wait_s = 0.0
    identity = identity_of(topology_path)
    seeds = list(cluster.urls)
    echo = None if as_json else click.echo

    async def run(transport: HttpTransport) -> dict[str, Any]:
        topology = await live_topology(transport, seeds, timeout_s)
        plan = compaction_plan(topology, nodes, shards)
        return await run_compactions(transport, topology, identity, plan, timeout_s, wait_s, echo)

    result = asyncio.run(with_transport(run))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for line in result["lines"]:
            click.echo(line)
    sys.exit(0 if result["ok"] else 1)


def compaction_plan(
    topology: Topology, nodes: tuple[str, ...], shards: tuple[int, ...]
) -> dict[str, list[int]]:
    """node -> the shards of it to compact (refusing an unknown node or shard, or a pair that
    names nothing)."""
    unknown = [n for n in nodes if n not in topology.nodes]
    if unknown:
        raise CtlError(
            f"unknown node(s) {', '.join(unknown)}: the topology has {', '.join(topology.nodes)}"
        )
    bad = [s for s in shards if s not in topology.shards]
    if bad:
        raise CtlError(
            f"unknown shard(s) {', '.join(map(str, bad))}: the topology has shards "
            f"0..{len(topology.shards) - 1}"
        )
    plan: dict[str, list[int]] = {}
    for node in nodes or tuple(topology.nodes):
        held = [s.id for s in topology.shards_of(node) if not shards or s.id in shards]
        if held:
            plan[node] = held
    if not plan:
        raise CtlError(
            f"no store to compact: node(s) {', '.join(nodes)} hold none of shard(s) "
            f"{', '.join(map(str, shards))}"
        )
    return plan


async def run_compactions(
    transport: HttpTransport,
    topology: Topology,
    identity: ClusterIdentity,
    plan: dict[str, list[int]],
    timeout_s: float,
    wait_s: float,
    echo: Callable[[str], None] | None,
) -> dict[str, Any]:
    from kayos.signing import sign

    urls = {node: topology.nodes[node].http_url for node in plan}

    async def start(node: str) -> dict[str, Any] | str:
        status = await ask(transport, "GET", f"{urls[node]}/v1/status", timeout_s)
        if isinstance(status, str):
            return status
        body = {"epoch": int(status["epoch"]), "shards": plan[node]}
        message = {"body": body, "mac": sign(identity, "compact", body)}
        return await ask(transport, "POST", f"{urls[node]}/v1/admin/compact", timeout_s, message)

    started = dict(zip(plan, await asyncio.gather(*(start(n) for n in plan)), strict=True))
    errors = {node: answer for node, answer in started.items() if isinstance(answer, str)}
    jobs: dict[tuple[str, int], dict[str, Any]] = {}
    shown: dict[tuple[str, int], str] = {}
    deadline = time.monotonic() + wait_s
    live = [node for node in plan if node not in errors]
    while live:
        answers = await asyncio.gather(
            *(ask(transport, "GET", f"{urls[n]}/v1/admin/compact", timeout_s) for n in live)
        )
        for node, answer in zip(live, answers, strict=True):
            if isinstance(answer, str):
                continue  # asked again next round; reported if it never answers
            for job in answer.get("jobs", []):
                if job.get("shard") in plan[node]:
                    jobs[(node, int(job["shard"]))] = job
        for key in sorted(jobs):
            line = render_compact_line(key[0], jobs[key])
            if echo is not None and shown.get(key) != line:
                echo(line)
                shown[key] = line
        finished = {
            n
            for n in live
            if all(jobs.get((n, s), {}).get("state") in ("done", "failed") for s in plan[n])
        }
        live = [n for n in live if n not in finished]
        if not live or time.monotonic() >= deadline:
            break
        await asyncio.sleep(limits.ctl_progress_poll_ms / 1000)
    return compact_summary(plan, jobs, errors, waited=wait_s > 0)


# --- kayos ctl check -----------------------------------------------------------------------------


@click.command()
@topology_option()
@nodes_option
@timeout_option
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    help="The replica count every chain must have (default: the longest chain of the topology).",
)
@click.option(
    "--digest-seqs",
    type=click.IntRange(min=0, max=limits.shard_digest_seqs_max),
    default=limits.shard_digest_seqs_max,
    show_default=True,
    help="Compare each shard's members over at most this many seqs below their common "
    "commit point (0: skip the comparison).",
)
@click.option(
    "--read-timeout",
    "read_timeout_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_check_read_timeout_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for one digest or store check (they read a store).",
)
@json_option
def check(
    topology_path: str,
    cluster: ClusterAddress,
    timeout_s: float,
    replicas: int | None,
    digest_seqs: int,
    read_timeout_s: float,
    as_json: bool,
) -> None:
    """An online consistency check of the cluster: every node reachable, every chain complete,
    each shard's members agreeing on their committed entries, every store passing its own check.
    Exits 0 when nothing is wrong, 1 naming each problem, 2 when no node could be reached."""
    from kayos.cli.ctl.cluster_read import fetch_summary

    summary = asyncio.run(fetch_summary(list(cluster.urls), timeout_s, cluster.hint()))
    if summary["health"] == "unreachable":
        result = judge(summary, {}, {}, replicas)
    else:

        async def run(transport: HttpTransport) -> tuple[dict[int, Any], dict[str, Any]]:
            return await fetch_consistency(transport, summary, digest_seqs, read_timeout_s)

        digests, stores = asyncio.run(with_transport(run))
        result = judge(summary, digests, stores, replicas)
    emit(result, as_json, render_check)


async def fetch_consistency(
    transport: HttpTransport, summary: dict[str, Any], digest_seqs: int, timeout_s: float
) -> tuple[dict[int, Any], dict[str, Any]]:
    """Per shard, its members' digests over a common range (or why none); per ``node/shard``,
    the store's own check."""
    urls = {node["id"]: node["url"] for node in summary["nodes"] if node["reachable"]}

    async def digests_of(shard: dict[str, Any]) -> tuple[int, Any]:
        members = [m for m in shard["members"] if m["node"] in urls and m["reachable"]]
        if len(members) < 2 or digest_seqs == 0:
            return shard["id"], None
        upto = min(int(m["committed_seq"]) for m in members)

        async def one(node: str, after: int) -> dict[str, Any] | str:
            query = f"after={after}&upto={upto}"
            url = f"{urls[node]}/v1/shards/{shard['id']}/digest?{query}"
            return await ask(transport, "GET", url, timeout_s)

        async def round_at(after: int) -> dict[str, dict[str, Any] | str]:
            answers = await asyncio.gather(*(one(m["node"], after) for m in members))
            return {m["node"]: a for m, a in zip(members, answers, strict=True)}

        probe = await round_at(upto)  # an empty range: each member's floor
        answers = probe
        for _ in range(2):  # a floor may rise between the rounds (a compaction): once more
            after = digest_range(probe, upto, digest_seqs)
            if after is None:
                break  # a member did not answer the probe: the probe's answers say why
            answers = await round_at(after)
            if all(isinstance(a, dict) for a in answers.values()):
                break
            probe = await round_at(upto)
        return shard["id"], {"upto": upto, "answers": answers}

    async def store_of(node: str, shard: int) -> tuple[str, dict[str, Any] | str]:
        url = f"{urls[node]}/v1/shards/{shard}/check"
        return f"{node}/{shard}", await ask(transport, "GET", url, timeout_s)

    pairs = [
        (m["node"], shard["id"])
        for shard in summary["shards"]
        for m in shard["members"]
        if m["node"] in urls and m["reachable"]
    ]
    digests = await asyncio.gather(*(digests_of(s) for s in summary["shards"]))
    stores = await asyncio.gather(*(store_of(n, s) for n, s in pairs))
    return dict(digests), dict(stores)


def register(group: click.Group) -> None:
    """Adds compact and check to ``kayos ctl``."""
    group.add_command(compact)
    group.add_command(check)
