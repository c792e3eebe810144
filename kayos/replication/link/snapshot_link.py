"""The learner's side of a store snapshot over a replication link (docs/replication-protocol.md,
"Store snapshots"): connect as ``learner``, prove the cluster secret, send ``SNAPSHOT_REQUEST``
(or ``SNAPSHOT_RESUME`` from the verified offset of the attempts before), write the chunks as
they are checked, install the copy. A broken attempt keeps the verified prefix, durably, and the
next one continues from it, at most ``limits.snapshot_attempts_max`` attempts in a row."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kayos import limits, tlsconfig
from kayos.clock import Clock
from kayos.errors import KayosError, ProtocolError
from kayos.replication.link import handshake
from kayos.replication.link.copied import copied_bytes
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
    # Bytes received over every attempt, the verified offset of the copy (bytes below it passed
    # kayos check's checks), and the offset the attempt under way started from.
    received_bytes: int = 0
    verified_bytes: int = 0
    start_offset: int = 0
    total_bytes: int = 0
    last_seq: int = 0
    seconds: float = 0.0
    done: bool = False
    problem: str = ""
    copy_mode: str = "file"

    @property
    def mb_per_s(self) -> float:
        """Bytes received per second of the whole copy, in MB (10**6 bytes)."""
        return self.received_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


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
    began = time.perf_counter()
    writer_file = await asyncio.to_thread(SnapshotWriter, directory, shard_id)
    for _ in range(limits.snapshot_attempts_max):
        progress.attempts += 1
        try:
            await _attempt(node_id, topology, shard_id, peer, clock, progress, writer_file, connect)
        except asyncio.CancelledError:
            await asyncio.to_thread(writer_file.keep)
            raise
        except (OSError, KayosError, EOFError) as exc:
            progress.problem = str(exc)
            kept = await asyncio.to_thread(writer_file.keep)
            progress.verified_bytes = kept
            log.info(
                "shard %s: snapshot from %s failed at %d bytes (verified %d, kept): %s",
                shard_id,
                peer,
                writer_file.receiver.received,
                kept,
                exc,
            )
            await asyncio.sleep(delay_ms * (0.5 + rng.random()) / 1000)
            delay_ms = min(delay_ms * 2, limits.link_retry_delay_ms_max)
            continue
        progress.seconds = time.perf_counter() - began
        progress.done = True
        copied_bytes["file"] += progress.received_bytes
        log.info(
            "shard %s: copy_mode=file: installed a copy of %d bytes through seq %s from %s: "
            "received %d bytes in %d attempts, %.2f s, %.1f MB/s",
            shard_id,
            progress.total_bytes,
            progress.last_seq,
            peer,
            progress.received_bytes,
            progress.attempts,
            progress.seconds,
            progress.mb_per_s,
        )
        return True
    copied_bytes["file"] += progress.received_bytes
    await asyncio.to_thread(writer_file.discard)
    return False


async def _attempt(
    node_id: str,
    topology: Topology,
    shard_id: int,
    peer: str,
    clock: Clock,
    progress: SnapshotProgress,
    writer_file: SnapshotWriter,
    connect: Callable[..., Any] | None,
) -> None:
    identity = topology.identity
    if identity is None or identity.is_placeholder:
        raise handshake.no_identity_error(node_id)
    epoch = topology.epoch
    address = topology.nodes[peer]
    own_host = topology.nodes[node_id].host
    # The reader's buffer holds up to twice its limit before the socket stops being read: a
    # piece's worth, so each wake-up of the learner takes up to a piece rather than 64 KiB.
    opener = connect or functools.partial(
        asyncio.open_connection,
        local_addr=(own_host, 0),
        limit=limits.snapshot_piece_bytes_max,
    )
    handshake_s = limits.handshake_ms_max / 1000
    async with asyncio.timeout(handshake_s):
        reader, writer = await opener(
            address.host, address.bin_port, **tlsconfig.connect_options(address.host)
        )
    stream = FrameStream(reader, writer, clock, frame_bytes_max=limits.handshake_frame_bytes_max)
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
        request = await asyncio.to_thread(writer_file.begin, reply.protocol_version)
        progress.start_offset = writer_file.start
        stream.send(request)
        await receive_snapshot(stream, writer_file, peer, progress)
    finally:
        stream.close()


async def receive_snapshot(
    stream: FrameStream, writer_file: SnapshotWriter, peer: str, progress: SnapshotProgress
) -> None:
    """Reads chunks while a task writes and checks the ones before them (at most
    ``limits.snapshot_chunks_queued_max`` pieces waiting), then installs the copy at
    ``SNAPSHOT_END``. A chunk's data is read from the stream in pieces of at most
    ``limits.snapshot_piece_bytes_max`` bytes as they arrive (``read_chunk``), not decoded as one
    frame, so the check's verified offset follows the bytes received."""
    queue: asyncio.Queue[fr.SnapshotChunk | None] = asyncio.Queue(limits.snapshot_chunks_queued_max)

    async def write_all() -> None:
        while (chunk := await queue.get()) is not None:
            await asyncio.to_thread(writer_file.write, chunk)
            progress.verified_bytes = writer_file.check.verified

    async def take(piece: fr.SnapshotChunk) -> None:
        await _put_or_fail(queue, piece, writing)
        progress.received_bytes += len(piece.data)

    writing = asyncio.create_task(write_all())
    silence_s = limits.peer_silence_ms_max / 1000
    try:
        while True:
            if stream.buffered():
                async with asyncio.timeout(silence_s):
                    frame = await stream.recv()
            else:
                frame = await read_chunk(stream.reader, take, silence_s)
            if frame is None:
                continue  # a chunk read in pieces
            if isinstance(frame, fr.SnapshotChunk):
                await take(frame)
            elif isinstance(frame, fr.SnapshotEnd):
                await _put_or_fail(queue, None, writing)
                await writing
                await asyncio.to_thread(writer_file.install, frame)
                progress.verified_bytes = frame.total_bytes
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
            # Let the write under way finish (a thread cannot be cancelled): the file is kept
            # or removed only after it.
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await writing


_LENGTH_KIND = struct.Struct(">IB")
_CHUNK_KIND = next(spec.kind for spec in fr.FRAME_TABLE if spec.frame_type is fr.SnapshotChunk)
# msgpack's unsigned integer and bin headers: first byte -> bytes of the value after it.
_UINT_BYTES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_BIN_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}


async def read_chunk(
    reader: asyncio.StreamReader,
    take: Callable[[fr.SnapshotChunk], Awaitable[None]],
    silence_s: float,
) -> fr.Frame | None:
    """Reads the next frame from ``reader``. A ``SNAPSHOT_CHUNK`` is read in pieces handed to
    ``take`` as they arrive (each a ``SnapshotChunk`` at its own offset), and None returned;
    any other frame is read whole and returned. EOF raises ``EOFError``."""
    async with asyncio.timeout(silence_s):
        head = await reader.readexactly(_LENGTH_KIND.size)
    length, kind = _LENGTH_KIND.unpack(head)
    if not 2 <= length <= limits.frame_bytes_max:
        raise ProtocolError(f"frame length {length} outside 2..{limits.frame_bytes_max}")
    if kind != _CHUNK_KIND:
        async with asyncio.timeout(silence_s):
            body = await reader.readexactly(length - 1)
        (frame,) = fr.decode(head + body)
        return frame
    async with asyncio.timeout(silence_s):
        if await reader.readexactly(1) != b"\x93":
            raise ProtocolError("SNAPSHOT_CHUNK: body is not an array of 3 fields")
        shard, shard_bytes = await _msgpack_header(reader, _UINT_BYTES, "shard")
        offset, offset_bytes = await _msgpack_header(reader, _UINT_BYTES, "offset")
        size, size_bytes = await _msgpack_header(reader, _BIN_BYTES, "data")
    if shard >= 2**32 or 1 + 1 + shard_bytes + offset_bytes + size_bytes + size != length:
        raise ProtocolError(
            f"SNAPSHOT_CHUNK of {length} bytes holds a shard {shard} or data of {size}"
        )
    if not 0 < size <= limits.snapshot_chunk_bytes_max:
        raise ProtocolError(f"SNAPSHOT_CHUNK data of {size} bytes")
    done = 0
    while done < size:
        async with asyncio.timeout(silence_s):
            piece = await reader.read(min(size - done, limits.snapshot_piece_bytes_max))
        if not piece:
            raise EOFError("the upstream closed the link inside a chunk")
        await take(fr.SnapshotChunk(shard, offset + done, piece))
        done += len(piece)
    return None


async def _msgpack_header(
    reader: asyncio.StreamReader, sizes: dict[int, int], what: str
) -> tuple[int, int]:
    """An unsigned integer (``_UINT_BYTES``) or a bin length (``_BIN_BYTES``): its value and the
    bytes it took."""
    first = (await reader.readexactly(1))[0]
    if sizes is _UINT_BYTES and first <= 0x7F:
        return first, 1
    width = sizes.get(first)
    if width is None:
        raise ProtocolError(f"SNAPSHOT_CHUNK: {what} has msgpack type byte {first:#04x}")
    return int.from_bytes(await reader.readexactly(width)), 1 + width


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
