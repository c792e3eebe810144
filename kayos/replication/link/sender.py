"""The sending side of one replication link: what goes down it, from memory or read back.

``LinkSender`` keeps what was sent, the link's flow-control window and the metadata the downstream
has been told, and sends batches as they are accepted (``offer``) or, when that could not, from
``run``: the replica's recent batches merged (``merge_batches``), else pieces read back from the
store (``read_range``, ``build_batch``). ``kayos.replication.link.downstream.serve_downstream``
runs one per link. See docs/replication-protocol.md, "BATCH" and "Applying batches".
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import deque
from typing import Any

from kayos import limits
from kayos.errors import CorruptionError
from kayos.replication.link import liveness
from kayos.replication.link.pacer import CopyPacer
from kayos.replication.link.stream import FrameStream, Pulse
from kayos.replication.logic import chain
from kayos.replication.shard.head_writes import concat_columns
from kayos.replication.shard.local_meta import LOCAL_META_PREFIXES
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import frames as fr
from kayos.storage import Entry, ShardStore
from kayos.storage.readback import read_back

# Entries read back per store page when building a BATCH; a page is also the unit a sender reads
# before yielding the event loop.
_SEND_PAGE_ENTRIES = 2_000


def merge_batches(batches: list[fr.Batch]) -> fr.Batch:
    """Consecutive batches of one link as one ``BATCH`` (applied downstream as one commit, so
    every all-or-nothing write in it stays whole)."""
    if len(batches) == 1:
        return batches[0]
    meta: dict[str, Any] | None = None
    for batch in batches:
        if batch.meta is not None:
            meta = {**(meta or {}), **batch.meta}
    first = batches[0]
    # Consecutive valid batches within one frame's bounds (the callers see to it) make a valid
    # batch: no need to check every entry again.
    return fr.Batch.unchecked(
        first.shard,
        first.first_seq,
        batches[-1].last_seq,
        any(b.txn for b in batches),
        tuple(itertools.chain.from_iterable(b.seqs for b in batches)),
        *concat_columns([(b.keys, b.values, b.expiries_ms, b.headers) for b in batches]),
        meta,
    )


def _meta_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name, value in new.items():
        if name.startswith(LOCAL_META_PREFIXES):
            continue
        if old is None or old.get(name) != value:
            changes[name] = value
    if old is not None:
        for name in old:
            if name not in new and not name.startswith(LOCAL_META_PREFIXES):
                changes[name] = None
    return changes


def read_range(
    store: ShardStore,
    after: int,
    upto: int,
    *,
    entries_max: int = limits.batch_entries_max,
    bytes_max: int = limits.batch_bytes_max,
) -> tuple[list[Entry], int, dict[str, Any] | None, bool]:
    """The longest piece of ``(after, upto]`` that fits one ``BATCH`` frame: at most
    ``entries_max`` entries and ``bytes_max`` payload bytes (the bounds of one commit;
    ``limits.frame_bytes_max`` leaves room for their framing), with every version in it except
    those superseded at or below the store's window floor (``last_seq - rollback_window_seqs``):
    the downstream's store then holds what this one does for every seq of the window, so a
    consumer snapshot there as of a commit point inside the piece, or a rollback into it, sees
    what it would see here (docs/replication-protocol.md, "BATCH"). A piece ends only at a
    commit boundary, found from the commit-end flags of every version in the range (superseded
    entries and compaction's markers included: kayos.storage.readback), so an all-or-nothing write
    is never split, even when the entry that ended it was superseded since. Returns the entries,
    the last seq the piece covers, and the metadata as of that seq with whether it is exact
    (docs/replication-protocol.md, "Applying batches"): the map of the newest store header at or
    below it, not the snapshot's, which may be ahead of the piece (a group's mark of a later,
    uncommitted seq then looked written at the piece's last seq). A piece whose end falls inside
    a group commit that changed metadata is cut back to the header below it when it still covers
    a seq there (its map is then exact); else the older map is returned, not exact. None for the
    map: no header at or below the piece's end is within reach (the piece carries no change)."""
    with store.snapshot() as snap:
        floor = snap.boundary - store.options.rollback_window_seqs
        entries, covered = read_back(
            snap, after, upto, floor=floor, entries_max=entries_max, bytes_max=bytes_max
        )
        found = snap.meta_as_of(covered)
        if found is not None and not found.exact and after < found.at:
            # Only read-back pays for this, and only where a group commit changed metadata.
            entries, covered = read_back(
                snap, after, found.at, floor=floor, entries_max=entries_max, bytes_max=bytes_max
            )
            found = snap.meta_as_of(covered)
        if found is None:
            return entries, covered, None, False
        return entries, covered, found.meta, found.exact


def build_batch(
    shard: int, first_seq: int, last_seq: int, entries: list[Entry], meta: dict[str, Any] | None
) -> fr.Batch:
    expiries = tuple(e.expiry_ms for e in entries)
    headers = tuple(e.headers for e in entries)
    return fr.Batch(
        shard,
        first_seq,
        last_seq,
        False,
        tuple(e.seq for e in entries),
        tuple(e.key for e in entries),
        tuple(None if e.deleted else e.value for e in entries),
        expiries if any(expiries) else None,
        headers if any(h is not None for h in headers) else None,
        meta,
    )


class LinkSender:
    """The sending side of one replication link: what was sent, its flow-control window, and
    the metadata the downstream has been told.

    Batches go down two ways: ``offer`` sends an accepted batch at once, from the code that
    accepted it (no task switch between accepting and forwarding), when the link is due for it
    and has room; ``run`` sends whatever ``offer`` could not, from memory while the batch is
    remembered, else read back from the store (durable seqs only)."""

    def __init__(
        self,
        replica: ShardReplica,
        stream: FrameStream,
        sent: int,
        *,
        throttled: bool = False,
        idle_map: bool = False,
    ) -> None:
        self.replica = replica
        self.stream = stream
        self.sent = sent
        # Whether the peer takes METADATA (version 6, not a repair link): an idle link whose map
        # may not be the one as of ``sent`` gets it whole (docs/replication-protocol.md, "The
        # metadata on an idle link").
        self.idle_map = idle_map
        # A learner or repair link: its read-backs take a share of the time, set by a copy pacer,
        # while the shard takes live writes (limits.catchup_produce_share_max to start).
        self.throttled = throttled
        self.pacer = (
            CopyPacer(
                f"shard {replica.shard_id}: copy link",
                replica.clock,
                replica.live_rate,
                limits.catchup_produce_share_max,
                ceiling_mb_per_s=replica.copy_rate_mb_per_s_max,
                reports=replica.copies,
            )
            if throttled
            else None
        )
        self.window = chain.LinkWindow()
        self.acked = Pulse()
        # None until the link's first batch with a map, which is read from the store and
        # carries all of it.
        self.meta_sent: dict[str, Any] | None = None
        # Whether ``meta_sent`` is the map as of ``sent``: a read-back piece's may lag its range
        # (see ``read_range``), and a batch from memory carries only its own changes, so until
        # it is the link reads back.
        self.meta_exact = False
        self.closed = False
        # (last seq, when sent) of the batches not yet acknowledged, oldest first (ACK delays).
        self._sent_at: deque[tuple[int, float]] = deque()

    def offer(self, batch: fr.Batch) -> None:
        # Only on an idle link: under load, batches accepted meanwhile go down merged, one frame
        # for several (fewer frames, wake-ups and reports per message), from ``run``.
        if (
            not self.closed
            and self.meta_exact
            and batch.first_seq == self.sent + 1
            and not self.window.in_flight
        ):
            self._send(batch)

    def _send(self, batch: fr.Batch) -> int:
        if batch.meta and self.meta_sent is not None:
            for name, value in batch.meta.items():
                if value is None:
                    self.meta_sent.pop(name, None)
                else:
                    self.meta_sent[name] = value
        size = self.stream.send(batch)
        self.window.sent(batch.last_seq, size)
        self.sent = batch.last_seq
        self._sent_at.append((batch.last_seq, self.replica.clock.monotonic_s()))
        if len(self._sent_at) > limits.latency_samples_max:
            self._sent_at.popleft()
        return size

    def _send_idle_map(self) -> bool:
        """Sends METADATA, the whole replicated map as of ``sent``, when nothing past ``sent``
        is to be sent and the link's map may not be that one (none sent yet, or one that lags):
        a downstream whose rollback kept its metadata settles without a write
        (docs/replication-protocol.md, "The metadata on an idle link"). False: not due, or not
        yet (the map here is not the one as of ``sent``): wait for a change."""
        replica = self.replica
        if (
            not self.idle_map
            or self.meta_exact
            or self.closed
            or replica.catching_up
            or replica.repairing
            or replica.map_unsettled()
        ):
            return False
        with replica.store.snapshot() as snap:
            if snap.boundary != self.sent:
                return False  # a commit still landing
            meta = {
                name: value for name, value in snap.meta.items() if replica.replicated_meta(name)
            }
        self.stream.send(fr.Metadata(replica.shard_id, self.sent, meta))
        self.meta_sent = dict(meta)
        self.meta_exact = True
        return True

    def note_ack(self, seq: int, health: liveness.LinkHealth) -> None:
        """An ACK (or a tail's COMMITTED) of ``seq``: one delay per batch it covers, each from
        when that batch went out (the downstream's receive, persist and report, plus the wire
        both ways), so batches that waited on a stalled peer all count, not only its last; a
        later report of the same seq finds nothing left to time."""
        now = self.replica.clock.monotonic_s()
        while self._sent_at and self._sent_at[0][0] <= seq:
            health.latency.add(now, (now - self._sent_at.popleft()[1]) * 1000)

    async def run(self) -> None:
        replica = self.replica
        while True:
            if self.sent >= replica.progress.accepted:
                if not self._send_idle_map():
                    await replica.changed.waiter()
                continue
            if not self.window.can_send():
                await self.acked.waiter()
                continue
            recent = replica.recent_run(self.sent + 1) if self.meta_exact else []
            if recent:
                # The fast path: forward what was accepted, merged, no read-back.
                if self.pacer is not None and not self.pacer.report.ended:
                    self.pacer.finish()  # the copy reached what is still in memory
                self._send(merge_batches(recent))
            else:
                upto = replica.durable
                if upto <= self.sent:
                    # Accepted but not yet durable, and not in memory: wait for the store.
                    await replica.changed.waiter()
                    continue
                started = time.perf_counter()
                try:
                    # A copy reads smaller pieces: its commits downstream, and their fsyncs,
                    # stay short beside the chain's on a shared disk.
                    bytes_max = (
                        limits.catchup_piece_bytes_max if self.throttled else limits.batch_bytes_max
                    )
                    read = functools.partial(read_range, bytes_max=bytes_max)
                    if upto - self.sent > _SEND_PAGE_ENTRIES:
                        result = await asyncio.to_thread(read, replica.store, self.sent, upto)
                    else:
                        result = read(replica.store, self.sent, upto)
                except CorruptionError as exc:
                    replica.note_damage(exc)
                    raise
                entries, covered, meta, exact = result
                if replica.map_unsettled():
                    # This replica's map may hold marks of seqs its rollback dropped: none goes
                    # down until its own upstream replaced it.
                    meta, exact = None, False
                # Metadata as of the piece's last seq (never ahead of it: a mark of a later seq
                # would look written here, docs/replication-protocol.md "Applying batches"). The
                # first batch with a map carries all of it, and the downstream replaces its own
                # with it; None (out of reach) carries no change.
                changes: dict[str, Any] | None = None
                if meta is not None:
                    changes = _meta_changes(self.meta_sent, meta)
                    if not changes and self.meta_sent is not None:
                        changes = None  # an empty map only marks a link's first batch
                    self.meta_sent = dict(meta)
                self.meta_exact = exact
                size = self._send(
                    build_batch(replica.shard_id, self.sent + 1, covered, entries, changes)
                )
                if self.pacer is not None:
                    pause_s = self.pacer.decide(time.perf_counter() - started, size)
                    if pause_s > 0:
                        await self.stream.drain()
                        await asyncio.sleep(pause_s)
            await self.stream.drain()
