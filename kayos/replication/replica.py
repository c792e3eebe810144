"""One shard replica on one node: its store, its commit progress and its replication links.

A thin asyncio driver around the pure decisions of ``kayos.replication.chain``. Store commits run
in worker threads (they fsync); everything else runs on the event loop. See
docs/replication-protocol.md for the frames and rules this follows.

- A member forwards each batch as soon as it takes it in and persists it at the same time
  (forward, then persist): the fsyncs of a chain overlap. Consumers see only what the shard has
  committed (the commit point), never what one member alone holds.
- The two sides of a link live apart: ``kayos.replication.upstream`` (``UpstreamLink``, the
  downstream side, following an upstream) and ``kayos.replication.downstream``
  (``serve_downstream``, the upstream side, feeding a downstream). Both import this module; it
  imports neither.
- Split along its seams: ``kayos.replication.links`` (frames over a stream, error frames, the
  takeover table's packing), ``kayos.replication.head_writes`` (the head's write pipeline and
  the timed store commits) and ``kayos.replication.catchup`` (rollbacks, resets, counted
  learners). This module keeps the replica's state and progress, and re-exports the names
  other modules import from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kayos import limits
from kayos.clock import Clock
from kayos.errors import CorruptionError, KayosError
from kayos.replication import chain, durablemark, followers, liveness, pacing, timeindex
from kayos.replication import frames as fr
from kayos.replication.catchup import ROLLED_BACK_META_KEY, CatchUp
from kayos.replication.head_writes import Columns as Columns
from kayos.replication.head_writes import HeadWrites, _Write
from kayos.replication.links import FrameStream as FrameStream
from kayos.replication.links import Pulse, SendingLink, pack_takeover, unpack_takeover
from kayos.replication.links import error_frame as error_frame
from kayos.storage import CommitResult, ShardStore
from kayos.storage.maintenance.salvage import SalvageReport, salvage
from kayos.topology import ShardChain, Topology

log = logging.getLogger("kayos.replication")

PROTOCOL_VERSION = fr.PROTOCOL_VERSION
TAKEOVER_META_KEY = "takeover"
# Metadata that belongs to one replica, never sent down a link.
# The seq a replica in catch-up must reach before its store holds only whole batches again; kept
# in its own metadata so a replica that restarts mid catch-up still serves no consumers.
CATCH_UP_META_KEY = "catchup"
# The commit point a member below the head last wrote down (every
# limits.commit_point_persist_interval_ms): what a restarted tail may serve consumers before its
# upstream tells it more.
COMMIT_POINT_META_KEY = "commit_point"
_LOCAL_META_PREFIXES = (
    durablemark.ALONE_META_KEY,
    TAKEOVER_META_KEY,
    CATCH_UP_META_KEY,
    COMMIT_POINT_META_KEY,
    ROLLED_BACK_META_KEY,
    followers.FOLLOWERS_META_KEY,
)


def queue_prefix(queue: str) -> bytes:
    return queue.encode() + b"\x00"


def _always() -> bool:
    return True


def _expire(future: asyncio.Future[int]) -> None:
    if not future.done():
        future.set_result(-1)


@dataclass(slots=True)
class _Waiter:
    seq: int
    future: asyncio.Future[int]


class ShardReplica(HeadWrites, CatchUp):
    """One node's member of one shard's chain."""

    def __init__(
        self,
        *,
        node_id: str,
        topology: Topology,
        shard: ShardChain,
        store_path: str,
        clock: Clock,
        rng: random.Random,
        learner_upstream: str | None = None,
        copied: bool = False,
    ) -> None:
        self.node_id = node_id
        self.topology = topology
        self.shard = shard
        self.store_path = store_path
        self.clock = clock
        self.rng = rng
        # A store that fails its check is cut back to what verifies before it opens; the rest is
        # re-fetched from a peer (docs/node-api.md, "Self-repair").
        # (A store copied by snapshot was checked end to end as it came: not walked again.)
        self.salvage_report: SalvageReport | None = None if copied else salvage(store_path)
        self.store = ShardStore.open(store_path, clock=clock)
        if learner_upstream is not None:
            # A copy outside the chain: follows ``learner_upstream``, counts in no commit.
            self.role: str | None = "learner"
            self.upstream: str | None = learner_upstream
            self.downstreams: tuple[str, ...] = ()
        else:
            self.role = shard.role_of(node_id)
            assert self.role is not None, "a replica is a member of its shard"
            self.upstream = shard.upstream_of(node_id)
            self.downstreams = shard.downstreams_of(node_id)
        # A member below the head serves no consumer until its first link to its upstream is
        # subscribed: a node that just joined as tail may hold less than its upstream committed
        # (a group's mark included) until SUBSCRIBED tells it how far behind it is.
        self.upstream_synced = self.upstream is None
        # A repairing member serves no SUBSCRIBE (and a head no write) until it has re-fetched
        # what it lost: a salvaged store, or a member with downstreams whose store cut bytes
        # after its last valid header (a torn commit and a truncated file look the same; its
        # downstreams may hold more and would be told to roll back acknowledged entries).
        torn = bool(self.downstreams) and self.store.recovery.dropped_bytes > 0
        # A store that opened below the durable mark beside it was cut short (a truncated file
        # recovers to an older header and looks merely torn): it lost acknowledged entries.
        self._mark_written = durablemark.read(store_path)
        cut = None if copied else durablemark.cut_short(self._mark_written, self.store.last_seq)
        self.repairing = self.salvage_report is not None or torn or cut is not None
        self.repair_problem = (
            self.salvage_report.problem
            if self.salvage_report is not None
            else cut or (self.store.recovery.reason if torn else "")
        )
        if cut is not None:
            log.error("shard %s: %s: re-fetching from a peer before serving", shard.id, cut)
        # Entries this replica copied in catch-up (below the target its SUBSCRIBED named) since
        # the node started; a read that met a damaged chunk (never served).
        self.refetched_entries = 0
        self.damage_seen: str | None = None
        # Keys in ``downstream_streams`` of learner and repair links (counted in no commit).
        self.copy_links: set[str] = set()
        # When a live batch was last accepted (monotonic s): a copy is paced then.
        self.live_at_s = -1e18
        # Live entries through this member: what the copy pacer watches (kayos.replication.pacing).
        self.live_rate = pacing.LiveRate()
        # Catch-up followers counted in this member's commit, as recorded in its store (a
        # restart keeps them; only the manager's word ends a count), and those counted but not
        # recorded yet (docs/replication-protocol.md, "Counting a catch-up follower").
        raw = self.store.meta.get(followers.FOLLOWERS_META_KEY)
        self.counted_followers: tuple[str, ...] = ()
        if learner_upstream is None:
            self.counted_followers = followers.kept(raw, node_id, shard.members, self.downstreams)
        if raw is not None and raw != followers.record(node_id, self.counted_followers):
            recorded = followers.record(node_id, self.counted_followers)
            self.store.commit([], meta={followers.FOLLOWERS_META_KEY: recorded})
        self._counting: tuple[str, ...] = self.counted_followers
        self._followers_lock = asyncio.Lock()
        self.progress = chain.Progress(
            has_upstream=self.upstream is not None,
            downstreams=(*self.downstreams, *self._counting),
        )
        # Notified whenever the accepted, durable or commit-point seq moves: link senders and
        # long-polling consumers re-check their condition.
        self.changed = Pulse()
        self._waiters: list[tuple[int, int, _Waiter]] = []
        self._waiter_ids = itertools.count()
        # A head serves at once; a replica below it until its first catch-up is done serves no
        # consumers (its store may hold part of an all-or-nothing batch).
        target = self.store.meta.get(CATCH_UP_META_KEY, 0)
        self.catching_up = isinstance(target, int) and self.store.last_seq < target
        self.upstream_stream: FrameStream | None = None
        # Whether this node holds its lease from the manager (kayos/replication/lease.py; the
        # node sets it): a head answers CONFIRM, and serves a snapshot itself, only then.
        self.lease_holds: Callable[[], bool] = _always
        # A head that just took the shard over takes no write before this (monotonic s): the old
        # head's lease ends first (docs/manager.md, "Head leases").
        self.writes_held_until_s = -math.inf
        # A COMMIT_POINT came on the current upstream link (a tail serves only then: see
        # holds_upstream_point).
        self.link_point_heard = False
        self.downstream_streams: dict[str, FrameStream] = {}
        self._links: dict[str, SendingLink] = {}
        # Every link this replica had, by peer: up or down, last heard, lag (status, metrics).
        self.link_health: dict[str, liveness.LinkHealth] = {}
        # Recently committed ranges as ready BATCH frames, by first seq: links forward these
        # instead of reading their entries back from the store. Bounded; a miss falls back to
        # the store, so what is kept here is an optimisation, never the truth.
        self._recent: dict[int, tuple[fr.Batch, int]] = {}
        self._recent_order: deque[tuple[int, int]] = deque()
        self._recent_bytes = 0
        self._writes: deque[_Write] = deque()
        self._writer: asyncio.Task[None] | None = None
        # The head's next seq: seqs are given out when a batch is accepted, before its commit.
        self._next_seq = self.store.last_seq + 1
        # Set when a head commit failed: no seq is given out until a new takeover entry is down.
        self._write_failure: BaseException | None = None
        # The last commit attempt failed for lack of space (docs/retention.md, "Disk full").
        self.disk_full = False
        self._background: set[asyncio.Task[None]] = set()
        # The store commit running in a worker thread, if any: cancelling the task that awaits it
        # does not stop it, so whoever needs the store settled waits for this (``settle``).
        self._commit_in_flight: asyncio.Future[CommitResult] | None = None
        point = self.store.meta.get(COMMIT_POINT_META_KEY, 0)
        self._point_persisted = point if isinstance(point, int) else 0
        # The highest seq that holds an entry (metadata-only commits take seqs too); the consumer
        # lag counts up to here. Unknown after a restart, so it starts at the last seq.
        self.last_entry_seq = self.store.last_seq
        # Told the duration of every store commit, in seconds (the node's latency histogram).
        self.commit_observer: Callable[[float], None] | None = None
        # Seqs this replica's rollbacks and resets dropped since the node started, and of those
        # the ones at or below the commit point it knew then (committed: must stay 0).
        self.rolled_back_entries = 0
        self.rolled_back_committed_entries = 0
        # Upstream orders to roll back past the commit point that this replica refused.
        self.refused_rollbacks = 0
        # When this member took its entries in, sampled (a group's lag in seconds).
        self.time_index = timeindex.load(store_path, self.store.last_seq)
        self._time_index_written_s = clock.monotonic_s()
        # The constructor may run in a worker thread (the node opens stores off its event loop),
        # so it steps the progress without carrying out the actions: nothing is linked and
        # nothing waits yet, and a downstream learns the commit point when it subscribes.
        for event in (
            chain.Durable(self.store.last_seq),
            chain.UpstreamCommitPoint(self._point_persisted),
        ):
            self.progress, _ = chain.step(self.progress, event)
        # A chain of one commits all it holds: its mark says so at once, so a re-make that adds
        # a downstream (commit point 0 again) still knows what it acknowledged (lostcommit).
        alone = learner_upstream is None and self.upstream is None and not self.progress.downstreams
        ran_alone = self.store.meta.get(durablemark.ALONE_META_KEY) is not None
        mark = durablemark.known_on_open(
            self.progress.commit_point, self.store.last_seq, ran_alone=ran_alone
        )
        if mark > self._mark_written and not self.repairing:
            self._write_mark_now(mark)
        if alone and not ran_alone:
            self.store.commit([], meta={durablemark.ALONE_META_KEY: 1})
        elif ran_alone and not alone and (self.repairing or self._mark_written >= mark):
            self.store.commit([], meta={durablemark.ALONE_META_KEY: None})

    @property
    def shard_id(self) -> int:
        return self.shard.id

    @property
    def epoch(self) -> int:
        return self.topology.epoch

    @property
    def committed(self) -> int:
        return self.progress.committed

    @property
    def durable(self) -> int:
        return self.progress.durable

    @property
    def commit_point(self) -> int:
        """The shard's committed seq as this member knows it: what consumers may see here."""
        return self.progress.commit_point

    @property
    def commit_point_persisted(self) -> int:
        """The commit point last written to the store (members below the head; 0 at a head)."""
        return self._point_persisted

    @property
    def marked_committed(self) -> int:
        """The seq the durable mark beside the store names: what this store was known to hold
        committed, across re-makes and restarts (docs/storage-format.md)."""
        return self._mark_written

    def _write_mark_now(self, mark: int) -> None:
        try:
            durablemark.write(self.store_path, mark)
        except OSError as exc:
            log.warning("shard %s: durable mark not written: %s", self.shard_id, exc)
            return
        self._mark_written = mark

    def replicated_meta(self, name: str) -> bool:
        """Whether metadata key ``name`` is replicated (a rollback restores it), not local."""
        return not name.startswith(_LOCAL_META_PREFIXES)

    def takeover_table(self) -> chain.TakeoverTable:
        return unpack_takeover(self.store.meta.get(TAKEOVER_META_KEY))

    async def become_head(self) -> None:
        """A head adds ``(new master uuid, its last seq)`` to the takeover table at start."""
        table = chain.with_takeover(self.takeover_table(), uuid.uuid4().bytes, self.store.last_seq)
        await asyncio.to_thread(
            self.store.commit, [], meta={TAKEOVER_META_KEY: pack_takeover(table)}
        )
        self._next_seq = self.store.last_seq + 1

    # --- progress ------------------------------------------------------------------------------

    def _apply_events(self, *events: chain.Event) -> None:
        for event in events:
            self.progress, actions = chain.step(self.progress, event)
            for action in actions:
                self._carry_out(action)

    def _carry_out(self, action: chain.Action) -> None:
        if isinstance(action, chain.SendCommitted):
            stream = self.upstream_stream
            if stream is not None:
                stream.send(fr.Committed(self.shard_id, action.seq))
        elif isinstance(action, chain.SendAck):
            # An ACK only feeds the upstream's flow control, so it goes after this turn of the
            # event loop: the link senders woken by the same commit forward the batch first.
            stream = self.upstream_stream
            if stream is not None:
                asyncio.get_running_loop().call_soon(self._send_ack, stream, action.seq)
        elif isinstance(action, chain.SendCommitPoint):
            # After this turn of the event loop: the producers and waiters released by the same
            # step answer first (a send wakes the downstream, which may take this CPU).
            asyncio.get_running_loop().call_soon(self._send_commit_point, action)
        elif isinstance(action, chain.CommitPointAdvanced):
            self._release_waiters(action.seq)
            self.changed.notify()
            if self.copy_links:
                # Learner and repair links are no downstreams of the chain: told apart.
                asyncio.get_running_loop().call_soon(self._send_copy_commit_point)
        elif isinstance(action, chain.Violation):
            log.warning("shard %s: downstream %s: %s", self.shard_id, action.node, action.reason)
            bad = self.downstream_streams.pop(action.node, None)
            if bad is not None:
                bad.close()

    def _send_commit_point(self, action: chain.SendCommitPoint) -> None:
        # The point as it is when it goes out (it may have moved on since the step that asked).
        seq = self.progress.commit_point
        if not seq:
            return
        frame = fr.CommitPoint(self.shard_id, seq)
        if action.node is None:
            for stream in self.downstream_streams.values():
                stream.send(frame)
        elif (one := self.downstream_streams.get(action.node)) is not None:
            one.send(frame)

    def _send_copy_commit_point(self) -> None:
        frame = fr.CommitPoint(self.shard_id, self.progress.commit_point)
        for key in self.copy_links:
            stream = self.downstream_streams.get(key)
            if stream is not None:
                stream.send(frame)

    def _send_ack(self, stream: FrameStream, seq: int) -> None:
        if self.upstream_stream is stream:
            stream.send(fr.Ack(self.shard_id, seq))

    def local_commit_done(self) -> None:
        """The store committed more: wake the link senders, step the progress."""
        self.changed.notify()
        self._apply_events(chain.Durable(self.store.last_seq))

    def accept(self, batch: fr.Batch, size_bytes: int, *, live: bool = True) -> None:
        """Takes a batch into the pipeline before its store commit: keeps it for the links and
        forwards it at once on every link that is due for it (forward, then persist). A batch
        not ``live`` (an old one, caught up on) gets no time in the time index."""
        if live:
            self.live_at_s = self.clock.monotonic_s()
            self.live_rate.note(self.live_at_s, len(batch.seqs))
            self.time_index.note(batch.first_seq, batch.last_seq, self.clock.now_s())
        else:
            self.time_index.unknown_from(batch.first_seq, batch.last_seq)
        self.remember(batch, size_bytes)
        self._apply_events(chain.Accepted(batch.last_seq))
        for link in self._links.values():
            link.offer(batch)
        self.changed.notify()

    def commit_point_to_persist(self) -> int | None:
        """The commit point to write down now, or None: only members below the head keep one,
        and only when it moved since it was last written."""
        if self.upstream is None or self.progress.commit_point <= self._point_persisted:
            return None
        return self.progress.commit_point

    async def persist_commit_point(self) -> None:
        """Writes the commit point into the store's local metadata (no seq, never replicated), so
        a restarted tail serves what was committed before it stopped; then the durable mark."""
        point = self.commit_point_to_persist()
        if point is not None:
            await asyncio.to_thread(self.store.commit, [], meta={COMMIT_POINT_META_KEY: point})
            self._point_persisted = max(self._point_persisted, point)
        await self.persist_durable_mark()

    async def persist_durable_mark(self) -> None:
        """Raises the durable mark beside the store (docs/storage-format.md) to what this store
        holds of the committed history; left alone while the store repairs what it lost."""
        mark = min(self.progress.commit_point, self.store.last_seq)
        if self.repairing or mark <= self._mark_written:
            return
        await asyncio.to_thread(self._write_mark_now, mark)

    def lower_durable_mark(self, seq: int) -> None:
        """A rollback to ``seq`` the replica accepted: the mark follows it down."""
        if self._mark_written > seq:
            durablemark.write(self.store_path, seq)
            self._mark_written = seq

    async def persist_time_index(self, *, force: bool = False) -> None:
        """Writes the time index file when it changed, at most every
        ``limits.time_index_persist_interval_ms`` unless ``force``d (the node stops)."""
        now = self.clock.monotonic_s()
        due = now - self._time_index_written_s >= limits.time_index_persist_interval_ms / 1000
        if self.time_index.dirty and (force or due):
            self._time_index_written_s = now
            raw = self.time_index.encode()
            try:
                await asyncio.to_thread(timeindex.write, self.store_path, raw)
            except OSError as exc:
                self.time_index.dirty = True
                log.warning("shard %s: time index not written: %s", self.shard_id, exc)

    def discard_unpersisted(self) -> None:
        """The upstream link ended (and ``settle`` let the last commit land): what was accepted
        but is not durable may never be (the upstream may have lost it). The links below may
        hold it, so they subscribe again and the divergence rule rolls them back to what this
        replica holds."""
        if self.progress.accepted > self.progress.durable:
            self.time_index.truncate_after(self.store.last_seq)
            self._apply_events(chain.Discarded())
            self.forget_recent()
            self.close_downstream_links()

    def downstream_event(self, event: chain.Event) -> None:
        self._apply_events(event)

    def _release_waiters(self, seq: int) -> None:
        while self._waiters and self._waiters[0][0] <= seq:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.future.done():
                waiter.future.set_result(seq)

    async def wait_committed(self, seq: int, timeout_s: float) -> int:
        """The commit point once it reaches ``seq``, or whatever it is after ``timeout_s``."""
        if self.progress.commit_point >= seq or timeout_s <= 0:
            return self.progress.commit_point
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        entry = (seq, next(self._waiter_ids), _Waiter(seq, future))
        heapq.heappush(self._waiters, entry)
        # A timer instead of wait_for(shield(...)): the release wakes this task in one step.
        timer = loop.call_later(timeout_s, _expire, future)
        try:
            await future
        finally:
            timer.cancel()
            if (
                not future.done()
                or future.cancelled()
                or future.exception() is not None
                or future.result() < seq
            ):
                # Timed out or cancelled: a seq that never commits would keep its entry for ever.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                    heapq.heapify(self._waiters)
        return self.progress.commit_point

    async def wait_visible_through(self, seq: int, timeout_s: float) -> None:
        """Returns once the commit point reaches ``seq``, the link upstream is down (no point is
        coming), or ``timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.progress.commit_point < seq and self.upstream_stream is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)

    def holds_upstream_point(self) -> bool:
        """Whether this replica holds every seq its upstream said is committed: on the current
        link once it has sent its commit point, else the last point heard. A tail serves a new
        snapshot only then: one that rejoined behind the shard's commit (a catch-up lag behind),
        or whose link was rebuilt, would otherwise serve a group an older mark than the one the
        group committed (simulator seed 16). A head (no upstream) always does."""
        if self.upstream is None:
            return True
        if self.upstream_stream is not None and not self.link_point_heard:
            return False
        return self.progress.durable >= self.progress.upstream_point

    async def wait_holds_upstream_point(self, timeout_s: float) -> bool:
        """``holds_upstream_point``, waiting for it at most ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.holds_upstream_point():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)
        return True

    async def confirm_chain(self, timeout_s: float) -> bool:
        """Whether the chain above this member is whole now, up to a head that holds its lease:
        a CONFIRM sent on the current upstream link after the call is answered ``held``
        (docs/replication-protocol.md, "Confirming a snapshot"). A member below the head serves a
        new snapshot only then (docs/node-api.md, "Consume"), and answers its own downstream's
        CONFIRM with it. The manager may have spliced it out while it was paused or cut off, and
        the new chain may have committed a group's mark without it: its old upstream closes the
        link when it adopts the new chain (the real-process campaign, seed 11), a cut-off upstream
        cannot answer, and a cut-off part of the old chain, head included, reaches no lease (one
        hop was not enough: a tail cut off with its upstream kept its link). A head answers from
        its lease (always held without a manager). False: refused, or no answer in time."""
        if self.upstream is None:
            return self.lease_holds()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        since_s = self.clock.monotonic_s()
        asked: tuple[FrameStream, int] | None = None
        while True:
            stream = self.upstream_stream
            if stream is not None:
                if asked is None or asked[0] is not stream:
                    try:
                        asked = (stream, stream.confirm(since_s))
                    except Exception:  # the connection is gone: its reader ends the link
                        asked = None
                if asked is not None:
                    verdict = stream.confirmed(asked[1])
                    if verdict is not None:
                        return verdict
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)

    async def wait_visible_past(self, seq: int, timeout_s: float) -> None:
        """Returns once the commit point is past ``seq`` or after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.progress.commit_point <= seq:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)

    # --- repair, and the batches kept for the links --------------------------------------------
    def repair_status(self) -> dict[str, Any] | None:
        """The ``repair`` field of the shard's status: None when the store verified."""
        if self.damage_seen is not None:
            state = "damaged"
        elif self.repairing:
            state = "repairing"
        elif self.repair_problem:
            state = "repaired"
        else:
            return None
        report = self.salvage_report
        return {
            "state": state,
            "problem": self.damage_seen or self.repair_problem,
            "kept_seq": report.kept_seq if report is not None else None,
            "lost_from_offset": report.lost_from_offset if report is not None else None,
            "refetched_entries": self.refetched_entries,
        }

    def note_damage(self, exc: CorruptionError) -> None:
        """A read met a chunk that fails its check: never served; reported until reopened."""
        if self.damage_seen is None:
            log.error(
                "shard %s: store damaged (%s): reads of it fail until the node reopens it, "
                "which salvages it and re-fetches the rest from a peer",
                self.shard_id,
                exc,
            )
        self.damage_seen = str(exc)

    def remember(self, batch: fr.Batch, size_bytes: int) -> None:
        self._recent[batch.first_seq] = (batch, size_bytes)
        self._recent_order.append((batch.first_seq, size_bytes))
        self._recent_bytes += size_bytes
        while self._recent_order and (
            len(self._recent_order) > limits.replica_recent_batches_max
            or self._recent_bytes > limits.replica_recent_bytes_max
        ):
            first, size = self._recent_order.popleft()
            self._recent.pop(first, None)
            self._recent_bytes -= size

    def recent_batch(self, first_seq: int) -> fr.Batch | None:
        found = self._recent.get(first_seq)
        return found[0] if found is not None else None

    def recent_run(self, first_seq: int) -> list[fr.Batch]:
        """Remembered batches from ``first_seq`` on, consecutive, as many as one ``BATCH`` frame
        holds (at least one, if ``first_seq`` is remembered at all)."""
        run: list[fr.Batch] = []
        entries = size = meta_entries = 0
        while (found := self._recent.get(first_seq)) is not None:
            batch, batch_size = found
            batch_meta = len(batch.meta) if batch.meta else 0
            if run and (
                entries + len(batch.seqs) > limits.batch_entries_max
                or size + batch_size > limits.batch_bytes_max
                or meta_entries + batch_meta > limits.frame_meta_entries_max
            ):
                break
            run.append(batch)
            entries += len(batch.seqs)
            size += batch_size
            meta_entries += batch_meta
            first_seq = batch.last_seq + 1
        return run

    def forget_recent(self) -> None:
        self._recent.clear()
        self._recent_order.clear()
        self._recent_bytes = 0

    def close_downstream_links(self) -> None:
        """Ends every link below; each downstream subscribes again (and is told what to do)."""
        for link in self._links.values():
            link.closed = True
        for stream in list(self.downstream_streams.values()):
            stream.close()

    def fail_pending(self, exc: KayosError) -> None:
        """Fails every producer waiting here, for its commit or for the chain's, with ``exc``
        (the replica is being re-made for a new topology: they retry at the shard's head)."""
        while self._writes:
            write = self._writes.popleft()
            if not write.future.done():
                write.future.set_exception(exc)
        waiters, self._waiters = self._waiters, []
        for _, _, waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(exc)

    def close(self) -> None:
        for task in self._background:
            task.cancel()
        self.close_downstream_links()
        if self.upstream_stream is not None:
            self.upstream_stream.close()
        for _, _, waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.cancel()
        self.store.close()
