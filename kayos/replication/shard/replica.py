"""One shard replica on one node: its store, its commit progress and its replication links.

A thin asyncio driver around the pure decisions of ``kayos.replication.logic.chain``. Store
commits run in worker threads (they fsync); everything else runs on the event loop. See
docs/replication-protocol.md for the frames and rules this follows.

- A member forwards each batch as soon as it takes it in and persists it at the same time
  (forward, then persist): the fsyncs of a chain overlap. Consumers see only what the shard has
  committed (the commit point), never what one member alone holds.
- The two sides of a link live apart: ``kayos.replication.link.upstream`` (``UpstreamLink``, the
  downstream side, following an upstream) and ``kayos.replication.link.downstream``
  (``serve_downstream``, the upstream side, feeding a downstream). Both import this module; it
  imports neither.
- Split along its seams, each a class ``ShardReplica`` inherits: ``head_writes`` (the head's write
  pipeline and the timed store commits), ``catchup`` (rollbacks, resets, counted learners),
  ``persist`` (the commit point, durable mark and time index written down) and ``visibility``
  (what consumers may see, and waiting for it). This module keeps the replica's state, opens it,
  and steps its progress.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from kayos import limits
from kayos.clock import Clock
from kayos.errors import CorruptionError, KayosError
from kayos.replication.link import liveness
from kayos.replication.link.stream import FrameStream, Pulse, SendingLink
from kayos.replication.logic import chain, durablemark, followers, pacing, timeindex
from kayos.replication.shard.catchup import CatchUp
from kayos.replication.shard.head_writes import HeadWrites
from kayos.replication.shard.local_meta import (
    CATCH_UP_META_KEY,
    COMMIT_POINT_META_KEY,
    LOCAL_META_PREFIXES,
    TAKEOVER_META_KEY,
    pack_takeover,
    unpack_takeover,
)
from kayos.replication.shard.persist import PersistedProgress
from kayos.replication.shard.recent import RecentBatches
from kayos.replication.shard.visibility import CommitWaiters, Visibility
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from kayos.storage.maintenance.salvage import SalvageReport, salvage
from kayos.topology import ShardChain, Topology

log = logging.getLogger("kayos.replication")


def queue_prefix(queue: str) -> bytes:
    return queue.encode() + b"\x00"


def _always() -> bool:
    return True


class ShardReplica(HeadWrites, CatchUp, PersistedProgress, Visibility):
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
        self._take_place(learner_upstream)
        self._open_store(copied=copied)
        self._open_counted_followers(counts=learner_upstream is None)
        self._open_links()
        self._open_head_writes()
        self._open_progress()
        # A chain of one commits all it holds (see ``_settle_mark_on_open``).
        alone = learner_upstream is None and self.upstream is None and not self.progress.downstreams
        self._settle_mark_on_open(alone=alone)

    # --- opening: each part of the state, in the order the constructor sets it -----------------

    def _take_place(self, learner_upstream: str | None) -> None:
        """The replica's place: its role, its upstream and its downstreams."""
        if learner_upstream is not None:
            # A copy outside the chain: follows ``learner_upstream``, counts in no commit.
            self.role: str | None = "learner"
            self.upstream: str | None = learner_upstream
            self.downstreams: tuple[str, ...] = ()
        else:
            self.role = self.shard.role_of(self.node_id)
            assert self.role is not None, "a replica is a member of its shard"
            self.upstream = self.shard.upstream_of(self.node_id)
            self.downstreams = self.shard.downstreams_of(self.node_id)
        # A member below the head serves no consumer until its first link to its upstream is
        # subscribed: a node that just joined as tail may hold less than its upstream committed
        # (a group's mark included) until SUBSCRIBED tells it how far behind it is.
        self.upstream_synced = self.upstream is None

    def _open_store(self, *, copied: bool) -> None:
        """Opens the store, checked first, and decides whether it must repair before it serves."""
        # A store that fails its check is cut back to what verifies before it opens; the rest is
        # re-fetched from a peer (docs/node-api.md, "Self-repair").
        # (A store copied by snapshot was checked end to end as it came: not walked again.)
        self.salvage_report: SalvageReport | None = None if copied else salvage(self.store_path)
        self.store = ShardStore.open(self.store_path, clock=self.clock)
        # A repairing member serves no SUBSCRIBE (and a head no write) until it has re-fetched
        # what it lost: a salvaged store, or a member with downstreams whose store cut bytes
        # after its last valid header (a torn commit and a truncated file look the same; its
        # downstreams may hold more and would be told to roll back acknowledged entries).
        torn = bool(self.downstreams) and self.store.recovery.dropped_bytes > 0
        # A store that opened below the durable mark beside it was cut short (a truncated file
        # recovers to an older header and looks merely torn): it lost acknowledged entries.
        self._mark_written = durablemark.read(self.store_path)
        cut = None if copied else durablemark.cut_short(self._mark_written, self.store.last_seq)
        self.repairing = self.salvage_report is not None or torn or cut is not None
        self.repair_problem = (
            self.salvage_report.problem
            if self.salvage_report is not None
            else cut or (self.store.recovery.reason if torn else "")
        )
        if cut is not None:
            log.error("shard %s: %s: re-fetching from a peer before serving", self.shard.id, cut)
        # Entries this replica copied in catch-up (below the target its SUBSCRIBED named) since
        # the node started; a read that met a damaged chunk (never served).
        self.refetched_entries = 0
        self.refetched_bytes = 0  # their payload bytes (keys and values)
        self.damage_seen: str | None = None

    def _open_counted_followers(self, *, counts: bool) -> None:
        """Catch-up followers counted in this member's commit, as recorded in its store (a
        restart keeps them; only the manager's word ends a count), and those counted but not
        recorded yet (docs/replication-protocol.md, "Counting a catch-up follower"); ``counts``:
        a member of the chain (a learner counts nobody)."""
        raw = self.store.meta.get(followers.FOLLOWERS_META_KEY)
        self.counted_followers: tuple[str, ...] = ()
        if counts:
            self.counted_followers = followers.kept(
                raw, self.node_id, self.shard.members, self.downstreams
            )
        if raw is not None and raw != followers.record(self.node_id, self.counted_followers):
            recorded = followers.record(self.node_id, self.counted_followers)
            self.store.commit([], meta={followers.FOLLOWERS_META_KEY: recorded})
        self._counting: tuple[str, ...] = self.counted_followers
        self._followers_lock = asyncio.Lock()

    def _open_links(self) -> None:
        """The links up and down, what the node tells the replica about them, and what a link
        forwards from memory."""
        # Keys in ``downstream_streams`` of learner and repair links (counted in no commit).
        self.copy_links: set[str] = set()
        # When a live batch was last accepted (monotonic s): a copy is paced then.
        self.live_at_s = -1e18
        # Live entries through this member: what the copy pacer watches
        # (kayos.replication.logic.pacing).
        self.live_rate = pacing.LiveRate()
        # The copies this replica serves or writes, as its status and metrics report them, and
        # the byte-rate ceiling each is held to (0: none; the node sets it, docs/operations.md
        # "A copy's rate ceiling").
        self.copies: dict[str, pacing.CopyReport] = {}
        self.copy_rate_mb_per_s_max = limits.copy_rate_mb_per_s_max
        # Notified whenever the accepted, durable or commit-point seq moves: link senders and
        # long-polling consumers re-check their condition.
        self.changed = Pulse()
        # A head serves at once (``become_head`` gives up a target its store still names); a
        # replica below it until its first catch-up is done serves no consumers (its store may
        # hold part of an all-or-nothing batch).
        target = self.store.meta.get(CATCH_UP_META_KEY, 0)
        self.catching_up = isinstance(target, int) and self.store.last_seq < target
        self.upstream_stream: FrameStream | None = None
        # Whether this node holds its lease from the manager (kayos/replication/logic/lease.py;
        # the node sets it): a head answers CONFIRM, and serves a snapshot itself, only then.
        self.lease_holds: Callable[[], bool] = _always
        # A head that just took the shard over takes no write before this (monotonic s): the old
        # head's lease ends first (docs/manager.md, "Head leases").
        self._hold_waiters = []
        self.writes_held_until_s = -math.inf
        # A COMMIT_POINT came on the current upstream link (a tail serves only then: see
        # holds_upstream_point).
        self.link_point_heard = False
        self.downstream_streams: dict[str, FrameStream] = {}
        # The sending side of each link below, by the same key as ``downstream_streams``.
        self.sending_links: dict[str, SendingLink] = {}
        # Every link this replica had, by peer: up or down, last heard, lag (status, metrics).
        self.link_health: dict[str, liveness.LinkHealth] = {}
        self._recent = RecentBatches()

    def _open_head_writes(self) -> None:
        """The head's write queue and the store commits under way (``HeadWrites``)."""
        self._writes = deque()
        self._writer = None
        # The head's next seq: seqs are given out when a batch is accepted, before its commit.
        self._next_seq = self.store.last_seq + 1
        # Set when a head commit failed: no seq is given out until a new takeover entry is down.
        self._write_failure = None
        # The last commit attempt failed for lack of space (docs/retention.md, "Disk full").
        self.disk_full = False
        # Tasks this replica started (``run_in_background``): cancelled when it closes.
        self.background_tasks: set[asyncio.Task[None]] = set()
        # The store commit running in a worker thread, if any: cancelling the task that awaits it
        # does not stop it, so whoever needs the store settled waits for this (``settle``).
        self._commit_in_flight = None
        self._committing = []
        # The idempotent producers' windows, built from the store at the first write that names
        # a producer (kayos.replication.logic.producers).
        self.producer_table = None
        # Told the duration of every store commit, in seconds (the node's latency histogram).
        self.commit_observer = None

    def _open_progress(self) -> None:
        """The commit progress as the store holds it, with what waits on it and what is counted
        of it."""
        self.progress = chain.Progress(
            has_upstream=self.upstream is not None,
            downstreams=(*self.downstreams, *self._counting),
        )
        self.commit_waiters = CommitWaiters()
        point = self.store.meta.get(COMMIT_POINT_META_KEY, 0)
        self._point_persisted = point if isinstance(point, int) else 0
        # The highest seq that holds an entry (metadata-only commits take seqs too); the consumer
        # lag counts up to here. Unknown after a restart, so it starts at the last seq.
        self.last_entry_seq = self.store.last_seq
        # Seqs this replica's rollbacks and resets dropped since the node started, and of those
        # the ones at or below the commit point it knew then (committed: must stay 0).
        self.rolled_back_entries = 0
        self.rolled_back_committed_entries = 0
        # Upstream orders to roll back past the commit point that this replica refused.
        self.refused_rollbacks = 0
        # When this member took its entries in, sampled (a group's lag in seconds).
        self.time_index = timeindex.load(self.store_path, self.store.last_seq)
        self._time_index_written_s = self.clock.monotonic_s()
        # The constructor may run in a worker thread (the node opens stores off its event loop),
        # so it steps the progress without carrying out the actions: nothing is linked and
        # nothing waits yet, and a downstream learns the commit point when it subscribes.
        for event in (
            chain.Durable(self.store.last_seq),
            chain.UpstreamCommitPoint(self._point_persisted),
        ):
            self.progress, _ = chain.step(self.progress, event)

    # --- what the replica is -------------------------------------------------------------------

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

    def replicated_meta(self, name: str) -> bool:
        """Whether metadata key ``name`` is replicated (a rollback restores it), not local."""
        return not name.startswith(LOCAL_META_PREFIXES)

    def takeover_table(self) -> chain.TakeoverTable:
        return unpack_takeover(self.store.meta.get(TAKEOVER_META_KEY))

    async def become_head(self) -> None:
        """A head adds ``(new master uuid, its last seq)`` to the takeover table at start. A
        catch-up target its store still holds (its upstream went before it got there) is given up
        in the same commit: the head is the shard's history from here on, and a head left
        catching up would serve no read and feed no learner (docs/replication-protocol.md, "A
        head gives up its catch-up"; campaign seed 2512)."""
        last = self.store.last_seq
        table = chain.with_takeover(self.takeover_table(), uuid.uuid4().bytes, last)
        meta: dict[str, Any] = {TAKEOVER_META_KEY: pack_takeover(table)}
        target = self.store.meta.get(CATCH_UP_META_KEY)
        if target is not None:
            meta[CATCH_UP_META_KEY] = None
        await asyncio.to_thread(self.store.commit, [], meta=meta)
        if isinstance(target, int) and target > last:
            self._log_catch_up_given_up(last, target)
        self.catching_up = False
        self._next_seq = self.store.last_seq + 1

    def _log_catch_up_given_up(self, last: int, target: int) -> None:
        window = self.store.options.rollback_window_seqs
        if target - last > window:
            # Read-back leaves out versions superseded at or below the upstream's window floor:
            # superseded by seqs this store never got, and that no one committed, they may be
            # missing from the history this head now leads.
            log.error(
                "shard %s: head gives up its catch-up at seq %s, %s short of its target %s "
                "(more than the rollback window of %s seqs): versions superseded in the gap "
                "may be missing from its store",
                self.shard_id,
                last,
                target - last,
                target,
                window,
            )
            return
        log.warning(
            "shard %s: head gives up its catch-up at seq %s (target %s, its upstream gone): "
            "it leads from its last seq",
            self.shard_id,
            last,
            target,
        )

    def run_in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Runs ``work`` as a task of this replica's, cancelled when the replica closes."""
        task = asyncio.get_running_loop().create_task(work)
        self.background_tasks.add(task)
        task.add_done_callback(self.background_tasks.discard)

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
            self.commit_waiters.release(action.seq)
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
        for link in self.sending_links.values():
            link.offer(batch)
        self.changed.notify()

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
        self._recent.remember(batch, size_bytes)

    def recent_batch(self, first_seq: int) -> fr.Batch | None:
        return self._recent.batch(first_seq)

    def recent_run(self, first_seq: int) -> list[fr.Batch]:
        """Remembered batches from ``first_seq`` on, as many as one ``BATCH`` frame holds
        (``RecentBatches.run``)."""
        return self._recent.run(first_seq)

    def forget_recent(self) -> None:
        self._recent.clear()

    # --- ending --------------------------------------------------------------------------------

    def close_downstream_links(self) -> None:
        """Ends every link below; each downstream subscribes again (and is told what to do)."""
        for link in self.sending_links.values():
            link.closed = True
        for stream in list(self.downstream_streams.values()):
            stream.close()

    def fail_pending(self, exc: KayosError) -> None:
        """Fails every producer waiting here, for its commit or for the chain's, with ``exc``
        (the replica is being re-made for a new topology: they retry at the shard's head)."""
        self.fail_queued_writes(exc)
        self.commit_waiters.fail(exc)

    def close(self) -> None:
        for task in self.background_tasks:
            task.cancel()
        self.close_downstream_links()
        if self.upstream_stream is not None:
            self.upstream_stream.close()
        self.commit_waiters.cancel()
        self.store.close()
