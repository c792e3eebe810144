"""The store's public value types: the ops a batch holds, the entries read back, a commit's
result, the store's options and what recovery found.

Separate from the engine so the modules around it (batch checks, reads, recovery) can name them
without importing the store itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kayos import limits
from kayos.storage.disk import format as fmt


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    expiry_ms: int = 0
    headers: dict[str, bytes] | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


Op = Put | Delete


class Entry(NamedTuple):
    seq: int
    key: bytes
    value: bytes | None  # None for a delete (tombstone)
    expiry_ms: int
    headers: dict[str, bytes] | None
    prev_seq: int  # the version of this key it superseded, 0 if none
    flags: int

    @property
    def deleted(self) -> bool:
        return bool(self.flags & fmt.FLAG_DELETE)


class CommitResult(NamedTuple):
    first_seq: int  # first_seq == last_seq + 1 for a metadata-only commit
    last_seq: int
    commit_no: int


@dataclass(slots=True)
class StoreOptions:
    rollback_window_seqs: int = limits.rollback_window_seqs
    compaction_garbage_ratio: float = limits.compaction_garbage_ratio
    compaction_file_bytes_min: int = limits.compaction_file_bytes_min
    index_checkpoint_commits: int = limits.index_checkpoint_commits
    disk_reserve_bytes: int = limits.disk_reserve_bytes  # 0: no reserve
    store_uuid: bytes | None = None  # for tests; new stores get a random one


@dataclass(slots=True)
class RecoveryReport:
    dropped_bytes: int = 0
    dropped_from: int = -1
    rebuilt_index: bool = False
    replayed_entries: int = 0
    reason: str = ""
