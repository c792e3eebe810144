"""The upstream side of a replication link: ``serve_downstream`` feeds a downstream.

``serve_downstream`` (the upstream side) answers ``SUBSCRIBE`` and streams ``BATCH`` frames, from
memory as they are accepted or read back from its store (``kayos.replication.link.sender``),
within the link's flow-control window, and takes the downstream's reports. See
docs/replication-protocol.md for the frames and rules this follows.
"""

from __future__ import annotations

import asyncio
import contextlib

from kayos import limits
from kayos.errors import ProtocolError, UnavailableError, WrongRoleError
from kayos.replication.link import liveness
from kayos.replication.link.sender import LinkSender
from kayos.replication.link.stream import (
    FrameStream,
    close_with,
    recv_answering_pings,
    recv_or_companion_failure,
    until_hung_up,
)
from kayos.replication.logic import chain
from kayos.replication.shard import lostcommit
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.shard.snapshot import serve_snapshot
from kayos.replication.wire import frames as fr


async def serve_downstream(replica: ShardReplica, stream: FrameStream, hello: fr.Hello) -> None:
    """Runs the upstream side of one replication link until it breaks: checks the ``HELLO``,
    answers ``SUBSCRIBE`` until a verdict asks for no rollback (or serves a snapshot instead),
    then feeds the link from a ``LinkSender`` task while it takes the downstream's reports."""
    _check_hello(replica, hello)
    stream.send(fr.HelloOk(fr.PROTOCOL_VERSION, replica.node_id, replica.epoch))
    subscribe = await _subscription(replica, stream, hello)
    if subscribe is None:
        return
    # A learner or repair link is keyed apart from the chain's links: it counts in no commit.
    key = f"{hello.role}:{hello.node_id}" if hello.role in fr.COPY_ROLES else hello.node_id
    link, health = _attach(replica, stream, hello, subscribe, key)
    sender = asyncio.create_task(link.run())
    sender.add_done_callback(close_with(stream))
    confirming = _ConfirmAnswers(replica, stream)
    try:
        await _take_reports(replica, stream, hello, link, health, sender, confirming)
    finally:
        confirming.close()
        health.detach(stream)
        link.closed = True
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender
        if replica.downstream_streams.get(key) is stream:
            del replica.downstream_streams[key]
            replica.copy_links.discard(key)
        if replica.sending_links.get(key) is link:
            del replica.sending_links[key]


def _check_hello(replica: ShardReplica, hello: fr.Hello) -> None:
    """A downstream's ``HELLO``: a protocol version with links, and a peer that follows this
    member in the chain (or may copy from it)."""
    node = hello.node_id
    if hello.protocol_version < fr.LINK_PROTOCOL_VERSION_MIN:
        raise ProtocolError(
            f"replication links need protocol version {fr.LINK_PROTOCOL_VERSION_MIN}; "
            f"{node} speaks {hello.protocol_version}"
        )
    if hello.role in fr.COPY_ROLES:
        check_copy_peer(replica, node, hello.role)
        return
    expected_role = replica.shard.role_of(node)
    if replica.shard.upstream_of(node) != replica.node_id or hello.role != expected_role:
        upstream = replica.shard.upstream_of(node)
        raise WrongRoleError(
            f"{node} as {hello.role} of shard {replica.shard_id} does not follow {replica.node_id}",
            redirect=upstream,
            epoch=replica.epoch,
        )


async def _subscription(
    replica: ShardReplica, stream: FrameStream, hello: fr.Hello
) -> fr.Subscribe | None:
    """Answers ``SUBSCRIBE`` until a verdict asks for no rollback, and returns that one; None:
    the link ended first, or served a snapshot."""
    node = hello.node_id
    while True:
        frame = await recv_answering_pings(stream)
        if frame is None:
            return None
        if isinstance(frame, (fr.SnapshotRequest, fr.SnapshotResume)):
            await serve_snapshot(replica, stream, hello.role, frame, hello.protocol_version)
            await until_hung_up(stream)
            return None
        if not isinstance(frame, fr.Subscribe) or frame.shard != replica.shard_id:
            raise ProtocolError(f"expected SUBSCRIBE, got {type(frame).__name__}")
        if (replica.catching_up or replica.repairing) and hello.role != "repair":
            # Its store may hold part of an all-or-nothing batch, or lack what it lost to damage
            # (a downstream would be told to roll back acknowledged entries): nothing goes down.
            # A head repairing from a member still catching up or repairing itself (from that
            # head: each would wait for ever on the other) is served: whole entries it holds,
            # and a repair link never rolls back.
            doing = "repairing" if replica.repairing else "catching up"
            raise UnavailableError(
                f"{replica.node_id} is {doing} on shard {replica.shard_id}; retry later"
            )
        if replica.starting_new_history:
            raise UnavailableError(
                f"{replica.node_id} is starting a new history of shard {replica.shard_id}"
            )
        own_table = replica.takeover_table()
        verdict = chain.rollback_point(
            list(frame.takeover_table), own_table, frame.from_seq - 1, replica.durable
        )
        if (
            hello.role != "repair"
            and replica.role == "head"
            and chain.upstream_lacks_committed(
                list(frame.takeover_table),
                own_table,
                verdict=verdict,
                up_last=replica.durable,
                point=frame.commit_point,
            )
        ):
            assert verdict is not None
            raise UnavailableError(
                lostcommit.step_down_to_repair(replica, node, verdict, frame.commit_point)
            )
        stream.send(fr.Subscribed(replica.shard_id, verdict, tuple(own_table), replica.durable))
        if verdict is None:
            return frame


def _attach(
    replica: ShardReplica, stream: FrameStream, hello: fr.Hello, subscribe: fr.Subscribe, key: str
) -> tuple[LinkSender, liveness.LinkHealth]:
    """The subscribed link joins the replica's links below under ``key`` (replacing an older
    one of the same peer), with its sender and its health."""
    node = hello.node_id
    copy = hello.role in fr.COPY_ROLES
    old = replica.downstream_streams.pop(key, None)
    if old is not None:
        old.close()
    link = LinkSender(
        replica,
        stream,
        subscribe.from_seq - 1,
        throttled=copy,
        idle_map=hello.role != "repair"
        and hello.protocol_version >= fr.METADATA_PROTOCOL_VERSION_MIN,
    )
    replica.downstream_streams[key] = stream
    replica.sending_links[key] = link
    if copy:
        replica.copy_links.add(key)
        if replica.commit_point:
            stream.send(fr.CommitPoint(replica.shard_id, replica.commit_point))
        if hello.role == "learner":
            replica.learner_linked(node)
    else:
        replica.downstream_event(chain.DownstreamLinked(node))
    health = replica.link_health.setdefault(key, liveness.LinkHealth(node, "downstream"))
    health.peer_seq = subscribe.from_seq - 1
    health.attach(stream)
    stream.on_round_trip = health.latency.add
    return link, health


async def _take_reports(
    replica: ShardReplica,
    stream: FrameStream,
    hello: fr.Hello,
    link: LinkSender,
    health: liveness.LinkHealth,
    sender: asyncio.Task[None],
    confirming: _ConfirmAnswers,
) -> None:
    """Takes the downstream's reports (``ACK``, ``COMMITTED``), pings and ``CONFIRM``s until the
    link ends."""
    node = hello.node_id
    copy = hello.role in fr.COPY_ROLES
    while True:
        reply = await recv_or_companion_failure(stream, sender)
        if reply is None:
            return
        if link.closed:
            return  # reports still buffered from a link this replica gave up on
        if isinstance(reply, fr.Ack | fr.Committed):
            seq = reply.durable_seq if isinstance(reply, fr.Ack) else reply.committed_seq
            if seq > link.sent:
                raise ProtocolError(f"{node} reports {seq}, past {link.sent} sent to it")
            link.window.acknowledged(seq)
            link.acked.notify()
            health.heard(seq)
            link.note_ack(seq, health)
            if copy:
                if hello.role == "learner":
                    replica.learner_report(node, seq)
                continue
            event: chain.Event = (
                chain.DownstreamAck(node, seq)
                if isinstance(reply, fr.Ack)
                else chain.DownstreamCommitted(node, seq)
            )
            replica.downstream_event(event)
        elif isinstance(reply, fr.Ping):
            stream.send(fr.Pong(reply.nonce))
        elif isinstance(reply, fr.Confirm):
            confirming.answer(reply.nonce)
        elif not isinstance(reply, fr.Pong):
            raise ProtocolError(f"unexpected {type(reply).__name__} from a downstream")


class _ConfirmAnswers:
    """Answers a downstream's CONFIRMs (docs/replication-protocol.md, "Confirming a snapshot"):
    each once the chain above is confirmed after it came in (``confirm_chain``), at most
    ``limits.link_confirms_pending_max`` at a time (past it: not held, at once)."""

    def __init__(self, replica: ShardReplica, stream: FrameStream) -> None:
        self.replica = replica
        self.stream = stream
        self.pending: set[asyncio.Task[None]] = set()

    def answer(self, nonce: int) -> None:
        if len(self.pending) >= limits.link_confirms_pending_max:
            self.stream.send(fr.Confirmed(nonce, False))
            return
        task = asyncio.create_task(self._answer(nonce))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _answer(self, nonce: int) -> None:
        held = await self.replica.confirm_chain(limits.consume_commit_point_wait_ms / 1000)
        with contextlib.suppress(Exception):  # the link is gone: nobody to answer
            self.stream.send(fr.Confirmed(nonce, held))

    def close(self) -> None:
        for task in self.pending:
            task.cancel()


def check_copy_peer(replica: ShardReplica, node: str, role: str) -> None:
    """A learner is a node of the topology outside the shard's chain; a repair link comes from
    another member of it (docs/replication-protocol.md, "Learners and repair links")."""
    members = replica.shard.members
    if role == "learner":
        allowed = node in replica.topology.nodes and node not in members
    else:
        allowed = node in members and node != replica.node_id
    if not allowed:
        raise WrongRoleError(
            f"{node} may not copy shard {replica.shard_id} from {replica.node_id} as {role}",
            redirect=None,
            epoch=replica.epoch,
        )
