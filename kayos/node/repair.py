"""A head with no downstream repairs from the nodes outside its chain (docs/replication-protocol.md,
"A damaged head repairs first"; docs/node-api.md, "Self-repair").

A chain of one member alone, whose store opened below its durable mark, has no member to re-fetch
from: ``repair_from_peers`` asks the other nodes of the topology in turn over ``repair`` links (a
node answers from the learner it holds of the shard) until the store holds the mark's seq, then
leads. It never leads with less: while no node holds that much it keeps asking, with backoff.
"""

from __future__ import annotations

import asyncio
import logging

from kayos import limits
from kayos.errors import KayosError
from kayos.node import learners
from kayos.replication import durablemark
from kayos.replication.replica import ShardReplica
from kayos.replication.upstream import UpstreamLink

log = logging.getLogger("kayos.node")


def needs_peers(replica: ShardReplica) -> bool:
    """A head with no downstream whose store holds less than its durable mark."""
    if replica.role != "head" or replica.downstreams or not replica.repairing:
        return False
    return replica.store.last_seq < durablemark.read(replica.store_path)


async def repair_from_peers(replica: ShardReplica, peers: tuple[str, ...]) -> None:
    goal = durablemark.read(replica.store_path)
    log.warning(
        "shard %s: head with no downstream lost a suffix (%s): re-fetching through %s from %s "
        "before serving",
        replica.shard_id,
        replica.repair_problem,
        goal,
        ", ".join(peers) or "no other node",
    )
    delay_ms = limits.link_retry_delay_ms_min
    waited = False
    while replica.store.last_seq < goal:
        for peer in peers:
            link = UpstreamLink(replica, peer=peer, role="repair", until_caught_up=True)
            try:
                await link.attempt()
            except (OSError, KayosError, EOFError) as exc:
                log.info("shard %s: repair from %s: %s", replica.shard_id, peer, exc)
            if replica.store.last_seq >= goal:
                break
        else:
            if not waited:
                waited = True
                log.error(
                    "shard %s: no other node holds seq %s yet (this store holds %s): writes "
                    "stay refused until one does",
                    replica.shard_id,
                    goal,
                    replica.store.last_seq,
                )
            await asyncio.sleep(delay_ms * (0.5 + replica.rng.random()) / 1000)
            delay_ms = min(delay_ms * 2, limits.link_retry_delay_ms_max)
    await learners.repair_then_lead(replica, None)
