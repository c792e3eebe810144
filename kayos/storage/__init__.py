"""The shard store: an append-only copy-on-write B-tree file per shard (docs/storage-format.md)."""

from __future__ import annotations

from kayos.storage.engine import (
    CommitResult,
    Delete,
    Entry,
    Op,
    Put,
    RecoveryReport,
    ShardStore,
    Snapshot,
    StoreOptions,
)

__all__ = [
    "CommitResult",
    "Delete",
    "Entry",
    "Op",
    "Put",
    "RecoveryReport",
    "ShardStore",
    "Snapshot",
    "StoreOptions",
]
