"""One simulated node's copy of one shard: a durable store and a volatile part, driving the real
chain logic.

Every commit decision goes through ``kayos.replication.logic.chain.step``; every divergence through
``rollback_point``; every takeover entry through ``with_takeover``; every link's window through
``LinkWindow``. What is simulated is only what the asyncio drivers and the store do around them:
sending frames, writing and syncing batches, opening and closing links (docs/testing.md).

A store write is visible at once and durable only when its sync completes; syncs complete in
order, one at a time. A crash loses every write not yet synced and all volatile state; a pause
defers everything the node would do (messages, timers, sync completions) until it resumes.

Here: the replica's state, its chain step and actions, its disk, its role and its clients' calls;
both sides of its links are ``chaos.sim.links.LinkSides``, its base.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.sim import lease, producers
from chaos.sim.core import Link
from chaos.sim.links import Host, LinkSides
from chaos.sim.store import Batch, Entry, Store
from kayos.replication.logic import chain
from kayos.replication.logic.chain import LinkWindow, Progress


class Replica(LinkSides):
    """One node's copy of one shard. ``progress`` is None while the node holds no role in it."""

    def __init__(self, node: Host, shard: int) -> None:
        self.node = node
        self.shard = shard
        self.store = Store(node.window_entries)
        self.reset()

    def reset(self) -> None:
        self.progress: Progress | None = None
        self.up_link: Link | None = None
        self.linked = False
        self.heard_point = False  # a COMMIT_POINT came on the current upstream link
        self.catch_up: str | None = None  # the upstream a non-member copies from
        self.catch_target = -1
        self.catch_order = 0
        self.done_sent = False
        self.down: dict[str, Link] = {}
        self.windows: dict[int, LinkWindow] = {}
        self.next_send: dict[int, int] = {}
        self.followers: set[str] = set()
        # Followers this upstream counts in its commit (docs/campaigns.md, "Findings"), and whether
        # this follower's upstream counts it. The count survives a crash (the store records it):
        # a restarted sole member that forgot it acknowledged writes alone (seed 6486).
        self.counted: set[str] = set(self.store.counted)
        self.counted_upstream = False
        self.head_ready = False
        self.waiters: list[tuple[int, Callable[[bool, int, int], None]]] = []
        self.disk_free = 0.0
        self.disk_ops = 0
        self.cp_write_queued = False
        self.table_pending = False  # the upstream's table is recorded but not yet durable
        self.syncing = False
        self.sync_size = 0  # batches of ``store.pending`` the sync in flight makes durable
        # The last seq of the current link's first batch, until it is durable (its metadata
        # replaces the store's: ``Store.marks``); 0: none due.
        self.meta_from_link = 0
        self.when_idle: list[Callable[[], None]] = []
        # The head lease, the write hold after a lost member and CONFIRMs waiting (sim/lease.py).
        self.lease_until = -float("inf")
        # Answers at shard epochs not yet adopted, as (epoch, lease end): counted on adoption.
        self.early_grants: list[tuple[int, float]] = []
        self.writes_held_until = -float("inf")
        self.hold_epoch = 0  # the epoch whose adoption started the write hold (0: none)
        self.confirm_token = 0
        self.confirming: dict[int, Callable[[bool], None]] = {}

    # --- helpers ---------------------------------------------------------------------------------

    def member_role(self) -> tuple[bool, tuple[str, ...]] | None:
        me, members = self.node.id, self.store.chain
        if me in members:
            i = members.index(me)
            return i > 0, members[i + 1 : i + 2]
        if self.catch_up is not None:
            return True, ()
        return None

    def is_head(self) -> bool:
        return self.progress is not None and not self.progress.has_upstream

    def is_serving_tail(self) -> bool:
        members = self.store.chain
        return (
            self.progress is not None
            and bool(members)
            and members[-1] == self.node.id
            and self.catch_up is None
            and self.linked_or_alone()
        )

    def linked_or_alone(self) -> bool:
        return not self.progress or not self.progress.has_upstream or self.linked

    def step(self, event: chain.Event) -> None:
        assert self.progress is not None
        self.progress, actions = chain.step(self.progress, event)
        for action in actions:
            self.act(action)

    def act(self, action: chain.Action) -> None:
        if isinstance(action, chain.SendAck | chain.SendCommitted):
            if self.up_link is not None and self.linked:
                kind = "ack" if isinstance(action, chain.SendAck) else "committed"
                upstream = self.up_link.upstream
                self.world.send_on(
                    self.up_link,
                    self.node.id,
                    self.peer(upstream).on_report,
                    self.shard,
                    self.up_link,
                    self.node.id,
                    kind,
                    action.seq,
                )
        elif isinstance(action, chain.SendCommitPoint):
            targets = [action.node] if action.node is not None else list(self.down)
            for target in targets:
                link = self.down.get(target)
                if link is not None:
                    self.world.send_on(
                        link,
                        self.node.id,
                        self.peer(target).on_commit_point,
                        self.shard,
                        link,
                        action.seq,
                    )
        elif isinstance(action, chain.CommitPointAdvanced):
            if self.is_head():
                self.release(action.seq)
            elif not self.cp_write_queued:
                self.cp_write_queued = True
                self.disk("cp", None)
        elif isinstance(action, chain.Violation):
            link = self.down.get(action.node)
            if link is not None:
                self.world.close_link(link)

    def fail_waiters(self) -> None:
        """Fails every producer waiting for its commit here (it may or may not commit: the
        client's outcome is unknown)."""
        waiting, self.waiters = self.waiters, []
        for last, reply in waiting:
            reply(False, last, 0)

    def release(self, seq: int) -> None:
        still = []
        for last, reply in self.waiters:
            if last <= seq:
                reply(True, last, seq)
            else:
                still.append((last, reply))
        self.waiters = still

    # --- the disk --------------------------------------------------------------------------------

    def disk(self, kind: str, payload: Any) -> None:
        node = self.node
        latency = node.world.rng.uniform(*node.sync_ms)
        if node.slow_disk_until > node.world.now:
            latency += node.world.rng.uniform(*node.slow_sync_ms)
        self.disk_free = max(node.world.now, self.disk_free) + latency
        self.disk_ops += 1
        node.later(self.disk_free - node.world.now, self.synced, kind, payload)

    def synced(self, kind: str, payload: Any) -> None:
        self.disk_ops -= 1
        store = self.store
        if kind == "batch" and self.node.failing_syncs > 0:
            self.node.failing_syncs -= 1
            if not self.sync_failed():
                return
        elif kind == "batch":
            # One sync makes durable every batch written before it started (a group commit).
            store.batches += store.pending[:payload]
            for batch in store.pending[:payload]:
                store.marks.update((e.group, e.hwm) for e in batch if e.group)
            del store.pending[:payload]
            if 0 < self.meta_from_link <= store.durable_last():
                self.meta_from_link = 0
                store.marks = store.marks_upto(store.durable_last())
            self.syncing = False
            if store.pending:
                self.start_sync()
            if self.progress is not None:
                self.step(chain.Durable(store.durable_last()))
                if self.is_head() and self.node.plant == "head_counts_no_ack":
                    self.release(store.durable_last())
                self.check_caught_up()
        elif kind == "table":
            store.table = list(payload)
            self.table_pending = False
        elif kind == "takeover":
            store.table = chain.with_takeover(store.table, payload, store.last())
            self.head_ready = True
            self.node.to_manager("took_over", self.shard, payload, store.last())
            for link in list(self.down.values()):
                self.pump(link)
        elif kind == "cp":
            self.cp_write_queued = False
            if self.progress is not None and self.progress.has_upstream:
                store.commit_point = max(store.commit_point, self.progress.commit_point)
        elif kind == "rollback":
            seq, link = payload
            store.truncate(seq)
            store.commit_point = min(store.commit_point, seq)
            self.rebuild(fresh=True)
            if link is not None and link is self.up_link and link.open:
                self.subscribe_on(link)
        if self.disk_ops == 0:
            waiting, self.when_idle = self.when_idle, []
            for fn in waiting:
                fn()
            if self.disk_ops == 0:
                self.node.later(0, self.subscribe)

    def sync_failed(self) -> bool:
        """A sync failed (``fsync_error``): what it held, and every write behind it, is lost.

        A head follows docs/replication-protocol.md ("A head starts a new history after a
        loss"): it fails the writes waiting on it, closes its downstream links (they may hold
        seqs it lost), forgets their reports and writes a takeover entry before it takes another
        write. Any other member stops (a process that cannot sync exits) and is started again.
        Returns whether the replica goes on."""
        self.syncing = False
        self.store.drop_pending(0)
        if not self.is_head():
            self.node.crash()
            self.node.world.at(self.node.restart_after_ms, self.node.start_if_down)
            return False
        self.step(chain.Discarded())
        self.fail_waiters()
        self.close_down()
        self.head_ready = False
        self.disk("takeover", self.node.world.rng.randbytes(16))
        return True

    def write(self, batch: Batch) -> None:
        self.store.add_pending(batch)
        if not self.syncing:
            self.start_sync()

    def start_sync(self) -> None:
        self.syncing = True
        self.sync_size = len(self.store.pending)
        self.disk("batch", self.sync_size)

    def discard_unsynced(self) -> None:
        """The upstream link ended: the batches taken in behind the sync in flight are dropped
        (the real member lets its commit in flight land, then discards what it accepted but had
        not begun to commit: ``ShardReplica.discard_unpersisted``), and the links below, which
        may hold them already (forward, then persist), are closed, so the divergence rule rolls
        them back when they subscribe again."""
        store = self.store
        kept = self.sync_size if self.syncing else 0
        if self.progress is None or len(store.pending) <= kept:
            return
        store.drop_pending(kept)
        self.step(chain.Discarded())
        self.close_down()

    def after_disk(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` once every write and sync begun so far has landed."""
        if self.disk_ops == 0:
            fn()
        else:
            self.when_idle.append(fn)

    def roll_back(self, seq: int, link: Link | None) -> None:
        self.after_disk(lambda: self.disk("rollback", (seq, link)))

    # --- roles -----------------------------------------------------------------------------------

    def adopt(self, members: tuple[str, ...], epoch: int) -> None:
        if epoch <= self.store.epoch:
            return
        lease.hold_writes(self, members, epoch)
        if _position(self.store.chain, self.node.id) != _position(members, self.node.id):
            # The real node remakes or closes the replica (reconfigure.plan_changes) and fails
            # its producers (``fail_pending``). Kept, a waiter outlived a rollback of its write
            # and was answered by the commit of another write at its seq (seed 3756).
            self.fail_waiters()
        self.store.chain, self.store.epoch = members, epoch
        lease.adopted(self)
        self.followers -= set(members)
        self.set_counted(set())  # the manager's new chain ends every count
        if self.node.id in members:
            self.catch_up = None
        self.apply_role()

    def start_catch_up(self, upstream: str, rollback_to: int | None, order: int) -> None:
        """``order`` names the manager's order: ``CatchUpDone`` carries it, so a report of an
        earlier catch-up arriving late is not taken for this one."""
        if self.node.id in self.store.chain:
            return
        if order == self.catch_order and self.catch_up == upstream and self.progress is not None:
            return  # this very order, delivered twice
        # A new order starts afresh (a report of the one before must not answer it).
        self.set_counted(set())  # a non-member counts nobody
        self.catch_order = order
        self.catch_up = upstream
        self.catch_target = -1
        self.done_sent = False
        if rollback_to is not None and self.node.plant != "skip_rollback":
            self.close_links()
            self.progress = None
            self.roll_back(rollback_to, None)
        self.apply_role()

    def close_links(self) -> None:
        for link in [self.up_link, *self.down.values()]:
            if link is not None:
                self.world.close_link(link)
        self.up_link, self.linked = None, False
        self.down, self.windows, self.next_send = {}, {}, {}

    def set_counted(self, names: set[str]) -> None:
        """The followers counted in the commit, recorded in the store at once (like the chain)."""
        self.counted = names
        self.store.counted = frozenset(names)

    def apply_role(self) -> None:
        """Takes up the role the recorded chain (or a catch-up) gives: links are rebuilt."""
        self.close_links()
        self.rebuild(fresh=self.progress is None)
        if self.progress is not None and self.progress.has_upstream:
            self.subscribe()

    def rebuild(self, *, fresh: bool) -> None:
        role = self.member_role()
        old = self.progress
        if role is None:
            self.progress = None
            self.head_ready = False
            return
        has_up, downs = role
        downs = downs + tuple(sorted(f for f in self.counted if f not in downs))
        store = self.store
        if fresh or old is None:
            point = store.commit_point if has_up else 0
            base = Progress(has_up, downs, commit_point=point, upstream_point=point)
        else:
            # Reports of downstreams still linked stay (a follower counted or dropped).
            linked = [d for d in downs if d in self.down]
            base = Progress(
                has_up,
                downs,
                committed=old.committed,
                commit_point=old.commit_point,
                upstream_point=old.upstream_point if has_up else 0,
                acked={d: old.acked[d] for d in linked if d in old.acked},
                downstream_committed={
                    d: old.downstream_committed[d] for d in linked if d in old.downstream_committed
                },
            )
        was_head = old is not None and not old.has_upstream and not fresh
        self.progress = base
        self.step(chain.Durable(store.durable_last()))
        self.step(chain.Accepted(store.last()))
        if not has_up and not was_head:
            self.head_ready = False
            self.disk("takeover", self.node.world.rng.randbytes(16))
        elif has_up:
            self.head_ready = False

    # --- clients ---------------------------------------------------------------------------------

    def produce(
        self,
        items: tuple[tuple[str, str | None, str, int], ...],
        producer: str,
        pseq: int,
        reply: Callable[[str, int, int], None],
    ) -> None:
        """Appends a batch as head and calls ``reply("ok", first, last)`` once it is committed
        (``"failed"``: it may not be). A call of an idempotent producer (``producer`` set) whose
        producer seq is in the window is not written again: it is answered with the recorded
        seqs once they are committed. Refused at once: ``"refused"`` (not a head taking
        writes), ``"too_old"`` (below the producer's full window)."""
        p = self.progress
        if p is None or p.has_upstream or not self.head_ready or self.catch_up is not None:
            reply("refused", 0, 0)
            return
        if lease.writes_held(self):
            reply("refused", 0, 0)
            return
        if producer and self.node.plant != "no_producer_window":
            window = self.store.producers.get(producer)
            decision, found = producers.window_decision(window, pseq, self.store.window_entries)
            if decision == "too_old":
                reply("too_old", 0, 0)
                return
            if found is not None:
                self.node.window_hits += 1
                self.answer_when_committed(found[0], found[1], reply)
                return
        self.node.heads_seen(self.shard, self.store.epoch)
        first = self.store.last() + 1
        batch = tuple(
            Entry(first + i, key, value, group, hwm, producer, pseq)
            for i, (key, value, group, hwm) in enumerate(items)
        )
        self.write(batch)
        self.step(chain.Accepted(batch[-1].seq))
        self.answer_when_committed(first, batch[-1].seq, reply)
        for link in list(self.down.values()):
            self.pump(link)

    def answer_when_committed(
        self, first: int, last: int, reply: Callable[[str, int, int], None]
    ) -> None:
        """``reply("ok", first, last)`` once ``last`` is committed here (at once if it is),
        ``reply("failed", ...)`` if this head gives up waiting (``fail_waiters``)."""

        def answer(ok: bool, _last: int, _point: int) -> None:
            reply("ok" if ok else "failed", first, last)

        p = self.progress
        if p is not None and last <= p.commit_point:
            answer(True, last, p.commit_point)
        else:
            self.waiters.append((last, answer))

    def snapshot(self, group: str) -> tuple[int, int, list[Entry]] | None:
        """(hwm, boundary, latest version of each key in (hwm, boundary]) served by a tail; None
        while it is not a serving tail or its commit point does not yet cover what it holds."""
        p = self.progress
        # The plant ``mark_past_point``: the tail serves while its commit point is behind what it
        # holds, and reads the group's mark from its metadata map (as an earlier node did: a
        # mark past the commit point, or one of seqs a rollback dropped).
        planted = self.node.plant == "mark_past_point"
        if p is None or not self.is_serving_tail() or (p.commit_point < p.durable and not planted):
            return None
        if p.has_upstream and (not self.heard_point or p.upstream_point > p.durable):
            # The shard committed seqs this tail does not hold yet (it has just joined, or its
            # link was rebuilt): serving now could show a group an older mark than it committed.
            return None
        boundary = p.commit_point
        hwm = 0
        latest: dict[str, Entry] = {}
        for entry in self.store.entries_upto(boundary):
            if entry.group:
                if entry.group == group:
                    hwm = entry.hwm
            else:
                latest[entry.key] = entry
        if planted:
            hwm = self.store.marks.get(group, 0)
        entries = sorted((e for e in latest.values() if e.seq > hwm), key=_seq)
        return hwm, max(boundary, hwm), entries


def _position(members: tuple[str, ...], me: str) -> tuple[str | None, tuple[str, ...]] | None:
    """A member's place in a chain as ``reconfigure.position_of`` compares it: its upstream and
    downstreams (None: not a member)."""
    if me not in members:
        return None
    i = members.index(me)
    return (members[i - 1] if i > 0 else None), members[i + 1 : i + 2]


def _seq(entry: Entry) -> int:
    return entry.seq
