"""A head that lost committed entries steps down to repair (docs/replication-protocol.md, "An
upstream that lacks committed entries").

``serve_downstream`` finds it (``chain.upstream_lacks_committed`` on a chain downstream's
``SUBSCRIBE``); ``step_down_to_repair`` stops the head's writes at once, and a background task then
drops what the head holds past the agreed seq, raises the durable mark to the commit point the
downstream named and has the node re-make the replica: the re-made store opens below its mark
and re-fetches from its downstream before it leads
(``kayos.node.replicas.learners.repair_then_lead``).
"""

from __future__ import annotations

import logging

from kayos.errors import KayosError, UnavailableError
from kayos.replication.logic import chain
from kayos.replication.shard.replica import ShardReplica

log = logging.getLogger("kayos.replication")


def step_down_to_repair(replica: ShardReplica, node: str, agreed: int, point: int) -> str:
    """Stops the head's writes and starts its repair; returns why (for the downstream's
    ``unavailable`` answer). Once started, a second finding changes nothing."""
    reason = (
        f"downstream {node} knows seqs through {point} committed, but this head's log agrees "
        f"with it only through {agreed} (it holds {replica.durable}): it lost committed entries"
    )
    if replica.repairing or replica.damage_seen is not None:
        return reason
    own = max(replica.commit_point, replica.marked_committed)
    if not chain.may_drop_past(agreed, replica.commit_point, marked=replica.marked_committed):
        # Both hold committed seqs the other lacks (a chain of this member alone committed past
        # the agreed seq, maybe before a re-make): dropping either side's loses acknowledged
        # entries. Neither is.
        reason += (
            f"; it also knows its own seqs through {own} committed: both "
            "histories hold acknowledged entries, so neither is dropped (an operator decides)"
        )
        log.error("shard %s: %s", replica.shard_id, reason)
        return reason
    log.error("shard %s: %s; re-fetching them before it leads", replica.shard_id, reason)
    replica.repairing = True
    replica.repair_problem = reason
    replica.forget_producers()  # the repair changes the store under them
    replica.fail_pending(
        UnavailableError(f"shard {replica.shard_id}: head {replica.node_id} is repairing: {reason}")
    )
    replica.run_in_background(_prepare(replica, agreed, point, reason))
    return reason


async def _prepare(replica: ShardReplica, agreed: int, point: int, reason: str) -> None:
    """Waits out the head's commits under way, rolls back past ``agreed`` (never committed:
    it disagrees with committed seqs), records ``point`` in the durable mark and asks for the
    re-make (``damage_seen``: the node's loop re-makes such a replica)."""
    try:
        await replica.wait_for_writer()
        await replica.settle()
        if replica.store.last_seq > agreed:
            await replica.rollback(agreed)
        await replica.set_durable_mark(point)
    except (KayosError, OSError) as exc:
        # Re-made all the same: its salvage and the mark it has decide; the next SUBSCRIBE that
        # finds it short starts this again.
        log.error("shard %s: preparing the repair failed: %s", replica.shard_id, exc)
    replica.damage_seen = reason
