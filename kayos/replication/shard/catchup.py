"""What a subscription's verdict and a catch-up follower's reports do to a shard replica.

``CatchUp`` holds a member's side of catching up below its upstream: refusing a rollback past the
commit point, rolling back or resetting the store (and restarting the progress after it), and
counting a learner that catches up below a member with no downstream in that member's commit
(docs/replication-protocol.md, "Counting a catch-up follower"). Apart from
``kayos.replication.shard.replica`` because it is one seam of the replica: the store below the
links changes under it, and the links start again.
``kayos.replication.shard.replica.ShardReplica`` inherits it and sets every attribute declared
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from kayos.clock import Clock
from kayos.errors import KayosError, ReplicationError, RollbackTooFarError
from kayos.replication.logic import chain, durablemark, followers, timeindex
from kayos.replication.shard.local_meta import ROLLED_BACK_META_KEY
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore

log = logging.getLogger("kayos.replication")


class CatchUp:
    """Rollbacks, resets and counted learners of one replica (see the module's docstring)."""

    # The replica's state this uses (``ShardReplica.__init__`` sets it).
    node_id: str
    clock: Clock
    store: ShardStore
    store_path: str
    upstream: str | None
    downstreams: tuple[str, ...]
    progress: chain.Progress
    time_index: timeindex.TimeIndex
    counted_followers: tuple[str, ...]
    rolled_back_entries: int
    rolled_back_committed_entries: int
    refused_rollbacks: int
    _counting: tuple[str, ...]
    _followers_lock: asyncio.Lock
    _point_persisted: int
    _mark_written: int

    if TYPE_CHECKING:
        # The replica's methods this uses (``ShardReplica`` defines them).
        @property
        def shard_id(self) -> int: ...

        @property
        def epoch(self) -> int: ...

        def takeover_table(self) -> chain.TakeoverTable: ...

        def _apply_events(self, *events: chain.Event) -> None: ...

        def forget_recent(self) -> None: ...

        def close_downstream_links(self) -> None: ...

        def lower_durable_mark(self, seq: int) -> None: ...

        async def persist_durable_mark(self) -> None: ...

        def run_in_background(self, work: Coroutine[Any, Any, None]) -> None: ...

        def replicated_meta(self, name: str) -> bool: ...

        def forget_producers(self) -> None: ...

    # --- the store below the links -------------------------------------------------------------

    def rolled_back_to(self) -> int | None:
        """The seq this replica rolled back to since a link last replaced its replicated
        metadata (None: it holds its upstream's): its marks may be from the dropped seqs."""
        seq = self.store.meta.get(ROLLED_BACK_META_KEY)
        return seq if isinstance(seq, int) else None

    def map_unsettled(self) -> bool:
        """Whether this replica's replicated map may hold marks of seqs its rollback dropped, to
        be replaced by its upstream's (a head's map is the shard's): it sends none down a link
        meanwhile (docs/replication-protocol.md, "The metadata on an idle link")."""
        return self.upstream is not None and self.rolled_back_to() is not None

    async def metadata_replaced(self) -> None:
        """The first batch of a link committed, with the upstream's whole replicated metadata."""
        if self.rolled_back_to() is not None:
            await asyncio.to_thread(self.store.commit, [], meta={ROLLED_BACK_META_KEY: None})

    async def _reset_store(self, *, keep_mark: bool = False) -> None:
        """Throws the replica's data away (its history shares nothing usable with upstream);
        ``keep_mark``: the durable mark beside the store stays (a head repairing re-copies what
        its mark says it held committed, and leads only once it holds that much again)."""
        log.warning("shard %s: resetting replica to empty", self.shard_id)
        mark = self._mark_written if keep_mark else 0
        self.store.close()
        if keep_mark:
            # The mark's file is never deleted nor rewritten: a crash anywhere in the reset or
            # the copy leaves a store that opens below it and repairs again (deleted with the
            # rest and written after, a crash between left an empty store with no mark, which
            # opened as whole and led with nothing).
            await asyncio.to_thread(_empty_but_mark, self.store_path)
        else:
            await asyncio.to_thread(shutil.rmtree, self.store_path, True)
        os.makedirs(self.store_path, exist_ok=True)
        self.store = ShardStore.open(self.store_path, clock=self.clock)
        self._point_persisted = 0
        self._mark_written = mark
        self.time_index.clear()
        self._restart_progress()

    def _restart_progress(self) -> None:
        """Progress afresh from the store (after a rollback or reset: the links restart). The
        commit point stays what the upstream said, within what the store now holds; producer
        windows are read from the store again when next needed."""
        self.forget_producers()
        upstream_point = self.progress.upstream_point
        self.progress = chain.Progress(
            has_upstream=self.upstream is not None,
            downstreams=(*self.downstreams, *self._counting),
        )
        self._apply_events(
            chain.Durable(self.store.last_seq), chain.UpstreamCommitPoint(upstream_point)
        )

    async def reset_to_repair(self, upstream: fr.Subscribed) -> bool:
        """A repair link's verdict 0 that only the table cap explains (``upstream``'s table, full,
        no longer names a master this store knows, and the peer holds more than this store):
        every entry here is below the durable mark, so committed and in the peer's history too.
        The store resets, keeping its mark, and re-copies from the peer; False (nothing done) for
        any other verdict: the peer holds no more than this store."""
        own_last = self.store.last_seq
        if (
            upstream.rollback_to != 0
            or upstream.last_seq <= own_last
            or not chain.reset_explained_by_cap(
                self.takeover_table(),
                list(upstream.takeover_table),
                up_last=upstream.last_seq,
                point=own_last,
            )
        ):
            return False
        log.warning(
            "shard %s: repairing: the peer's table no longer names a master this store knows"
            " (it holds %s, this store %s): re-copying everything from it",
            self.shard_id,
            upstream.last_seq,
            own_last,
        )
        self.forget_recent()
        self.close_downstream_links()
        await self._reset_store(keep_mark=True)
        # The store's local keys went with it: the ``alone`` key of a chain of one (what it
        # acknowledges alone past its mark survives a crash and a re-make only by it) and the
        # record of the learners it counts (a restart goes on counting them only by it).
        await self._record_followers()
        return True

    def check_rollback_verdict(self, seq: int, upstream: fr.Subscribed | None = None) -> None:
        """Refuses an upstream's order to roll back to ``seq`` when that drops entries at or
        below the commit point this member knows: they are on every member and acknowledged, so
        an upstream asking for that is damaged or stale, and obeying would destroy them (and the
        links below would copy the loss). The link stays down; it is logged and counted."""
        point = min(self.progress.commit_point, self.store.last_seq)
        if seq >= point:
            return
        if (
            seq == 0
            and upstream is not None
            and chain.reset_explained_by_cap(
                self.takeover_table(),
                list(upstream.takeover_table),
                up_last=upstream.last_seq,
                point=point,
            )
        ):
            log.warning(
                "shard %s: resetting: %s's table no longer names ours", self.shard_id, self.upstream
            )
            return
        self.refused_rollbacks += 1
        log.error(
            "shard %s: refused %s's order to roll back to %s: the commit point here is %s "
            "(acknowledged entries would be lost); the link stays down",
            self.shard_id,
            self.upstream,
            seq,
            point,
        )
        raise ReplicationError(
            f"refused a rollback to {seq} below the commit point {point} (shard {self.shard_id})"
        )

    async def rollback(self, seq: int) -> None:
        dropped = max(0, self.store.last_seq - seq)
        committed = max(0, min(self.progress.commit_point, self.store.last_seq) - seq)
        self.rolled_back_entries += dropped
        self.rolled_back_committed_entries += committed
        if committed:
            log.error(
                "shard %s: rolling back %s committed entries (commit point %s, to %s)",
                self.shard_id,
                committed,
                self.progress.commit_point,
                seq,
            )
        self.forget_recent()
        # The links below were fed the history being dropped: they must subscribe again, so
        # that each downstream rolls back too instead of stacking the new history on the old.
        self.close_downstream_links()
        if seq == 0:
            await self._reset_store()
            return
        unsettled = self.rolled_back_to()
        if seq < self.store.last_seq:
            # Before the rollback: a restart half-way must not serve marks of dropped seqs.
            flag = seq if unsettled is None else min(seq, unsettled)
            await asyncio.to_thread(self.store.commit, [], meta={ROLLED_BACK_META_KEY: flag})
        try:
            restored = await asyncio.to_thread(self.store.rollback_to, seq, self.replicated_meta)
        except RollbackTooFarError:
            await self._reset_store()
            return
        if restored and unsettled is None:
            await self.metadata_replaced()  # the store put the replicated metadata back
        self.time_index.truncate_after(seq)
        self.lower_durable_mark(seq)
        # Progress never goes back on a live link; the links restart after a rollback.
        self._restart_progress()

    def learner_report(self, node: str, seq: int) -> None:
        """A learner's ``ACK`` or ``COMMITTED``: either names a seq it holds durably (it has no
        downstream; on an idle shard it sends only ``ACK``). A member with no downstream counts
        the learner in its commit from its first report at or past this member's commit point
        (every seq committed before it the learner holds, every later one waits for it), and
        records the count before showing it; a counted learner's reports feed the commit as a
        downstream's do (docs/replication-protocol.md, "Counting a catch-up follower")."""
        if node in self._counting:
            if seq > self.progress.downstream_committed.get(node, 0):
                self._apply_events(chain.DownstreamCommitted(node, seq))
            return
        if self.downstreams or seq < self.progress.commit_point:
            return
        self._counting = tuple(sorted({*self._counting, node}))
        self._apply_events(
            chain.DownstreamsChanged((*self.downstreams, *self._counting)),
            chain.DownstreamCommitted(node, seq),
        )
        log.info(
            "shard %s: counting learner %s in the commit from seq %s", self.shard_id, node, seq
        )
        self.run_in_background(self._record_followers())

    def learner_linked(self, node: str) -> None:
        """A counted learner (re)subscribed: its reports start afresh, and the commit waits."""
        if node in self._counting:
            self._apply_events(chain.DownstreamLinked(node))

    async def _record_followers(self) -> None:
        async with self._followers_lock:
            counting = self._counting
            recorded = followers.record(self.node_id, counting)
            # A chain of one that counts a learner commits alone no more: its mark first takes
            # what it committed alone, then its store's ``alone`` key goes (and comes back once
            # it counts nobody).
            alone = not counting and self.upstream is None and not self.downstreams
            if not alone:
                await self.persist_durable_mark()
            meta = {
                followers.FOLLOWERS_META_KEY: recorded,
                durablemark.ALONE_META_KEY: 1 if alone else None,
            }
            try:
                await asyncio.to_thread(self.store.commit, [], meta=meta)
            except KayosError as exc:
                log.warning("shard %s: counted learners not recorded: %s", self.shard_id, exc)
                return
            if self._counting == counting:
                self.counted_followers = counting
            else:  # changed meanwhile: shown once recorded by the next write
                self.counted_followers = tuple(n for n in counting if n in self._counting)

    async def keep_followers(self, epoch: int, keep: set[str]) -> tuple[str, ...]:
        """The manager's catch-up list at ``epoch`` (``POST /v1/admin/followers``): a counted
        learner not in it counts no more. At another epoch nothing changes."""
        if epoch != self.epoch:
            return self.counted_followers
        dropped = {n for n in self._counting if n not in keep}
        if not dropped:
            return self.counted_followers
        self._counting = tuple(n for n in self._counting if n not in dropped)
        self.counted_followers = tuple(n for n in self.counted_followers if n not in dropped)
        log.info("shard %s: no longer counting %s (the manager's word)", self.shard_id, dropped)
        self._apply_events(chain.DownstreamsChanged((*self.downstreams, *self._counting)))
        await self._record_followers()
        return self.counted_followers


def _empty_but_mark(directory: str) -> None:
    """Deletes everything in a store's directory but its ``durable-mark`` file."""
    with os.scandir(directory) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        if name == durablemark.DURABLE_MARK_FILE:
            continue
        path = os.path.join(directory, name)
        if is_dir:
            shutil.rmtree(path, True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
