"""A simulated node process: its replicas, one per shard (``chaos.sim.replica``), its life (start,
crash, pause, resume), the messages it receives (each handed to the replica of its shard), its
heartbeats to the manager and its clients' requests (docs/testing.md, "The simulator").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.sim import lease
from chaos.sim.core import CLIENT, MANAGER, Endpoint, Link, World
from chaos.sim.replica import Replica
from chaos.sim.store import Batch, Entry

PLANTS = (
    "tail_acks_before_fsync",
    "skip_rollback",
    "head_counts_no_ack",
    "no_lease",
    "mark_past_point",
    "no_producer_window",
    "refused_skips_hold",
    "trust_reported_refusal",
)


class Node(Endpoint):
    def __init__(
        self,
        world: World,
        node_id: str,
        shards: int,
        *,
        plant: str | None,
        sync_ms: tuple[float, float],
        slow_sync_ms: tuple[float, float],
        heartbeat_ms: float,
        heads: dict[tuple[int, int], set[str]],
        lease_ms: float,
        window_entries: int = 64,
    ) -> None:
        self.world = world
        self.window_entries = window_entries
        self.window_hits = 0  # resends the producer window answered without writing again
        self.id = node_id
        self.plant = plant
        self.sync_ms = sync_ms
        self.slow_sync_ms = slow_sync_ms
        self.heartbeat_ms = heartbeat_ms
        self.lease = lease.Lease(lease_ms)
        self.replicas = [Replica(self, shard) for shard in range(shards)]
        self.up = True
        self.paused = False
        self.incarnation = 0
        self.inbox: list[tuple[int, Callable[..., None], tuple[Any, ...]]] = []
        self.slow_disk_until = 0.0
        self.failing_syncs = 0  # the next syncs that fail (an fsync_error fault)
        self.restart_after_ms = 50.0
        self._heads = heads
        self.manager_inbox: Callable[..., None] = lambda *args: None

    def heads_seen(self, shard: int, epoch: int) -> None:
        self._heads.setdefault((shard, epoch), set()).add(self.id)

    def peer(self, node_id: str) -> Node:
        """Another node of the world (a replica's link peer)."""
        peer = self.world.endpoints[node_id]
        assert isinstance(peer, Node)
        return peer

    # --- process life ----------------------------------------------------------------------------

    def reachable(self) -> bool:
        return self.up

    def deliver(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.paused:
            self.inbox.append((self.incarnation, fn, args))
        else:
            fn(*args)

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """A timer or a sync completion of this incarnation (dropped by a crash)."""
        self.world.at(delay, self._fire, self.incarnation, fn, args)

    def _fire(self, incarnation: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if incarnation == self.incarnation and self.up:
            self.deliver(fn, args)

    def start_if_down(self) -> None:
        if not self.up:
            self.start()

    def start(self) -> None:
        self.up, self.paused = True, False
        for replica in self.replicas:
            replica.reset()
            if replica.store.chain:
                replica.apply_role()
        self.to_manager("returned", self.reports(), self.incarnation)
        self.heartbeat()

    def crash(self) -> None:
        if not self.up:
            return
        self.up, self.paused = False, False
        self.incarnation += 1
        self.lease.asks = {}  # volatile: a grant for an old nonce finds nothing
        self.inbox = []
        for replica in self.replicas:
            replica.store.crash()
            replica.reset()
        for link in self.world.links_of(self.id):
            self.world.close_link(link, "reset")
        for hook in self.world.on_crash:
            hook(self.id)

    def pause(self) -> None:
        if not self.up or self.paused:
            return
        self.paused = True
        self.world.at(self.world.peer_silence_ms, self._silence, self.incarnation)

    def _silence(self, incarnation: int) -> None:
        if self.paused and incarnation == self.incarnation:
            for link in self.world.links_of(self.id):
                self.world.close_link(link, "silence")

    def resume(self) -> None:
        if not self.up or not self.paused:
            return
        self.paused = False
        inbox, self.inbox = self.inbox, []
        for incarnation, fn, args in inbox:
            if incarnation == self.incarnation and self.up and not self.paused:
                fn(*args)
            elif self.paused:
                self.inbox.append((incarnation, fn, args))

    # --- messages (each runs on the receiving node) ---------------------------------------------

    def link_closed(self, link: Link) -> None:
        if link.cause in ("reset", "refused"):
            # A neighbour's link reset or refused: the manager is told (it probes the node).
            peer = link.downstream if link.upstream == self.id else link.upstream
            self.to_manager("suspect", peer, link.cause)
        if 0 <= link.shard < len(self.replicas):
            self.replicas[link.shard].link_closed(link)

    def on_subscribe(
        self, shard: int, link: Link, who: str, from_seq: int, table: tuple[tuple[bytes, int], ...]
    ) -> None:
        self.replicas[shard].on_subscribe(link, who, from_seq, list(table))

    def on_rollback_msg(self, shard: int, link: Link, seq: int) -> None:
        self.replicas[shard].on_rollback(link, seq)

    def on_subscribed_msg(
        self, shard: int, link: Link, table: tuple[tuple[bytes, int], ...], last: int
    ) -> None:
        self.replicas[shard].on_subscribed(link, list(table), last)

    def on_counted_msg(self, shard: int, link: Link) -> None:
        self.replicas[shard].on_counted(link)

    def on_batch_msg(self, shard: int, link: Link, batch: Batch) -> None:
        self.replicas[shard].on_batch(link, batch)

    def on_report(self, shard: int, link: Link, who: str, kind: str, seq: int) -> None:
        self.replicas[shard].on_report(link, who, kind, seq)

    def on_commit_point(self, shard: int, link: Link, seq: int) -> None:
        self.replicas[shard].on_commit_point(link, seq)

    def on_chain(self, shard: int, members: tuple[str, ...], epoch: int) -> None:
        self.replicas[shard].adopt(members, epoch)

    def on_followers(self, shard: int, names: tuple[str, ...], epoch: int) -> None:
        self.replicas[shard].set_followers(names, epoch)

    def on_catch_up(
        self, shard: int, node: str, upstream: str, rollback_to: int | None, order: int
    ) -> None:
        replica = self.replicas[shard]
        if node == self.id:
            replica.start_catch_up(upstream, rollback_to, order)
        else:
            replica.followers.add(node)

    # --- the manager -----------------------------------------------------------------------------

    def reports(self) -> tuple[tuple[int, tuple[tuple[bytes, int], ...], int, str, int], ...]:
        """Per shard: last seq, takeover table, epoch held, the upstream it catches up from and
        the manager's order it follows."""
        return tuple(
            (r.store.last(), tuple(r.store.table), r.store.epoch, r.catch_up or "", r.catch_order)
            for r in self.replicas
        )

    def heartbeat(self) -> None:
        nonce = self.lease.ask(self.world.now)
        self.to_manager("heartbeat", self.reports(), self.incarnation, nonce)
        for replica in self.replicas:
            if replica.catch_up is not None and replica.done_sent:
                # Again: a datagram may be lost.
                self.to_manager("caught_up", replica.shard, replica.catch_order)
        self.later(self.heartbeat_ms, self.heartbeat)

    def to_manager(self, kind: str, *args: Any) -> None:
        self.world.send(self.id, MANAGER, self.manager_inbox, kind, self.id, self.world.now, args)

    # --- clients ---------------------------------------------------------------------------------

    def on_produce(
        self,
        shard: int,
        op: int,
        attempt: int,
        items: tuple[tuple[str, str | None, str, int], ...],
        producer: str,
        pseq: int,
        reply: Callable[[int, int, str, int, int], None],
    ) -> None:
        """A client's produce (or group commit), attempt ``attempt`` of its call ``op``:
        answered ``reply(op, attempt, status, first, last)``."""

        def answer(status: str, first: int, last: int) -> None:
            self.world.send(self.id, CLIENT, reply, op, attempt, status, first, last)

        self.replicas[shard].produce(items, producer, pseq, answer)

    def on_snapshot(
        self,
        shard: int,
        op: int,
        group: str,
        reply: Callable[[int, tuple[int, int, list[Entry]] | None], None],
    ) -> None:
        replica = self.replicas[shard]

        def confirmed(held: bool) -> None:
            self.world.send(self.id, CLIENT, reply, op, replica.snapshot(group) if held else None)

        lease.confirm(replica, confirmed)

    def on_confirm(self, shard: int, link: Link, token: int) -> None:
        lease.on_confirm(self.replicas[shard], link, token)

    def on_confirmed(self, shard: int, link: Link, token: int, held: bool) -> None:
        lease.on_confirmed(self.replicas[shard], link, token, held)

    def on_lease(self, nonce: int, grants: tuple[tuple[int, bool], ...]) -> None:
        lease.granted(self, nonce, grants)

    def on_write_hold(self, shard: int, epoch: int, hold_ms: float) -> None:
        lease.released(self.replicas[shard], epoch, hold_ms)
