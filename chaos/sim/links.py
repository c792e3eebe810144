"""Both sides of a replication link in the simulator (docs/replication-protocol.md): the
downstream side subscribes to its upstream and takes its batches and commit points in; the
upstream side answers a SUBSCRIBE (with the divergence rule's ``rollback_point``), pumps batches
through each link's ``LinkWindow``, takes the acks and commit reports back and counts catch-up
followers in its commit.

``LinkSides`` is the base of ``chaos.sim.replica.Replica``: it names the replica's state the link
sides read and change, and the replica's operations they call (its chain step, its disk, its
role), which the replica defines. ``Host`` is what a replica asks of the node that holds it and of
its peers (``chaos.sim.node.Node``, which imports this module: it is not imported back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from chaos.sim.core import Link, World
from chaos.sim.store import Batch, Store
from kayos.replication.logic import chain
from kayos.replication.logic.chain import LinkWindow, Progress, TakeoverTable, rollback_point

Table = tuple[tuple[bytes, int], ...]  # a takeover table as a message carries it


class Host(Protocol):
    """What a replica uses of the node that holds it, and of its peers."""

    id: str
    world: World
    plant: str | None
    sync_ms: tuple[float, float]
    slow_sync_ms: tuple[float, float]
    slow_disk_until: float
    failing_syncs: int
    restart_after_ms: float
    window_entries: int
    window_hits: int

    def peer(self, node_id: str) -> Host: ...

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> None: ...

    def crash(self) -> None: ...

    def start_if_down(self) -> None: ...

    def to_manager(self, kind: str, *args: Any) -> None: ...

    def heads_seen(self, shard: int, epoch: int) -> None: ...

    # The messages of a link (each runs on the receiving node).

    def on_subscribe(
        self, shard: int, link: Link, who: str, from_seq: int, table: Table
    ) -> None: ...

    def on_rollback_msg(self, shard: int, link: Link, seq: int) -> None: ...

    def on_subscribed_msg(self, shard: int, link: Link, table: Table, last: int) -> None: ...

    def on_counted_msg(self, shard: int, link: Link) -> None: ...

    def on_batch_msg(self, shard: int, link: Link, batch: Batch) -> None: ...

    def on_report(self, shard: int, link: Link, who: str, kind: str, seq: int) -> None: ...

    def on_commit_point(self, shard: int, link: Link, seq: int) -> None: ...


class LinkSides:
    """The link sides of one node's copy of one shard (the rest of it: ``Replica``)."""

    # The replica's state the link sides read and change (``Replica.reset`` says what each is).
    node: Host
    shard: int
    store: Store
    progress: Progress | None
    up_link: Link | None
    linked: bool
    heard_point: bool
    catch_up: str | None
    catch_target: int
    catch_order: int
    done_sent: bool
    down: dict[str, Link]
    windows: dict[int, LinkWindow]
    next_send: dict[int, int]
    followers: set[str]
    counted: set[str]
    counted_upstream: bool
    head_ready: bool
    disk_ops: int
    table_pending: bool
    meta_from_link: int

    # The replica's operations the link sides call (defined by ``Replica``).

    def step(self, event: chain.Event) -> None:
        raise NotImplementedError

    def write(self, batch: Batch) -> None:
        raise NotImplementedError

    def disk(self, kind: str, payload: Any) -> None:
        raise NotImplementedError

    def roll_back(self, seq: int, link: Link | None) -> None:
        raise NotImplementedError

    def discard_unsynced(self) -> None:
        raise NotImplementedError

    def set_counted(self, names: set[str]) -> None:
        raise NotImplementedError

    def rebuild(self, *, fresh: bool) -> None:
        raise NotImplementedError

    # --- where a link goes -----------------------------------------------------------------------

    @property
    def world(self) -> World:
        return self.node.world

    def upstream(self) -> str | None:
        me, members = self.node.id, self.store.chain
        if me in members:
            i = members.index(me)
            return members[i - 1] if i > 0 else None
        return self.catch_up

    def peer(self, node_id: str) -> Host:
        return self.node.peer(node_id)

    # --- the downstream side of a link -----------------------------------------------------------

    def subscribe(self) -> None:
        p = self.progress
        upstream = self.upstream()
        if p is None or not p.has_upstream or upstream is None or self.up_link is not None:
            return
        if self.disk_ops:
            return  # let running writes land first: the SUBSCRIBE names where the store ends
        link = self.world.open_link(upstream, self.node.id, self.shard)
        self.up_link, self.linked, self.heard_point = link, False, False
        self.counted_upstream = False
        self.subscribe_on(link)

    def subscribe_on(self, link: Link) -> None:
        self.world.send_on(
            link,
            self.node.id,
            self.peer(link.upstream).on_subscribe,
            self.shard,
            link,
            self.node.id,
            self.store.last() + 1,
            tuple(self.store.table),
        )

    def on_rollback(self, link: Link, seq: int) -> None:
        if link is not self.up_link or self.linked:
            return
        self.close_down()
        self.progress = None
        self.roll_back(seq, link)

    def close_down(self) -> None:
        for link in list(self.down.values()):
            self.world.close_link(link)

    def on_subscribed(self, link: Link, table: TakeoverTable, last: int) -> None:
        if link is not self.up_link or self.linked or self.progress is None:
            return
        if list(table) != self.store.table:
            # The real replica commits the table before it applies a batch; here batches may be
            # taken in meanwhile (their syncs queue behind it), so SUBSCRIBE waits for it instead.
            self.disk("table", list(table))
            self.table_pending = True
            self.close_down()
        self.linked = True
        self.meta_from_link = -1  # the next batch is the link's first
        if self.catch_up is not None:
            self.catch_target = last
        self.step(chain.UpstreamLinked())
        self.check_caught_up()

    def on_batch(self, link: Link, batch: Batch) -> None:
        p = self.progress
        if link is not self.up_link or not self.linked or p is None:
            return
        if batch[0].seq != p.accepted + 1:
            self.world.close_link(link)  # protocol_error: ranges on a link are contiguous
            return
        self.write(batch)
        last = batch[-1].seq
        if self.meta_from_link < 0:
            self.meta_from_link = last
        self.step(chain.Accepted(last))
        if self.node.plant == "tail_acks_before_fsync" and p.is_tail and self.catch_up is None:
            self.step(chain.Durable(last))
        for down in list(self.down.values()):
            self.pump(down)

    def on_commit_point(self, link: Link, seq: int) -> None:
        if link is self.up_link and self.linked and self.progress is not None:
            self.heard_point = True
            self.step(chain.UpstreamCommitPoint(seq))

    def check_caught_up(self) -> None:
        if (
            self.catch_up is not None
            and self.linked
            and self.counted_upstream
            and not self.done_sent
            and 0 <= self.catch_target <= self.store.durable_last()
        ):
            self.done_sent = True
            self.node.to_manager("caught_up", self.shard, self.catch_order)

    # --- the upstream side of a link -------------------------------------------------------------

    def on_subscribe(self, link: Link, who: str, from_seq: int, table: TakeoverTable) -> None:
        p = self.progress
        ready = p is not None and (p.has_upstream or self.head_ready) and not self.table_pending
        member = p is not None and (who in p.downstreams or who in self.followers)
        if not (ready and member and link.open):
            self.world.close_link(link)  # refused: it subscribes again after a pause
            return
        assert p is not None
        old = self.down.get(who)
        if old is not None and old is not link:
            self.world.close_link(old)
        if self.node.plant == "skip_rollback":
            back = None
        else:
            back = rollback_point(list(table), self.store.table, from_seq - 1, self.store.last())
        if back is not None:
            self.world.send_on(
                link, self.node.id, self.peer(who).on_rollback_msg, self.shard, link, back
            )
            return
        self.down[who] = link
        self.windows[link.id] = LinkWindow()
        self.next_send[link.id] = from_seq
        self.world.send_on(
            link,
            self.node.id,
            self.peer(who).on_subscribed_msg,
            self.shard,
            link,
            tuple(self.store.table),
            self.store.last(),
        )
        if who in p.downstreams:
            self.step(chain.DownstreamLinked(who))
        if who in self.counted:
            self.world.send_on(link, self.node.id, self.peer(who).on_counted_msg, self.shard, link)
        self.pump(link)

    def pump(self, link: Link) -> None:
        window = self.windows.get(link.id)
        if window is None or not link.open:
            return
        if not self.head_ready and not (self.progress and self.progress.has_upstream):
            return
        start = self.next_send[link.id]
        if start > self.store.last() or not window.can_send():
            return
        for batch in self.store.batches_from(start):
            if not window.can_send():
                break
            window.sent(batch[-1].seq, 64 * len(batch))
            self.next_send[link.id] = batch[-1].seq + 1
            self.world.send_on(
                link,
                self.node.id,
                self.peer(link.downstream).on_batch_msg,
                self.shard,
                link,
                batch,
            )

    def on_report(self, link: Link, who: str, kind: str, seq: int) -> None:
        if self.down.get(who) is not link or self.progress is None:
            return
        window = self.windows[link.id]
        window.acknowledged(seq)
        self.pump(link)
        if (
            who in self.followers
            and who not in self.progress.downstreams
            and kind == "committed"
            and seq >= self.progress.commit_point
        ):
            self.count_follower(who, link)
        if who in self.progress.downstreams:
            if kind == "ack":
                self.step(chain.DownstreamAck(who, seq))
            else:
                self.step(chain.DownstreamCommitted(who, seq))

    def set_followers(self, names: tuple[str, ...], epoch: int) -> None:
        """The manager's list of this tail's catch-up followers at ``epoch``; one dropped from it
        (it went down) no longer counts in the commit. A list from an epoch this replica has not
        adopted is ignored: the follower may have joined the chain in it."""
        if epoch != self.store.epoch:
            return
        self.followers = set(names)
        dropped = self.counted - self.followers
        if dropped:
            self.set_counted(self.counted - dropped)
            for who in dropped:
                link = self.down.get(who)
                if link is not None:
                    self.world.close_link(link)
            self.rebuild(fresh=False)

    def count_follower(self, who: str, link: Link) -> None:
        """A follower that holds this member's commit point counts in its commit from now on, so
        every seq the shard commits later is on it too; it may then say it caught up."""
        self.set_counted(self.counted | {who})
        self.rebuild(fresh=False)
        self.step(chain.DownstreamLinked(who))
        self.world.send_on(link, self.node.id, self.peer(who).on_counted_msg, self.shard, link)

    def on_counted(self, link: Link) -> None:
        if link is self.up_link and self.linked:
            self.counted_upstream = True
            self.check_caught_up()

    def link_closed(self, link: Link) -> None:
        if link is self.up_link:
            self.up_link, self.linked = None, False
            self.discard_unsynced()
            self.node.later(self.world.rng.uniform(5, 30), self.subscribe)
            return
        for who, down in list(self.down.items()):
            if down is link:
                del self.down[who]
                self.windows.pop(link.id, None)
                self.next_send.pop(link.id, None)
                # A counted follower stays counted when its link drops: the manager may already
                # have made it a member, and committing without it would leave a seq off a
                # member (a partitioned head acked writes alone). Only the manager's word (a new
                # chain, or the follower gone from its catch-ups) ends the count.
