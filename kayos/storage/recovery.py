"""Opening a store: picking the newest data file, creating a first one, cutting a torn tail
after the last valid header and catching the derived index up with the file.

Separate from the engine because it runs once per open, before any commit or read; ``ShardStore``
takes these methods from ``StoreRecovery`` and ``ShardStore.open`` runs them.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING

from kayos import limits
from kayos.storage.core import StoreCore
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import (
    SNAPSHOT_SUFFIX,
    Current,
    DataFile,
    data_file_name,
    find_last_header,
    header_end,
    parse_generation,
)
from kayos.storage.disk.index import DerivedIndex

if TYPE_CHECKING:
    from kayos.storage.disk.fileops import FileHandle

log = logging.getLogger("kayos.storage")


class StoreRecovery(StoreCore):
    """The open and recovery steps of ``ShardStore`` (kayos.storage.engine)."""

    def _open(self) -> None:
        ops = self._ops
        ops.makedirs(self.directory)
        generations: list[int] = []
        for name in ops.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if name.endswith((".compact", ".init", SNAPSHOT_SUFFIX)):
                ops.unlink(path)  # a compaction, creation or snapshot copy that never finished
                continue
            generation = parse_generation(name)
            if generation is not None:
                generations.append(generation)
        if not generations:
            self._create(1)
            generations = [1]
        generation = max(generations)
        for old in generations:
            if old != generation:
                ops.unlink(os.path.join(self.directory, data_file_name(old)))
        handle = ops.open(os.path.join(self.directory, data_file_name(generation)))
        try:
            self._load(handle, generation)
        except BaseException:
            handle.close()  # a failed open keeps nothing open
            raise

    def _load(self, handle: FileHandle, generation: int) -> None:
        block_pos, header = find_last_header(handle)
        end = header_end(handle, block_pos)
        if handle.size() > end:
            self._cut_tail(handle, end)
        data_file = DataFile(handle, generation)
        self._last_header_block = block_pos
        meta = data_file.reader.read_meta(header.meta) if header.meta >= 0 else {}
        self._current = Current(data_file, header, meta)
        self._edge = btree.Edge.from_root(data_file.reader, header.root)
        self._index = DerivedIndex(os.path.join(self.directory, "derived"), header.store_uuid)
        try:
            self._catch_up_index()
        except BaseException:
            self._index.close(clean=False)
            raise

    def _create(self, generation: int) -> None:
        store_uuid = self.options.store_uuid or uuid.uuid4().bytes
        header = fmt.Header(
            store_uuid=store_uuid,
            generation=generation,
            commit_no=0,
            last_seq=0,
            root=None,
            prev_header=-1,
            region_start=0,
            region_crc=0,
            entry_count=0,
            payload_bytes=0,
            superseded_count=0,
            superseded_bytes=0,
            meta=-1,
            min_rollback_seq=0,
            timestamp_ms=int(self._clock.now_s() * 1000),
            file_overhead=1.25,
        )
        data, _, _ = fmt.header_block(0, fmt.encode_header(header))
        final = os.path.join(self.directory, data_file_name(generation))
        temp = final + ".init"
        handle = self._ops.open(temp, create=True)
        try:
            handle.append(data)
            handle.sync()
        finally:
            handle.close()
        self._ops.rename(temp, final)
        self._ops.sync_dir(self.directory)

    def _cut_tail(self, handle: FileHandle, end: int) -> None:
        size = handle.size()
        tail = handle.pread(size - end, end)
        tail_path = handle.path + ".tail"
        saved = self._ops.open(tail_path, create=True)
        try:
            saved.truncate(0)
            saved.append(tail)
            saved.sync()
        finally:
            saved.close()
        handle.truncate(end)
        handle.sync()
        self.recovery.dropped_bytes = size - end
        self.recovery.dropped_from = end
        self.recovery.reason = "bytes after the last valid header (a torn or unsynced commit)"
        log.warning(
            "%s: dropped %d bytes after the last valid header at offset %d (kept in %s)",
            handle.path,
            size - end,
            end,
            tail_path,
        )

    def _catch_up_index(self) -> None:
        index = self._index
        header = self._current.header
        if index.applied_seq > header.last_seq:
            index.reset()
            self.recovery.rebuilt_index = True
        if index.applied_seq == 0 and header.last_seq > 0:
            self.recovery.rebuilt_index = True
        after = index.applied_seq
        if after >= header.last_seq:
            return
        reader = self._current.file.reader
        index.succ.ensure(header.last_seq)
        # Built from nothing (a copied store, a wiped or new index): no entry was applied before
        # a stop, so none is looked up in the index to be skipped.
        empty = after == 0 and index.key_count() == 0
        replayed = 0
        group: list[fmt.Leaf] = []
        entries = 0
        for leaf in btree.iter_leaves(reader, header.root, after, header.last_seq):
            group.append(leaf)
            entries += len(leaf.seqs)
            if entries >= limits.index_rebuild_txn_entries:
                replayed += self._replay_leaves(group, after, empty=empty)
                group, entries = [], 0
        if group:
            replayed += self._replay_leaves(group, after, empty=empty)
        self.recovery.replayed_entries = replayed

    def _replay_leaves(self, leaves: list[fmt.Leaf], after: int, *, empty: bool) -> int:
        """Applies the entries past ``after`` of consecutive ``leaves`` to the derived index in
        one lmdb transaction (an entry applied before a stop is skipped: none is when the
        rebuild began from an ``empty`` index); returns how many it applied."""
        index = self._index
        last_seq = self._current.header.last_seq
        txn = index.begin_write()
        try:
            existing: dict[bytes, tuple[int, int]] = {}
            if not empty:
                keys = {
                    k
                    for leaf in leaves
                    for s, k in zip(leaf.seqs, leaf.keys, strict=True)
                    if s > after
                }
                existing = index.lookup_many(txn, sorted(keys))
            latest: dict[bytes, tuple[int, int]] = {}
            replayed = 0
            for leaf in leaves:
                for seq, key, prev, size, flag in zip(
                    leaf.seqs, leaf.keys, leaf.prevs, leaf.sizes, leaf.flags, strict=True
                ):
                    if seq <= after or flag & fmt.FLAG_COMMIT_MARKER:
                        continue  # a marker is no version of its key; its successor exists
                    current = latest.get(key) or existing.get(key)
                    if current is not None and current[0] >= seq:
                        continue  # already applied before the stop
                    if prev:
                        index.succ.set(prev, seq)
                    latest[key] = (seq, size)
                    replayed += 1
            applied = min(leaves[-1].seqs[-1], last_seq)
            index.write_latest(txn, latest, (), applied)
            index.commit(txn, applied)
        except BaseException:
            txn.abort()
            raise
        return replayed
