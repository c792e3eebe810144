"""The learner's side of a store snapshot over a replication link (docs/replication-protocol.md,
"Store snapshots"): connect as ``learner``, prove the cluster secret, send ``SNAPSHOT_REQUEST``,
write the chunks, install the copy. Broken attempts delete their file and start again from
offset 0, at most ``limits.snapshot_attempts_max`` times in a row."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kayos import limits, tlsconfig
from kayos.clock import Clock
from kayos.errors import KayosError, ProtocolError
from kayos.replication.link import handshake
from kayos.replication.link.stream import FrameStream, raise_error_frame
from kayos.replication.shard.snapshot import SnapshotWriter
from kayos.replication.wire import auth as link_auth
from kayos.replication.wire import frames as fr
from kayos.topology import Topology

log = logging.getLogger("kayos.replication")


@dataclass(slots=True)
class SnapshotProgress:
    """What a learner's status shows while it copies a store file."""

    upstream: str
    attempts: int = 0
    received_bytes: int = 0
    total_bytes: int = 0
    last_seq: int = 0
    seconds: float = 0.0
    done: bool = False
    problem: str = ""


async def fetch_snapshot(
    *,
    node_id: str,
    topology: Topology,
    shard_id: int,
    peer: str,
    directory: str,
    clock: Clock,
    rng: random.Random,
    progress: SnapshotProgress,
    connect: Callable[..., Any] | None = None,
) -> bool:
    """Copies ``peer``'s store of the shard into ``directory``; True once installed, False after
    ``snapshot_attempts_max`` failed attempts (the caller copies entry by entry instead)."""
    delay_ms = limits.link_retry_delay_ms_min
    for _ in range(limits.snapshot_attempts_max):
        progress.attempts += 1
        began = time.perf_counter()
        try:
            await _attempt(node_id, topology, shard_id, peer, directory, clock, progress, connect)
        except asyncio.CancelledError:
            raise
        except (OSError, KayosError, EOFError) as exc:
            progress.problem = str(exc)
            log.info("shard %s: snapshot from %s failed: %s", shard_id, peer, exc)
            await asyncio.sleep(delay_ms * (0.5 + rng.random()) / 1000)
            delay_ms = min(delay_ms * 2, limits.link_retry_delay_ms_max)
            continue
        progress.seconds = time.perf_counter() - began
        progress.done = True
        log.info(
            "shard %s: installed a snapshot of %d bytes through seq %s from %s in %.2f s",
            shard_id,
            progress.total_bytes,
            progress.last_seq,
            peer,
            progress.seconds,
        )
        return True
    return False


async def _attempt(
    node_id: str,
    topology: Topology,
    shard_id: int,
    peer: str,
    directory: str,
    clock: Clock,
    progress: SnapshotProgress,
    connect: Callable[..., Any] | None,
) -> None:
    identity = topology.identity
    if identity is None or identity.is_placeholder:
        raise handshake.no_identity_error(node_id)
    epoch = topology.epoch
    address = topology.nodes[peer]
    own_host = topology.nodes[node_id].host
    opener = connect or functools.partial(asyncio.open_connection, local_addr=(own_host, 0))
    handshake_s = limits.handshake_ms_max / 1000
    async with asyncio.timeout(handshake_s):
        reader, writer = await opener(
            address.host, address.bin_port, **tlsconfig.connect_options(address.host)
        )
    stream = FrameStream(reader, writer, clock, frame_bytes_max=limits.handshake_frame_bytes_max)
    writer_file: SnapshotWriter | None = None
    try:
        claim = link_auth.LinkClaim(node_id, peer, shard_id, epoch, "learner")
        async with asyncio.timeout(handshake_s):
            stream.send(fr.Hello(fr.PROTOCOL_VERSION, node_id, shard_id, epoch, "learner"))
            await handshake.prove_to_upstream(stream, identity, claim)
            reply = await stream.recv()
        if isinstance(reply, fr.ErrorFrame):
            raise_error_frame(reply)
        if not isinstance(reply, fr.HelloOk):
            raise ProtocolError(f"expected HELLO_OK, got {type(reply).__name__}")
        stream.lift_frame_bound()
        stream.send(fr.SnapshotRequest(shard_id))
        writer_file = await asyncio.to_thread(SnapshotWriter, directory, shard_id)
        progress.received_bytes = 0
        await receive_snapshot(stream, writer_file, peer, progress)
        writer_file = None
    finally:
        stream.close()
        if writer_file is not None:
            await asyncio.to_thread(writer_file.discard)


async def receive_snapshot(
    stream: FrameStream, writer_file: SnapshotWriter, peer: str, progress: SnapshotProgress
) -> None:
    """Reads chunks while a task writes the ones before them (at most
    ``limits.snapshot_chunks_queued_max`` waiting), then installs the copy at ``SNAPSHOT_END``."""
    queue: asyncio.Queue[fr.SnapshotChunk | None] = asyncio.Queue(limits.snapshot_chunks_queued_max)

    async def write_all() -> None:
        while (chunk := await queue.get()) is not None:
            await asyncio.to_thread(writer_file.write, chunk)

    writing = asyncio.create_task(write_all())
    silence_s = limits.peer_silence_ms_max / 1000
    try:
        while True:
            async with asyncio.timeout(silence_s):
                frame = await stream.recv()
            if frame is None:
                raise EOFError(f"{peer} closed the link mid snapshot")
            if isinstance(frame, fr.SnapshotChunk):
                await _put_or_fail(queue, frame, writing)
                progress.received_bytes += len(frame.data)
            elif isinstance(frame, fr.SnapshotEnd):
                await _put_or_fail(queue, None, writing)
                await writing
                await asyncio.to_thread(writer_file.install, frame)
                progress.total_bytes = frame.total_bytes
                progress.last_seq = frame.last_seq
                return
            elif isinstance(frame, fr.Ping):
                stream.send(fr.Pong(frame.nonce))
            elif isinstance(frame, fr.ErrorFrame):
                raise_error_frame(frame)
            elif not isinstance(frame, fr.Pong):
                raise ProtocolError(f"unexpected {type(frame).__name__} in a snapshot")
    finally:
        if not writing.done():
            # Let the write under way finish (a thread cannot be cancelled): the file is closed
            # and removed only after it.
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await writing


async def _put_or_fail(
    queue: asyncio.Queue[fr.SnapshotChunk | None],
    item: fr.SnapshotChunk | None,
    writing: asyncio.Task[None],
) -> None:
    """Queues ``item`` for the writer, raising its error if it failed meanwhile."""
    put = asyncio.ensure_future(queue.put(item))
    await asyncio.wait({put, writing}, return_when=asyncio.FIRST_COMPLETED)
    if writing.done() and not writing.cancelled() and writing.exception() is not None:
        put.cancel()
        writing.result()  # raises the writer's error
    if not put.done():
        put.cancel()
        raise ProtocolError("the snapshot writer stopped before the copy's end")
