"""The consumer group mark a new snapshot starts at: a committed one (docs/node-api.md, "Consume").

A tail reads a group's mark from its store's metadata, which holds everything the tail has made
durable: past its commit point too (forward, then persist), where a group commit may sit that no
member above holds yet and nobody was told of. Such a mark may be rolled back, and a snapshot
started at it makes the group's next snapshot start lower (docs/campaigns.md, Findings, "a group's
mark moved back under partitions with the manager"). So the mark is read with the seq that wrote
it (the store keeps each metadata key's in memory) and served only once the commit point covers
that seq (``chain.mark_servable``). A replica that rolled back keeps the marks of the seqs it
dropped (its metadata is one map): it serves none until a link has replaced them
(``CatchUp.rolled_back_to``).
"""

from __future__ import annotations

from kayos.errors import UnavailableError
from kayos.replication.logic import chain
from kayos.replication.shard.replica import ShardReplica


def read_mark(replica: ShardReplica, key: str) -> tuple[int, int]:
    """``(mark, written_at)``: the group's mark under metadata ``key`` (0: none), then the seq
    that wrote it (``ShardStore.meta_written_at``; read second, so it is at least that)."""
    mark = int(replica.store.meta.get(key, 0))
    return mark, replica.store.meta_written_at(key)


def not_committed(shard: int, node: str, written_at: int, committed: int) -> str:
    """The ``unavailable`` message of a snapshot refused because its mark may be uncommitted."""
    return (
        f"shard {shard} on {node}: the group's mark here may not be committed yet (written at"
        f" seq {written_at}, committed {committed}); retry"
    )


async def committed_mark(replica: ShardReplica, key: str, node: str, timeout_s: float) -> int:
    """The group's mark a new snapshot may start at: read now, and returned once the commit
    point covers the seq that wrote it, waiting at most ``timeout_s`` for that;
    ``UnavailableError`` (retryable) if it does not get there, or if the replica rolled back
    since a link last replaced its replicated metadata (``CatchUp.rolled_back_to``)."""
    rolled_back = replica.rolled_back_to() if replica.upstream is not None else None
    if rolled_back is not None:
        raise UnavailableError(
            f"shard {replica.shard_id} on {node}: rolled back to seq {rolled_back} and holds no"
            " metadata from its upstream since (its group marks may be from the dropped seqs);"
            " retry"
        )
    mark, written_at = read_mark(replica, key)
    if not chain.mark_servable(replica.progress, written_at):
        await replica.wait_committed(written_at, timeout_s)
        if not chain.mark_servable(replica.progress, written_at):
            raise UnavailableError(
                not_committed(replica.shard_id, node, written_at, replica.commit_point)
            )
    return mark
