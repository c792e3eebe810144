"""The shard store: an append-only copy-on-write B-tree file per shard (docs/storage-format.md).

The store itself lives here (``ShardStore`` in ``engine``, written in parts: ``core``, ``commit``,
``rollback``, ``recovery``; with ``batch``, ``group``, ``reads``, ``readback`` and ``records``
around it); what lies on disk, with no store around it, in ``disk/``; the check, compaction,
salvage and retention rules that look after a store from outside its commit path in
``maintenance/``. Importing this package loads the store, not its maintenance.
"""

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
