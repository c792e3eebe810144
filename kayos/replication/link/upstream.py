"""The downstream side of a replication link: ``UpstreamLink`` follows a replica's upstream.

``UpstreamLink`` (the downstream side of a link) connects to the upstream, handshakes, subscribes
(rolling back first when told to), forwards and applies ``BATCH`` frames as store commits (merging
those that queued up while the previous commit was fsyncing) and reports ``ACK`` / ``COMMITTED``
upstream; ``COMMIT_POINT`` frames tell it what consumers may see. See
docs/replication-protocol.md for the frames and rules this follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from kayos import limits, tlsconfig
from kayos.errors import (
    KayosError,
    ProtocolError,
    ReplicationError,
    RollbackTooFarError,
)
from kayos.identity import ClusterIdentity
from kayos.replication.link import handshake, liveness
from kayos.replication.link.copied import copied_bytes
from kayos.replication.link.pacer import CopyPacer
from kayos.replication.link.stream import (
    FrameStream,
    close_with,
    raise_error_frame,
    recv_answering_pings,
    recv_or_companion_failure,
)
from kayos.replication.logic import chain
from kayos.replication.shard.head_writes import commit_args
from kayos.replication.shard.local_meta import (
    CATCH_UP_META_KEY,
    LOCAL_META_PREFIXES,
    ROLLED_BACK_META_KEY,
    TAKEOVER_META_KEY,
    pack_takeover,
)
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import auth as link_auth
from kayos.replication.wire import frames as fr

log = logging.getLogger("kayos.replication")


class UpstreamLink:
    """Keeps a replica subscribed to its upstream, reconnecting with backoff for ever.

    A learner replica's link says ``HELLO`` role ``learner``. A head repairing its store makes one
    towards ``peer`` (its downstream) with ``role="repair"`` and ``until_caught_up``: the link
    ends once the store reaches what ``SUBSCRIBED`` named (``done`` is set), and never rolls back.
    """

    def __init__(
        self,
        replica: ShardReplica,
        *,
        connect: Callable[..., Any] | None = None,
        peer: str | None = None,
        role: str | None = None,
        until_caught_up: bool = False,
    ) -> None:
        self.replica = replica
        peer = peer or replica.upstream
        assert peer is not None, "a link needs an upstream"
        self.peer: str = peer
        if role is None:
            if replica.role == "learner":
                role = "learner"
            else:
                role = "tail" if replica.shard.is_tail(replica.node_id) else "middle"
        self.role = role
        self.copy = role in fr.COPY_ROLES
        self.until_caught_up = until_caught_up
        self.done = asyncio.Event()
        # Link health is kept by peer; a repair link's apart from the chain's links to that peer.
        self._health_key = f"repair:{peer}" if role == "repair" else peer
        # A link leaves from this node's own topology host: the upstream checks the source
        # address against it (docs/replication-protocol.md, "Peer authentication").
        own_host = replica.topology.nodes[replica.node_id].host
        self._connect = connect or functools.partial(
            asyncio.open_connection, local_addr=(own_host, 0)
        )
        self._stopped = False
        # Set when the link stopped because the learner must wipe its store and copy the file.
        self.reset_by_copy = False
        # When the current session started following, and the entry payload bytes it copied in
        # catch-up (its "caught up" log line).
        self._copy_started_s = 0.0
        self._copy_bytes = 0
        # The last seq of the current link's first batch with a map (the upstream's whole one).
        self._first_batch_last: int | None = None
        self.connected = asyncio.Event()
        # Whether the current session got as far as being linked (``connected`` set).
        self.linked = False
        # Told (peer, error) when a session fails: the node reports a neighbour whose link was
        # reset, refused or ended to the cluster manager (kayos/node/reports.py).
        self.on_failure: Callable[[str, BaseException], None] | None = None

    def stop(self) -> None:
        self._stopped = True

    def _copy_instead(self, why: str) -> NoReturn:
        """A learner whose store must be reset takes the upstream's store file instead of
        replaying its log from seq 1 (docs/replication-protocol.md, "Store snapshots"): the link
        stops, saying so in ``reset_by_copy``; the node wipes the store and copies the file."""
        self.reset_by_copy = True
        self.stop()
        raise EOFError(f"{why}: copying {self.peer}'s store file instead")

    @property
    def stopping(self) -> bool:
        return self._stopped

    async def run(self) -> None:
        replica = self.replica
        delay_ms = limits.link_retry_delay_ms_min
        while not self._stopped:
            self.linked = False
            try:
                await self.attempt()
                delay_ms = limits.link_retry_delay_ms_min
            except asyncio.CancelledError:
                raise
            except (OSError, KayosError, EOFError) as exc:
                if self.linked:
                    # A link that was up and broke starts its backoff over: the upstream may
                    # just be re-making its replica (a chain change), and a delay doubled by
                    # failures before the link came up would keep the chain down a second.
                    delay_ms = limits.link_retry_delay_ms_min
                if not self.done.is_set():
                    log.info("shard %s: link to %s failed: %s", replica.shard_id, self.peer, exc)
                    if self.on_failure is not None and not self.stopping:
                        self.on_failure(self.peer, exc)
            if self.stopping:
                break
            jitter = 0.5 + replica.rng.random()
            await asyncio.sleep(delay_ms * jitter / 1000)
            delay_ms = min(delay_ms * 2, limits.link_retry_delay_ms_max)

    async def attempt(self) -> None:
        """One session, without the retries of ``run``: a repair going through several peers
        moves on to the next when this one fails (it raises) or holds too little."""
        try:
            await self._session()
        finally:
            replica = self.replica
            self.connected.clear()
            if replica.upstream_stream is not None:
                replica.upstream_stream.close()
                replica.upstream_stream = None
                replica.changed.notify()

    async def _session(self) -> None:
        replica = self.replica
        peer = self.peer
        address = replica.topology.nodes[peer]
        identity = replica.topology.identity
        if identity is None or identity.is_placeholder:
            raise handshake.no_identity_error(replica.node_id)
        claim = link_auth.LinkClaim(
            replica.node_id, peer, replica.shard_id, replica.epoch, self.role
        )
        async with asyncio.timeout(limits.handshake_ms_max / 1000):
            reader, writer = await self._connect(
                address.host, address.bin_port, **tlsconfig.connect_options(address.host)
            )
        stream = FrameStream(
            reader, writer, replica.clock, frame_bytes_max=limits.handshake_frame_bytes_max
        )
        health = replica.link_health.setdefault(
            self._health_key, liveness.LinkHealth(peer, "upstream")
        )
        pinger: asyncio.Task[None] | None = None
        try:
            await self._handshake(stream, identity, claim)
            # Pinged and watched from HELLO_OK on, as the acceptor does: an upstream that goes
            # silent before SUBSCRIBED is dropped within the silence bound, not TCP's minutes.
            pinger = asyncio.create_task(
                liveness.keep_alive(
                    stream, replica.clock, f"shard {replica.shard_id}: upstream {peer}"
                )
            )
            subscribed, from_seq = await self._subscribe(stream)
            catch_up_target = await self._adopt(subscribed, from_seq)
            self._go_live(stream, health, catch_up_target)
            await self._follow(stream, catch_up_target)
        finally:
            if pinger is not None:
                pinger.cancel()
            health.detach(stream)
            stream.close()

    async def _handshake(
        self, stream: FrameStream, identity: ClusterIdentity, claim: link_auth.LinkClaim
    ) -> None:
        """``HELLO``, the proof of the cluster secret, and the upstream's ``HELLO_OK``."""
        replica = self.replica
        async with asyncio.timeout(limits.handshake_ms_max / 1000):
            hello = fr.Hello(
                fr.PROTOCOL_VERSION, replica.node_id, replica.shard_id, replica.epoch, self.role
            )
            stream.send(hello)
            await handshake.prove_to_upstream(stream, identity, claim)
            reply = await stream.recv()
        if isinstance(reply, fr.ErrorFrame):
            raise_error_frame(reply)
        if not isinstance(reply, fr.HelloOk):
            raise ProtocolError(f"expected HELLO_OK, got {type(reply).__name__}")
        if reply.protocol_version < fr.LINK_PROTOCOL_VERSION_MIN:
            raise ProtocolError(
                f"upstream {self.peer} speaks protocol version "
                f"{reply.protocol_version}; links need {fr.LINK_PROTOCOL_VERSION_MIN}"
            )
        stream.lift_frame_bound()

    async def _adopt(self, subscribed: fr.Subscribed, from_seq: int) -> int:
        """Records the upstream's takeover table and how far behind this store is, and restarts
        the links below where that calls for it; returns the catch-up target (the upstream's
        last seq when it subscribed this link)."""
        replica = self.replica
        if replica.store.last_seq != from_seq - 1:
            # The store moved after the SUBSCRIBE (a commit landed late): the verdict was
            # for another log. Subscribe again from where the store is now.
            raise ReplicationError(
                f"store at {replica.store.last_seq} after subscribing from {from_seq}"
            )
        table = list(subscribed.takeover_table)
        table_changed = table != replica.takeover_table()
        behind = replica.store.last_seq < subscribed.last_seq
        await asyncio.to_thread(
            replica.store.commit,
            [],
            meta={
                TAKEOVER_META_KEY: pack_takeover(table),
                CATCH_UP_META_KEY: subscribed.last_seq if behind else None,
            },
        )
        replica.catching_up = behind
        if table_changed:
            # The links below recorded the old table, which does not name the masters of
            # what comes now: with it, their next SUBSCRIBE would look diverged and roll back
            # committed entries. They subscribe again and record this one.
            replica.close_downstream_links()
        if behind:
            # Catch-up may split an all-or-nothing batch; links below would pass the halves
            # on to replicas that serve consumers. They resubscribe once this one is whole.
            replica.close_downstream_links()
        return subscribed.last_seq

    def _go_live(
        self, stream: FrameStream, health: liveness.LinkHealth, catch_up_target: int
    ) -> None:
        """The subscribed link becomes the replica's upstream link."""
        replica = self.replica
        health.heard(catch_up_target)
        health.attach(stream)
        stream.on_round_trip = health.latency.add
        # A commit the last link's applier was cancelled in landed without being counted:
        # step the progress and wake the senders before reporting to the new upstream.
        replica.local_commit_done()
        replica.link_point_heard = False
        replica.upstream_stream = stream
        replica.upstream_synced = True
        replica.downstream_event(chain.UpstreamLinked())
        if self.role == "learner":
            # What it holds, at once: its tail counts it from its first report, and a
            # learner with nothing to copy or commit (an empty shard) sends no other
            # (docs/replication-protocol.md, "Counting a catch-up follower").
            stream.send(fr.Ack(replica.shard_id, replica.store.last_seq))
        self.connected.set()
        self.linked = True

    async def _subscribe(self, stream: FrameStream) -> tuple[fr.Subscribed, int]:
        """The upstream's SUBSCRIBED without a rollback, and the from_seq it answers."""
        replica = self.replica
        for _ in range(3):
            from_seq = replica.store.last_seq + 1
            # The commit point it knows, within what it holds: an upstream that lacks part of it
            # lost committed entries (docs/replication-protocol.md, "An upstream that lacks
            # committed entries").
            point = min(replica.commit_point, replica.store.last_seq)
            table = tuple(replica.takeover_table())
            stream.send(fr.Subscribe(replica.shard_id, from_seq, table, point))
            reply = await recv_answering_pings(stream)
            if reply is None:
                raise EOFError("upstream closed the link before SUBSCRIBED")
            if isinstance(reply, fr.ErrorFrame):
                if reply.code == RollbackTooFarError.code and self.role == "learner":
                    self._copy_instead("the upstream can no longer reconcile this store")
                if reply.code == RollbackTooFarError.code and self.role != "repair":
                    # Not a verdict on this log: the upstream holds more than this member but
                    # compaction purged tombstones it would need to send; the reset re-copies
                    # everything from it.
                    await replica.rollback(0)
                    continue
                raise_error_frame(reply)
            if not isinstance(reply, fr.Subscribed) or reply.shard != replica.shard_id:
                raise ProtocolError(f"expected SUBSCRIBED, got {type(reply).__name__}")
            if reply.rollback_to is None:
                return reply, from_seq
            if self.role == "repair":
                if await replica.reset_to_repair(reply):
                    continue
                # It holds at least what the peer holds: nothing to fetch, nothing to drop.
                self._caught_up()
                raise EOFError(f"{self.peer} holds no more than this replica")
            replica.check_rollback_verdict(reply.rollback_to, reply)
            if reply.rollback_to == 0 and self.role == "learner":
                self._copy_instead("no history in common with the upstream")
            log.warning(
                "shard %s: rolling back from %s to %s to follow %s",
                replica.shard_id,
                replica.store.last_seq,
                reply.rollback_to,
                self.peer,
            )
            await replica.rollback(reply.rollback_to)
        raise ReplicationError("upstream kept asking for a rollback")

    async def _follow(self, stream: FrameStream, catch_up_target: int) -> None:
        replica = self.replica
        batches: asyncio.Queue[fr.Batch | fr.Metadata | None] = asyncio.Queue()
        applier = asyncio.create_task(self._apply(batches, catch_up_target))
        applier.add_done_callback(close_with(stream))
        expected = replica.store.last_seq + 1
        first_batch = True
        self._copy_started_s = time.perf_counter()
        self._copy_bytes = 0
        self._first_batch_last = None
        point_heard = catch_up_target  # live entries are those the chain commits past it
        try:
            while True:
                frame = await recv_or_companion_failure(stream, applier)
                if frame is None:
                    raise EOFError("upstream closed the link")
                if isinstance(frame, fr.Batch):
                    if frame.shard != replica.shard_id or frame.first_seq != expected:
                        raise ProtocolError(
                            f"BATCH {frame.first_seq}..{frame.last_seq} where {expected} was due"
                        )
                    expected = frame.last_seq + 1
                    health = replica.link_health.get(self._health_key)
                    if health is not None:
                        health.heard(frame.last_seq)
                    if frame.last_seq <= catch_up_target:
                        replica.refetched_entries += len(frame.seqs)
                        size = _batch_bytes(frame)
                        replica.refetched_bytes += size
                        copied_bytes["log"] += size
                        self._copy_bytes += size
                    if first_batch and frame.meta is not None:
                        # The link's first map (batches before it, read back past the upstream's
                        # reach, carry none: this replica keeps its own until then).
                        first_batch = False
                        frame = _with_meta_deletes(frame, replica.store.meta)
                        self._first_batch_last = frame.last_seq
                    # Forward first, persist next: the batch goes down before its commit.
                    # What the upstream held when this link subscribed is old: its time is unknown.
                    replica.accept(
                        frame, _batch_bytes(frame), live=frame.last_seq > catch_up_target
                    )
                    batches.put_nowait(frame)
                elif isinstance(frame, fr.Metadata):
                    check_idle_map(replica, frame, expected - 1)
                    # The link's map from now on: a later batch's meta holds changes only.
                    first_batch = False
                    batches.put_nowait(frame)  # applied once the batches before it committed
                elif isinstance(frame, fr.CommitPoint):
                    if self.copy and frame.committed_seq > point_heard:
                        # The chain above commits anew: it takes live writes (the copy is paced
                        # by how many).
                        replica.live_at_s = replica.clock.monotonic_s()
                        replica.live_rate.note(replica.live_at_s, frame.committed_seq - point_heard)
                        point_heard = frame.committed_seq
                    replica.link_point_heard = True
                    replica.downstream_event(chain.UpstreamCommitPoint(frame.committed_seq))
                    replica.changed.notify()
                elif isinstance(frame, fr.Ping):
                    stream.send(fr.Pong(frame.nonce))
                elif isinstance(frame, fr.Pong):
                    pass  # liveness only (counted by the stream)
                elif isinstance(frame, fr.Confirmed):
                    replica.changed.notify()  # a snapshot may wait for it (confirm_chain)
                elif isinstance(frame, fr.ErrorFrame):
                    raise_error_frame(frame)
                else:
                    raise ProtocolError(f"unexpected {type(frame).__name__} on a link")
        finally:
            applier.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await applier
            # A commit the applier was awaiting still runs in its thread: let it land before
            # deciding what was lost, and before the next SUBSCRIBE names a from_seq.
            await replica.settle()
            replica.discard_unpersisted()

    async def _apply(
        self, batches: asyncio.Queue[fr.Batch | fr.Metadata | None], catch_up_target: int
    ) -> None:
        """Commits accepted batches, merging what piled up during the previous commit."""
        replica = self.replica
        if replica.store.last_seq >= catch_up_target:
            replica.catching_up = False
            self._caught_up()
            if self._stopped:
                return
        # A batch taken from the queue that would have made the merge too big: the next group's
        # first.
        carried: fr.Batch | fr.Metadata | None = None
        decode_seen_s = 0.0
        pacer = self._catch_up_pacer() if self.copy else None
        while True:
            first = carried if carried is not None else await batches.get()
            carried = None
            if first is None:
                return
            if isinstance(first, fr.Metadata):
                await replace_meta(replica, first)
                continue
            group, carried = _group_behind(first, batches)
            columns, options = commit_args(group, validated=False)
            started = time.perf_counter()
            await replica.timed_commit(columns, inline=batches.empty(), **options)
            stream = replica.upstream_stream
            if pacer is not None and replica.catching_up and stream is not None:
                # A copy's own work (decoding, committing) competes with the chain for the
                # machine too: while it catches up on a shard taking live writes, it takes a
                # share set by the pacer from the commits it hears of.
                decoded_s, decode_seen_s = stream.decode_s - decode_seen_s, stream.decode_s
                piece_bytes = sum(
                    len(key) + len(value or b"")
                    for b in group
                    for key, value in zip(b.keys, b.values, strict=True)
                )
                await pacer.after_piece(time.perf_counter() - started + decoded_s, piece_bytes)
            last_entry = max((b.seqs[-1] for b in group if b.seqs), default=0)
            replica.last_entry_seq = max(replica.last_entry_seq, last_entry)
            if replica.catching_up and replica.store.last_seq >= catch_up_target:
                replica.catching_up = False
                self._log_caught_up()
                if pacer is not None:
                    pacer.finish()
                self._caught_up()
            replica.local_commit_done()
            meta_at = self._first_batch_last
            if meta_at is not None and replica.store.last_seq >= meta_at:
                self._first_batch_last = None
                await replica.metadata_replaced()
            stream = replica.upstream_stream
            if stream is not None:
                if self.copy:
                    # A copy's reports only open its window upstream (it counts in no commit).
                    stream.send(fr.Ack(replica.shard_id, replica.store.last_seq))
                await stream.drain()
            if self._stopped:
                return

    def _catch_up_pacer(self) -> CopyPacer:
        replica = self.replica
        return CopyPacer(
            f"shard {replica.shard_id}: catch-up commits",
            replica.clock,
            replica.live_rate,
            limits.catchup_produce_share_max,
            ceiling_mb_per_s=replica.copy_rate_mb_per_s_max,
            reports=replica.copies,
            # Its commits are the copy itself: their time says how big its pieces are, not how
            # live work fares.
            judge_commits=False,
        )

    def _log_caught_up(self) -> None:
        seconds = time.perf_counter() - self._copy_started_s
        log.info(
            "shard %s: caught up at %s from %s (copy_mode=log: %d bytes of entries "
            "in %.2f s, %.1f MB/s)",
            self.replica.shard_id,
            self.replica.store.last_seq,
            self.peer,
            self._copy_bytes,
            seconds,
            self._copy_bytes / seconds / 1e6 if seconds > 0 else 0.0,
        )

    def _caught_up(self) -> None:
        """The store reached what the upstream held when it subscribed: a repair link is done;
        a member that was repairing serves its downstreams again."""
        replica = self.replica
        if self.until_caught_up:
            self._stopped = True
            self.done.set()
        elif replica.repairing:
            replica.repairing = False
            log.warning(
                "shard %s: repaired: re-fetched through %s from %s",
                replica.shard_id,
                replica.store.last_seq,
                self.peer,
            )


def _group_behind(
    first: fr.Batch, batches: asyncio.Queue[fr.Batch | fr.Metadata | None]
) -> tuple[list[fr.Batch], fr.Batch | fr.Metadata | None]:
    """``first`` and the batches queued behind it that one store commit takes (within the bounds
    of one batch; a map only after the batches), and the item taken that did not fit, if any:
    the next group's first."""
    group = [first]
    entries = len(first.seqs)
    payload = _batch_bytes(first)
    while not batches.empty() and entries < limits.batch_entries_max // 2:
        nxt = batches.get_nowait()
        if nxt is None:
            break
        # One store commit: within the bounds of one batch; a map after the batches.
        if (
            isinstance(nxt, fr.Metadata)
            or entries + len(nxt.seqs) > limits.batch_entries_max
            or payload + _batch_bytes(nxt) > limits.batch_bytes_max
        ):
            return group, nxt
        group.append(nxt)
        entries += len(nxt.seqs)
        payload += _batch_bytes(nxt)
    return group, None


def _with_meta_deletes(batch: fr.Batch, own_meta: dict[str, Any]) -> fr.Batch:
    """A link's first batch holds the upstream's whole replicated metadata: keys this replica
    holds that it lacks were deleted upstream while the link was down. The batch as committed
    and forwarded says so with explicit deletes."""
    full = batch.meta or {}
    deletes = _deletes(full, own_meta)
    if not deletes:
        return batch
    return dataclasses.replace(batch, meta={**full, **deletes})


def _deletes(full: dict[str, Any], own_meta: dict[str, Any]) -> dict[str, None]:
    """A delete for each replicated key held here that the upstream's whole map lacks."""
    return {
        name: None
        for name in own_meta
        if not name.startswith(LOCAL_META_PREFIXES) and name not in full
    }


def check_idle_map(replica: ShardReplica, frame: fr.Metadata, last_received: int) -> None:
    """METADATA is as of the last seq the link carried, and names replicated keys only
    (docs/replication-protocol.md, "The metadata on an idle link")."""
    if frame.shard != replica.shard_id or frame.seq != last_received:
        raise ProtocolError(
            f"METADATA of shard {frame.shard} as of {frame.seq}, where shard"
            f" {replica.shard_id} as of {last_received} was due"
        )
    local = sorted(name for name in frame.meta if name.startswith(LOCAL_META_PREFIXES))
    if local:
        raise ProtocolError(f"METADATA names a key local to a replica: {local[0]!r}")


async def replace_meta(replica: ShardReplica, frame: fr.Metadata) -> None:
    """The upstream's whole replicated map as of the seq this store holds (the batches before
    it committed): it replaces this replica's, in one commit that claims no seq and settles a
    rollback that kept the metadata. The links below were sent the old map and would hear of
    no change that comes without a seq: if any key changed, they subscribe again."""
    own = replica.store.meta
    meta: dict[str, Any] = {**frame.meta, **_deletes(frame.meta, own)}
    changed = any(own.get(name) != value for name, value in meta.items())
    settles = replica.rolled_back_to() is not None
    if settles:
        meta[ROLLED_BACK_META_KEY] = None
    if changed or settles:
        await asyncio.to_thread(replica.store.commit, [], meta=meta)
        log.info(
            "shard %s: replicated metadata replaced as of %s (%s keys)",
            replica.shard_id,
            frame.seq,
            len(frame.meta),
        )
    if changed:
        replica.close_downstream_links()
    replica.changed.notify()  # senders waiting for this replica's map to settle


def _batch_bytes(batch: fr.Batch) -> int:
    return sum(map(len, batch.keys)) + sum(map(len, filter(None, batch.values)))
