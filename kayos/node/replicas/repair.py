"""A head whose store opened below its durable mark repairs through the mark before it leads
(docs/replication-protocol.md, "A damaged head repairs first"; docs/node-api.md, "Self-repair").

``repair_from_peers`` asks its downstreams, then the other nodes of the topology (a node outside
the chain answers from the learner it holds of the shard), in turn over ``repair`` links until the
store holds the mark's seq, then leads. It never leads with less: a downstream may hold less than
the head had committed (a learner of it, just made a member, or one cut itself), and a chain of
one has no member to ask. While no node holds that much it keeps asking, with backoff.
"""

from __future__ import annotations

import asyncio
import logging

from kayos import limits
from kayos.errors import KayosError
from kayos.node.replicas import learners
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.logic import durablemark
from kayos.replication.shard.replica import ShardReplica
from kayos.topology import Topology

log = logging.getLogger("kayos.node")


def below_mark(replica: ShardReplica) -> bool:
    """A head repairing a store that holds less than its durable mark."""
    if replica.role != "head" or not replica.repairing:
        return False
    return replica.store.last_seq < durablemark.read(replica.store_path)


def peers_of(replica: ShardReplica, topology: Topology) -> tuple[str, ...]:
    """Whom to ask: the head's downstreams first (members), then every other node."""
    others = sorted(n for n in topology.nodes if n != replica.node_id)
    return (*replica.downstreams, *(n for n in others if n not in replica.downstreams))


async def repair_from_peers(replica: ShardReplica, peers: tuple[str, ...]) -> None:
    goal = durablemark.read(replica.store_path)
    log.warning(
        "shard %s: head's store lost a suffix (%s): re-fetching through %s from %s before serving",
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
