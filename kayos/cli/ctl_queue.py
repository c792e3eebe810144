"""``kayos ctl queue ...`` (docs/operations.md): the fetching and the printing; what the answers
mean is decided by the pure functions of kayos/cli/queue_view.py."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import click

from kayos.cli.ctl_ops import (
    CtlError,
    _json_option,
    _seed_urls,
    _timeout_option,
    _topology_option,
    _url_option,
    ask,
    emit,
    live_topology,
    with_transport,
)
from kayos.cli.queue_view import Answer, describe, render_describe

if TYPE_CHECKING:
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
@_topology_option
@_url_option
@_timeout_option
@_json_option
def describe_command(
    queue: str, topology_path: str, urls: tuple[str, ...], timeout_s: float, as_json: bool
) -> None:
    """QUEUE's shards: each one's chain and head, last and committed seq (per member), consumer
    groups with their marks and lag, and retention policy and floor. Exits 0, or 1 naming each
    problem (an unknown queue, a member that did not answer)."""
    _checked_name(queue)
    seeds = _seed_urls(topology_path, urls)

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


def register(group: click.Group) -> None:
    """Adds the ``queue`` commands to ``kayos ctl``."""
    group.add_command(queue_group)
