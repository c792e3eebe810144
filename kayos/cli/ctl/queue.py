"""``kayos ctl queue ...`` (docs/operations.md): the fetching and the printing; what the answers
mean is decided by the pure functions of kayos/cli/ctl/queue_view.py."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import click

from kayos import limits
from kayos.cli.ctl.common import (
    CtlError,
    ask,
    emit,
    live_topology,
    with_transport,
)
from kayos.cli.ctl.options import (
    cluster_nodes_option,
    json_option,
    nodes_option,
    timeout_option,
    topology_option,
)
from kayos.cli.ctl.queue_view import Answer, describe, render_describe, retention_policy

if TYPE_CHECKING:
    from kayos.cli.address import ClusterAddress
    from kayos.client.http import HttpTransport
    from kayos.topology import Topology


@click.group("queue")
def queue_group() -> None:
    """Describe a queue, or change how many shards it spreads over (through the manager)."""


def _checked_name(queue: str) -> str:
    from kayos.errors import KayosError
    from kayos.topology import check_queue_name

    try:
        return check_queue_name(queue)
    except KayosError as exc:
        raise CtlError(str(exc)) from exc


@queue_group.command("describe")
@click.argument("queue")
@topology_option()
@nodes_option
@timeout_option
@json_option
def describe_command(
    queue: str, topology_path: str, cluster: ClusterAddress, timeout_s: float, as_json: bool
) -> None:
    """QUEUE's shards: each one's chain and head, last and committed seq (per member), consumer
    groups with their marks and lag, and retention policy and floor. Exits 0, or 1 naming each
    problem (an unknown queue, a member that did not answer)."""
    _checked_name(queue)
    seeds = list(cluster.urls)

    async def run(transport: HttpTransport) -> dict[str, Any]:
        topology = await live_topology(transport, seeds, timeout_s)
        statuses, reads = await read_queue(transport, topology, queue, timeout_s)
        return describe(queue, topology, statuses, reads)

    emit(asyncio.run(with_transport(run)), as_json, render_describe)


async def read_queue(
    transport: HttpTransport, topology: Topology, queue: str, timeout_s: float
) -> tuple[dict[str, Answer], dict[int, dict[str, Any]]]:
    """Every member's status, then per shard of ``queue`` its groups (with their lag), retention
    and whether it holds an entry of the queue, read from one member that answers (tails first:
    they serve reads)."""
    shard_ids = topology.shards_for(queue)
    nodes = sorted({n for s in shard_ids for n in topology.shards[s].members})
    urls = [f"{topology.nodes[n].http_url}/v1/status" for n in nodes]
    answers = await asyncio.gather(*(ask(transport, "GET", url, timeout_s) for url in urls))
    statuses = dict(zip(nodes, answers, strict=True))

    async def read_shard(shard_id: int) -> tuple[int, dict[str, Any]]:
        chain = topology.shards[shard_id]
        order = [*chain.tails, *reversed(chain.chain)]
        for node in dict.fromkeys(order):
            if isinstance(statuses.get(node), str):
                continue
            base = topology.nodes[node].http_url
            query = f"shard={shard_id}"
            retention = await ask(
                transport, "GET", f"{base}/v1/queues/{queue}/retention?{query}", timeout_s
            )
            if isinstance(retention, str):
                continue
            listed = await ask(transport, "GET", f"{base}/v1/shards/{shard_id}/groups", timeout_s)
            floor = int(retention.get("floor") or 0)
            page_url = f"{base}/v1/queues/{queue}/consume?group=_read&after={floor}&limit=1&{query}"
            page = await ask(transport, "GET", page_url, timeout_s)
            names = []
            if isinstance(listed, dict):
                names = [g["group"] for g in listed.get("groups", []) if g.get("queue") == queue]
            infos = await asyncio.gather(
                *(
                    ask(transport, "GET", f"{base}/v1/queues/{queue}/groups/{g}?{query}", timeout_s)
                    for g in names
                )
            )
            return shard_id, {
                "member": node,
                "retention": retention,
                "groups": listed,
                "group_info": dict(zip(names, infos, strict=True)),
                "page": page,
            }
        return shard_id, {}

    reads = dict(await asyncio.gather(*(read_shard(s) for s in shard_ids)))
    return statuses, reads


# --- kayos ctl queue create / alter --------------------------------------------------------------

_shards_option = click.option(
    "--shards",
    type=click.IntRange(min=1),
    required=True,
    help="How many shards the queue spreads over (at most the cluster's shard count).",
)
_wait_option = click.option(
    "--timeout",
    "wait_s",
    type=click.FloatRange(min=0.001),
    default=limits.ctl_queue_apply_timeout_ms_default / 1000,
    show_default=True,
    help="Seconds to wait for every node to run the new topology.",
)


@queue_group.command("create")
@click.argument("queue")
@_shards_option
@click.option("--max-age-ms", type=click.IntRange(min=1), help="Retention: drop entries older.")
@click.option("--max-bytes", type=click.IntRange(min=1), help="Retention: keep at most this.")
@click.option(
    "--until-consumed", is_flag=True, help="Retention: drop what every group has consumed."
)
@topology_option("its secret signs the request to its [managers], which are asked")
@cluster_nodes_option
@_wait_option
@json_option
def create_command(
    queue: str,
    shards: int,
    max_age_ms: int | None,
    max_bytes: int | None,
    until_consumed: bool,
    topology_path: str,
    cluster: ClusterAddress,
    wait_s: float,
    as_json: bool,
) -> None:
    """Create QUEUE over --shards shards (through the cluster manager), optionally with a
    retention policy set on every shard. Refused for a queue the cluster already has. Exits 0 once
    every node runs it, else 1 with the reason."""
    policy = retention_policy(max_age_ms, max_bytes, until_consumed)
    result = _change(
        queue, shards, topology_path, cluster, wait_s, create=True, policy=policy or None
    )
    emit(result, as_json, _render_change)


@queue_group.command("alter")
@click.argument("queue")
@_shards_option
@topology_option("its secret signs the request to its [managers], which are asked")
@cluster_nodes_option
@_wait_option
@json_option
def alter_command(
    queue: str,
    shards: int,
    topology_path: str,
    cluster: ClusterAddress,
    wait_s: float,
    as_json: bool,
) -> None:
    """Add shards to QUEUE: --shards above its count today (never fewer: refused with the
    reason). Keys move between the queue's shards: see docs/operations.md before using it on a
    queue whose per-key order matters. Exits 0 once every node runs it, else 1 with the reason."""
    result = _change(queue, shards, topology_path, cluster, wait_s, create=False, policy=None)
    emit(result, as_json, _render_change)


def _render_change(result: dict[str, Any]) -> str:
    if not result["ok"]:
        return f"queue {result['op'].removeprefix('queue-')} {result['queue']} failed: " + str(
            result["error"]
        )
    verb = "created" if result["op"] == "queue-create" else "altered"
    counts = f"{result['shards']}"
    if result["op"] == "queue-alter":
        counts = f"{result['previous']} -> {result['shards']}"
    return (
        f"{verb} queue {result['queue']}: {counts} shard(s) {result['shard_ids']}, topology "
        f"epoch {result['epoch']}, every node runs it"
    )


def _change(
    queue: str,
    shards: int,
    topology_path: str,
    cluster: ClusterAddress,
    wait_s: float,
    *,
    create: bool,
    policy: dict[str, Any] | None,
) -> dict[str, Any]:
    """Checks what the nodes can tell (the queue's existence, the shard count), asks the manager,
    waits for every node to run the new count, then sets retention on the shards that need it."""
    from kayos.client.operator import post_operator
    from kayos.errors import KayosError
    from kayos.manager.member.config import load

    _checked_name(queue)
    op = "queue-create" if create else "queue-alter"
    try:
        setup = load(topology_path)
    except KayosError as exc:
        raise CtlError(f"{topology_path}: {exc}") from exc
    if not setup.members:
        raise CtlError(f"{topology_path}: no [managers]: a queue's shards change through them")
    seeds = list(cluster.urls)
    found = _as_it_is(queue, seeds, create=create)
    previous = found["shard_count"]
    result = asyncio.run(post_operator(setup.identity, [m.http_url for m in setup.members], {
        "op": op, "queue": queue, "shards": shards,
    }))  # fmt: skip
    result.update(queue=queue, previous=None if create else previous)
    if not result["ok"]:
        return {**result, "shards": shards, "shard_ids": [], "applied": False, "exit_code": 1}

    async def after(transport: HttpTransport) -> dict[str, Any]:
        applied = await wait_applied(transport, seeds, queue, shards, wait_s)
        if not applied["applied"]:
            return applied
        topology = applied.pop("topology")
        ids = list(topology.shards_for(queue))
        wanted = policy
        if wanted is None and not create and found["shards"]:
            first = found["shards"][0].get("retention") or {}
            wanted = first.get("policy")
        fresh = ids if create else ids[previous:]
        retention = await set_retention(transport, topology, queue, fresh, wanted)
        return {**applied, "shard_ids": ids, "retention": retention}

    outcome = asyncio.run(with_transport(after))
    failed = [
        f"shard {s}: {r}" for s, r in (outcome.get("retention") or {}).items() if isinstance(r, str)
    ]
    error = outcome.get("error") or ("; ".join(failed) if failed else None)
    ok = outcome["applied"] and not failed
    return {
        **result,
        **outcome,
        "ok": ok,
        "error": error,
        "shards": shards,
        "shard_ids": outcome.get("shard_ids", []),
        "exit_code": 0 if ok else 1,
    }


def _as_it_is(queue: str, seeds: list[str], *, create: bool) -> dict[str, Any]:
    """What the nodes tell of ``queue`` before a change (``describe``'s summary); ``CtlError`` if
    they cannot tell whether it exists, or if it does (``create``) or does not (alter)."""
    timeout_s = limits.ctl_status_timeout_ms_default / 1000

    async def before(transport: HttpTransport) -> dict[str, Any]:
        topology = await live_topology(transport, seeds, timeout_s)
        statuses, reads = await read_queue(transport, topology, queue, timeout_s)
        return describe(queue, topology, statuses, reads)

    found: dict[str, Any] = asyncio.run(with_transport(before))
    unanswered = [p for p in found["problems"] if p.endswith("no member answered")]
    if unanswered:
        raise CtlError(f"cannot tell whether queue {queue!r} exists: {'; '.join(unanswered)}")
    if create and found["known"]:
        raise CtlError(
            f"queue {queue!r} already exists ({found['shard_count']} shard(s), "
            f"{_holding(found)}): use queue alter"
        )
    if not create and not found["known"]:
        raise CtlError(found["problems"][0] + ": use queue create")
    return found


def _holding(found: dict[str, Any]) -> str:
    held = []
    if any(s["has_entries"] for s in found["shards"]):
        held.append("entries")
    if found["groups"]:
        held.append("consumer groups " + ", ".join(found["groups"]))
    if any((s["retention"] or {}).get("policy") for s in found["shards"]):
        held.append("a retention policy")
    return "holds " + ", ".join(held) if held else "named in the topology"


async def wait_applied(
    transport: HttpTransport, seeds: list[str], queue: str, shards: int, wait_s: float
) -> dict[str, Any]:
    """Polls every node's ``GET /v1/topology`` until each runs ``shards`` for ``queue`` (or
    ``wait_s`` ran out): ``{"applied", "epoch", "nodes": {node: epoch or why not}, "topology"}``."""
    from kayos.errors import KayosError
    from kayos.topology import Topology

    timeout_s = limits.ctl_status_timeout_ms_default / 1000
    deadline = time.monotonic() + wait_s
    nodes: dict[str, Any] = {}
    while True:
        topology = await live_topology(transport, seeds, timeout_s)
        urls = {n.id: n.http_url for n in topology.nodes.values()}

        async def one(url: str) -> Topology | str:
            try:
                reply = await transport.request("GET", f"{url}/v1/topology", timeout_s=timeout_s)
                return Topology.from_json(reply)
            except KayosError as exc:
                return f"{type(exc).__name__}: {exc}"

        answers = await asyncio.gather(*(one(url) for url in urls.values()))
        nodes = {
            node: answer if isinstance(answer, str) else answer.epoch
            for node, answer in zip(urls, answers, strict=True)
        }
        runs = [
            a for a in answers if not isinstance(a, str) and a.queue_shard_count(queue) == shards
        ]
        if len(runs) == len(answers):
            newest = max(runs, key=lambda t: t.epoch)
            return {"applied": True, "epoch": newest.epoch, "nodes": nodes, "topology": newest}
        if time.monotonic() >= deadline:
            behind = [n for n, a in zip(urls, answers, strict=True) if a not in runs]
            return {
                "applied": False,
                "nodes": nodes,
                "error": f"committed, but node(s) {', '.join(behind)} do not run it yet "
                f"(after {wait_s:g} s): they catch up on their own",
            }
        await asyncio.sleep(limits.ctl_progress_poll_ms / 1000)


async def set_retention(
    transport: HttpTransport,
    topology: Topology,
    queue: str,
    shard_ids: list[int],
    policy: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """``policy`` set at the head of each of ``shard_ids`` (docs/retention.md): per shard, the
    head's reply or why it failed; None when there is no policy to set."""
    if policy is None or not shard_ids:
        return None
    timeout_s = limits.produce_commit_timeout_ms / 1000 + 5

    async def one(shard: int) -> dict[str, Any] | str:
        head = topology.nodes[topology.shards[shard].head].http_url
        url = f"{head}/v1/queues/{queue}/retention?shard={shard}"
        return await ask(transport, "PUT", url, timeout_s, policy)

    answers = await asyncio.gather(*(one(s) for s in shard_ids))
    return {str(s): a for s, a in zip(shard_ids, answers, strict=True)}


def register(group: click.Group) -> None:
    """Adds the ``queue`` commands to ``kayos ctl``."""
    group.add_command(queue_group)
