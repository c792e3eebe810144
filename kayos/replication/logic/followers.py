"""Catch-up followers counted in a tail's commit (docs/replication-protocol.md, "Counting a
catch-up follower"): what the store records, and what a replica keeps of it when it opens.

Pure: the replica (``kayos.replication.shard.replica.ShardReplica``) reads and writes the record.
"""

from __future__ import annotations

from typing import Any

# The store's local metadata key (never sent down a link): {"node": id, "followers": [ids]}.
FOLLOWERS_META_KEY = "counted_followers"


def record(node_id: str, followers: tuple[str, ...]) -> dict[str, Any] | None:
    """The metadata value for ``followers`` counted by ``node_id`` (None: the key removed)."""
    if not followers:
        return None
    return {"node": node_id, "followers": sorted(followers)}


def kept(
    raw: Any, node_id: str, members: tuple[str, ...], downstreams: tuple[str, ...]
) -> tuple[str, ...]:
    """The recorded followers a replica opening at its chain position goes on counting: none
    once it has a downstream (the manager made a new chain: a follower joined, or the catch-up
    moved to another tail), none that is now a member, none of a record made by another node
    (a store copied by snapshot)."""
    if downstreams or not isinstance(raw, dict) or raw.get("node") != node_id:
        return ()
    names = raw.get("followers")
    if not isinstance(names, list):
        return ()
    return tuple(
        sorted({n for n in names if isinstance(n, str) and n not in members and n != node_id})
    )
