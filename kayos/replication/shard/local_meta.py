"""A replica's own keys in its store's metadata, and the takeover table's packing.

A store's metadata map holds replicated keys (a consumer group's mark: a head commit writes it and
the chain copies it down) and keys that belong to the one replica that wrote them, never sent down
a link nor restored by a rollback: the ones named here, the durable mark's
``kayos.replication.logic.durablemark.ALONE_META_KEY`` and the counted followers'
``kayos.replication.logic.followers.FOLLOWERS_META_KEY``. ``LOCAL_META_PREFIXES`` tells the two
kinds apart. The takeover table is kept packed under ``TAKEOVER_META_KEY``.
"""

from __future__ import annotations

from typing import Any

import msgpack

from kayos.replication.logic import chain, durablemark, followers

# The takeover table (``pack_takeover``): each master of the history this store holds, with the
# last seq before it took over.
TAKEOVER_META_KEY = "takeover"
# The seq a replica in catch-up must reach before its store holds only whole batches again; kept
# in its own metadata so a replica that restarts mid catch-up still serves no consumers.
CATCH_UP_META_KEY = "catchup"
# The commit point a member below the head last wrote down (every
# limits.commit_point_persist_interval_ms): what a restarted tail may serve consumers before its
# upstream tells it more.
COMMIT_POINT_META_KEY = "commit_point"
# The seq a rollback went back to, written before the rollback and removed once the store restored
# the replicated metadata as of that seq, or, when it could not, once the first BATCH of a later
# link committed (it replaces the map): a group's mark written by a dropped seq must not start a
# snapshot, so meanwhile none is served (docs/replication-protocol.md, "After SUBSCRIBED").
ROLLED_BACK_META_KEY = "rolled_back"
# Metadata names that belong to one replica (``name.startswith(LOCAL_META_PREFIXES)``); every
# other name is replicated.
LOCAL_META_PREFIXES = (
    durablemark.ALONE_META_KEY,
    TAKEOVER_META_KEY,
    CATCH_UP_META_KEY,
    COMMIT_POINT_META_KEY,
    ROLLED_BACK_META_KEY,
    followers.FOLLOWERS_META_KEY,
)


def pack_takeover(table: chain.TakeoverTable) -> bytes:
    """The takeover table as the store keeps it under ``TAKEOVER_META_KEY``."""
    return msgpack.packb([[u, s] for u, s in table], use_bin_type=True)


def unpack_takeover(raw: Any) -> chain.TakeoverTable:
    """The takeover table kept as ``raw`` (none kept: empty)."""
    if not isinstance(raw, bytes):
        return []
    return [(bytes(u), int(s)) for u, s in msgpack.unpackb(raw, raw=False)]
