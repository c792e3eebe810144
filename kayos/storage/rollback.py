"""Rollback: dropping every entry after a seq and restoring the state as of that seq.

A rollback writes a header of its own like any commit (docs/storage-format.md, "Rollback"): the
tree's right edge cut back to the seq, the counts of what it dropped and of the versions it made
current again, and the metadata keys the caller asks for as the newest header at or below the seq
held them (kayos.storage.disk.headerwalk). It then takes back the successors and index rows of the
dropped entries; a snapshot whose boundary lies past the seq is invalid from then on.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from kayos import limits
from kayos.errors import InvalidRequest, RollbackTooFarError, StorageError
from kayos.storage.core import StoreCore
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import Current, header_with
from kayos.storage.disk.headerwalk import meta_as_of

if TYPE_CHECKING:
    from collections.abc import Callable


class StoreRollback(StoreCore):
    """``ShardStore``'s rollback (kayos.storage.engine), and what snapshots ask of it."""

    def rollback_to(self, seq: int, restore: Callable[[str], bool] | None = None) -> bool:
        """Drops every entry after ``seq`` and restores the state as of ``seq``: the metadata
        keys ``restore`` names too, from the newest header at or below ``seq`` (the others stay
        as they are). False: that header was not reached (docs/storage-format.md, "Rollback")
        and the metadata stays as it is; True otherwise (nothing to roll back included)."""
        if seq < 0:
            raise InvalidRequest(f"cannot roll back to seq {seq}")
        with self._write_lock:
            self._check_usable()
            current = self._current
            header = current.header
            if seq >= header.last_seq:
                return True
            if seq < header.min_rollback_seq:
                raise RollbackTooFarError(
                    f"cannot roll back to {seq}: compaction kept versions from "
                    f"{header.min_rollback_seq} on"
                )
            try:
                meta = None if restore is None else self._meta_restored(seq, restore)
                self._rollback(seq, meta)
            except OSError as exc:
                raise StorageError(f"rollback failed: {exc}") from exc
            return restore is None or meta is not None

    def _meta_restored(self, seq: int, restore: Callable[[str], bool]) -> dict[str, Any] | None:
        """The metadata after a rollback to ``seq``: the keys ``restore`` names as the newest
        header at or below ``seq`` held them, the others as they are; None if no such header
        is within ``limits.rollback_meta_headers_max`` of the current one."""
        current = self._current
        file = current.file
        found = meta_as_of(
            file.handle,
            file.reader,
            current.header,
            self._last_header_block,
            seq,
            current=current.meta,
            headers_max=limits.rollback_meta_headers_max,
        )
        if found is None:
            return None
        kept = {name: value for name, value in current.meta.items() if not restore(name)}
        return {**{k: v for k, v in found.meta.items() if restore(k)}, **kept}

    def _rollback(self, seq: int, meta: dict[str, Any] | None = None) -> None:
        current = self._current
        header = current.header
        reader = current.file.reader
        succ = self._index.succ
        first_prev: dict[bytes, int] = {}
        removed_count = removed_bytes = unsuperseded_count = unsuperseded_bytes = 0
        for leaf in btree.iter_leaves(reader, header.root, seq, header.last_seq):
            lo = bisect.bisect_right(leaf.seqs, seq)
            for index in range(lo, len(leaf.seqs)):
                entry_seq, size = leaf.seqs[index], leaf.sizes[index]
                removed_count += 1
                removed_bytes += size
                if succ.get(entry_seq):
                    unsuperseded_count += 1
                    unsuperseded_bytes += size
                first_prev.setdefault(leaf.keys[index], leaf.prevs[index])
        restored: dict[bytes, tuple[int, int]] = {}
        for key, prev in first_prev.items():
            if not prev:
                continue
            located = btree.find_entry(reader, header.root, prev)
            if located is None or located[0].flags[located[1]] & fmt.FLAG_COMMIT_MARKER:
                # A retention floor dropped the version this one superseded (docs/retention.md):
                # the key has no version left, so it leaves the index.
                continue
            size = located[0].sizes[located[1]]
            restored[key] = (prev, size)
            unsuperseded_count += 1
            unsuperseded_bytes += size
        edge = btree.Edge.from_root(reader, header.root, upto_seq=seq)
        out = btree.Appender(current.file.handle.size())
        root = edge.write_root(out)
        new_header = header_with(
            header,
            commit_no=header.commit_no + 1,
            last_seq=seq,
            root=root,
            entry_count=header.entry_count - removed_count,
            payload_bytes=header.payload_bytes - removed_bytes,
            superseded_count=header.superseded_count - unsuperseded_count,
            superseded_bytes=header.superseded_bytes - unsuperseded_bytes,
            timestamp_ms=int(self._clock.now_s() * 1000),
        )
        if meta is not None:
            new_header = header_with(new_header, meta=out.add_chunk(fmt.encode_meta(meta)))
        assert (root.count if root else 0) == new_header.entry_count, "rollback counts agree"
        new_header = self._write_commit(out, new_header)
        self._rollbacks.append((len(self._rollbacks), seq))
        for prev, _ in restored.values():
            succ.set(prev, 0)
        succ.clear_from(seq + 1)
        if meta is not None:
            # The metadata is as of ``seq`` now: every key was last changed at or below it as far
            # as a reader can tell, those changed back included, and those unchanged since the
            # store opened (a seq past ``seq`` would wait for a commit point of a dropped seq).
            changed = {k for k in {*meta, *current.meta} if meta.get(k) != current.meta.get(k)}
            self._meta_seqs = {k: min(at, seq) for k, at in self._meta_seqs.items()}
            self._meta_seqs.update(dict.fromkeys(changed, seq))
            self._meta_floor = min(self._meta_floor, seq)
        self._current = Current(current.file, new_header, current.meta if meta is None else meta)
        self._edge = edge
        txn = self._index.begin_write()
        try:
            removed = [key for key in first_prev if key not in restored]
            self._index.write_latest(txn, restored, removed, seq)
            self._index.commit(txn, seq)
        except BaseException:
            txn.abort()
            raise
        self._index.checkpoint()

    def snapshot_invalidated(self, epoch: int, boundary: int) -> bool:
        """Whether a rollback made since ``rollback_epoch`` was ``epoch`` went below ``boundary``:
        a snapshot taken then, with that boundary, no longer reads a consistent state
        (kayos.storage.reads)."""
        return any(e >= epoch and target < boundary for e, target in self._rollbacks)

    @property
    def rollback_epoch(self) -> int:
        """How many rollbacks the store has made since it opened (a snapshot remembers it)."""
        return len(self._rollbacks)
