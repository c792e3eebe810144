"""The group commit: how a batch gets from ``commit`` into the file.

Any number of threads may call ``commit`` at once. Each batch is checked and queued; one caller
becomes the leader and writes every queued batch in one group commit (one write, one fdatasync),
the others wait for their result. The leader lays the group out as leaf columns
(kayos.storage.group), looks up what each entry supersedes in the derived index, appends the
tree's new right edge and a header, syncs, and only then installs the new state and updates the
index, which is never ahead of the file.
"""

from __future__ import annotations

import itertools
from itertools import repeat
from operator import lt
from typing import TYPE_CHECKING, Any

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.storage.batch import ops_to_columns, prepare_columns, validate_meta
from kayos.storage.core import StoreCore
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import Current, header_with
from kayos.storage.group import (
    GroupBuild,
    Pending,
    add_stored_values,
    extend_column,
    fill_supersessions,
    seq_problem,
)
from kayos.storage.records import CommitResult

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kayos.storage.records import Op


class GroupCommit(StoreCore):
    """``ShardStore``'s commit path (kayos.storage.engine)."""

    def commit(
        self,
        ops: Sequence[Op],
        *,
        meta: dict[str, Any] | None = None,
        seqs: Sequence[int] | None = None,
        last_seq: int | None = None,
        claim_seq: bool = False,
    ) -> CommitResult:
        """Commits ``ops`` as one all-or-nothing batch, durable when this returns.

        ``meta`` updates shard metadata in the same commit (a value of None removes a key).
        ``seqs`` gives explicit, strictly increasing seqs above ``last_seq`` (replicas applying
        their upstream's batches); otherwise seqs are assigned consecutively.
        ``last_seq`` makes the commit cover the log range up to that seq even where no entry
        holds it (a replica applying a ``BATCH`` whose range ends past its last entry); it must
        lie above the store's last seq and at or above every explicit seq.
        ``claim_seq`` makes a commit without ops take one seq of its own, so a metadata-only
        change (a consumer high-water mark) is a log range a replication link can carry."""
        return self.commit_columns(
            *ops_to_columns(ops), meta=meta, seqs=seqs, last_seq=last_seq, claim_seq=claim_seq
        )

    def commit_columns(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        expiries_ms: Sequence[int] | None = None,
        headers: Sequence[dict[str, bytes] | None] | None = None,
        *,
        meta: dict[str, Any] | None = None,
        seqs: Sequence[int] | None = None,
        last_seq: int | None = None,
        claim_seq: bool = False,
        validated: bool = False,
    ) -> CommitResult:
        """``commit`` for a batch given as columns, without an object per entry: entry i is
        ``keys[i]`` with ``values[i]`` (None: delete the key), ``expiries_ms[i]`` and
        ``headers[i]`` (a column left None is 0 / no headers for every entry). Same atomicity,
        group commit and durability as ``commit``, and the same checks, unless ``validated``
        says the caller ran ``prepare_columns`` on these columns already."""
        columns = prepare_columns(keys, values, expiries_ms, headers, check=not validated)
        validate_meta(meta)
        if seqs is not None:
            if len(seqs) != len(keys):
                raise InvalidRequest("seqs and ops differ in length")
            if not all(map(lt, seqs, itertools.islice(seqs, 1, None))):
                raise InvalidRequest("seqs must be strictly increasing")
        if last_seq is not None and seqs and last_seq < seqs[-1]:
            raise InvalidRequest(f"last_seq {last_seq} is below the explicit seq {seqs[-1]}")
        if claim_seq and (keys or last_seq is not None):
            raise InvalidRequest("claim_seq is for a commit without ops or last_seq")
        self._check_usable()
        # Checked against the last seq as queued: commits that land before this one is built
        # only shrink the gap.
        highest = seqs[-1] if last_seq is None and seqs else last_seq
        store_last_seq = self.last_seq
        if highest is not None and highest - store_last_seq > limits.seq_gap_max:
            raise InvalidRequest(
                f"seq {highest} is more than seq_gap_max ({limits.seq_gap_max}) past the last "
                f"seq {store_last_seq}"
            )
        pending = Pending(columns, meta, seqs, last_seq, claim_seq)
        with self._cv:
            while len(self._queue) >= limits.commit_queue_batches_max:
                self._cv.wait()
            self._queue.append(pending)
            while not pending.done and self._leader_active:
                self._cv.wait()
            if not pending.done:
                self._leader_active = True
        if not pending.done:
            self._lead(pending)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _lead(self, own: Pending) -> None:
        try:
            while not own.done:
                with self._cv:
                    group: list[Pending] = []
                    budget = limits.group_commit_bytes_max
                    while self._queue and (
                        not group or self._queue[0].columns.payload_bytes <= budget
                    ):
                        item = self._queue.popleft()
                        budget -= item.columns.payload_bytes
                        group.append(item)
                    self._cv.notify_all()
                if not group:
                    break
                try:
                    with self._write_lock:
                        self._check_usable()
                        self._commit_group(group)
                except BaseException as exc:
                    for item in group:
                        if not item.done:
                            item.error = exc
                with self._cv:
                    for item in group:
                        item.done = True
                    self._cv.notify_all()
        finally:
            with self._cv:
                self._leader_active = False
                self._cv.notify_all()

    def _build_group(self, group: list[Pending]) -> GroupBuild:
        """Lays out the group's entries as leaf columns (prevs still unset: ``fill_supersessions``
        fills them from the index) and writes the out-of-line values. Fails the batches whose
        explicit seqs no longer lie above the last seq, and leaves them out."""
        current = self._current
        header = current.header
        build = GroupBuild(btree.Appender(current.file.handle.size()), fmt.empty_leaf())
        cols = build.cols
        next_seq = header.last_seq + 1
        for pending in group:
            problem = seq_problem(pending, next_seq)
            if problem is not None:
                pending.error = InvalidRequest(problem)
                pending.done = True
                continue
            build.live += 1
            columns = pending.columns
            count = len(columns.keys)
            first = pending.seqs[0] if pending.seqs else next_seq
            if count:
                start = len(cols.seqs)
                cols.seqs += (
                    range(next_seq, next_seq + count) if pending.seqs is None else pending.seqs
                )
                cols.keys += columns.keys
                cols.sizes += columns.sizes
                if columns.plain:
                    cols.vals += columns.values
                    cols.flags += repeat(0, count)
                else:
                    add_stored_values(build.out, columns.values, cols)
                cols.flags[-1] |= fmt.FLAG_BATCH_END
                cols.expiries = extend_column(cols.expiries, columns.expiries_ms, start, count, 0)
                cols.headers = extend_column(cols.headers, columns.headers, start, count, None)
                build.payload_bytes += columns.payload_bytes
                next_seq = cols.seqs[-1] + 1
            if pending.last_seq is not None:
                next_seq = pending.last_seq + 1
            elif pending.claim_seq:
                next_seq += 1
            pending.result = CommitResult(first, next_seq - 1, header.commit_no + 1)
            if pending.meta:
                build.meta = dict(current.meta) if build.meta is None else build.meta
                for name, value in pending.meta.items():
                    if value is None:
                        build.meta.pop(name, None)
                    else:
                        build.meta[name] = value
        build.last_seq = next_seq - 1
        return build

    def _commit_group(self, group: list[Pending]) -> None:
        build = self._build_group(group)
        if not build.live:
            return
        current = self._current
        header = current.header
        cols = build.cols
        index = self._index
        # The group's newest version of each key; a key that repeats within it keeps its last.
        latest = dict(zip(cols.keys, zip(cols.seqs, cols.sizes, strict=True), strict=True))
        ordered = sorted(latest)  # lmdb's cursor moves forward through sorted keys
        txn = index.begin_write()
        try:
            existing = index.lookup_many(txn, ordered)
            fill_supersessions(build, existing, unique=len(latest) == len(cols.keys))
            edge = self._edge
            root = header.root
            if cols.seqs:
                edge = edge.append(build.out, cols)
                root = edge.write_root(build.out)
            meta_pos = header.meta
            if build.meta is not None:
                meta_pos = build.out.add_chunk(fmt.encode_meta(build.meta))
            new_header = header_with(
                header,
                commit_no=header.commit_no + 1,
                last_seq=max(header.last_seq, build.last_seq),
                root=root,
                entry_count=header.entry_count + len(cols.seqs),
                payload_bytes=header.payload_bytes + build.payload_bytes,
                superseded_count=header.superseded_count + len(build.supersede),
                superseded_bytes=header.superseded_bytes + build.superseded_bytes,
                meta=meta_pos,
                timestamp_ms=int(self._clock.now_s() * 1000),
            )
            # Grown before the write: once the commit is durable, installing it must not fail.
            succ = index.succ
            succ.ensure(new_header.last_seq)
            new_header = self._write_commit(build.out, new_header)
            # Durable. Successors first, so a reader of the new header never sees both versions.
            succ.set_many(build.supersede)
            meta = build.meta if build.meta is not None else current.meta
            # Before the new state is installed: a reader of it finds its metadata's seqs.
            for pending in group:
                if pending.meta and pending.result is not None and pending.error is None:
                    self._meta_seqs.update(dict.fromkeys(pending.meta, pending.result.last_seq))
            self._current = Current(current.file, new_header, meta)
            self._edge = edge
            index.write_latest(txn, latest, (), new_header.last_seq, ordered=ordered)
            index.commit(txn, new_header.last_seq)
        except BaseException:
            txn.abort()
            raise
        self._maybe_checkpoint()

    def _maybe_checkpoint(self) -> None:
        """Every ``index_checkpoint_commits`` commits, asks the background thread to flush the
        derived index (kayos.storage.disk.index: a bound on dirty pages, not a durability point)."""
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint >= self.options.index_checkpoint_commits:
            self._commits_since_checkpoint = 0
            self._index.request_checkpoint()
