"""The serving side of a store copy's bytes (docs/replication-protocol.md, "Store snapshots"):
where a copy starts (0, or a learner's verified offset when the file is the same history and
generation), and each ``SNAPSHOT_CHUNK`` sent with its prefix written by hand and its data by
the kernel from the pinned file (``loop.sendfile``), wire-identical to the codec's frame with a
``bin32`` data header.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from typing import IO, Protocol

import msgpack

from kayos import limits
from kayos.errors import CorruptionError
from kayos.replication.wire import frames as fr
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import DataFile, header_end, read_header_at

_CHUNK_KIND = next(spec.kind for spec in fr.FRAME_TABLE if spec.frame_type is fr.SnapshotChunk)
_LENGTH_KIND = struct.Struct(">IB")
_BIN32 = struct.Struct(">BI")
_ARRAY3 = 0x93


class ChunkStream(Protocol):
    """What of a ``FrameStream`` a chunk is sent through."""

    writer: asyncio.StreamWriter

    def send(self, frame: fr.Frame) -> int: ...

    def ping(self) -> int: ...

    async def drain(self) -> None: ...


def chunk_prefix(shard: int, offset: int, size: int) -> bytes:
    """The bytes of ``SNAPSHOT_CHUNK(shard, offset, data)`` before ``data`` (``size`` bytes), with
    ``data`` as msgpack ``bin32``: the frame's length, kind, array header, two fields and the
    ``c6 <u32 size>`` header (docs/replication-protocol.md, "Store snapshots")."""
    fields = bytes((_ARRAY3,)) + msgpack.packb(shard) + msgpack.packb(offset)
    body_bytes = len(fields) + _BIN32.size + size
    return _LENGTH_KIND.pack(1 + body_bytes, _CHUNK_KIND) + fields + _BIN32.pack(0xC6, size)


async def pause_pinging(stream: ChunkStream, pause_s: float) -> None:
    """Sleeps ``pause_s`` (a copy pacer's pause) in steps of at most ``limits.ping_interval_ms``,
    sending a ``PING`` before each. The link's pinger cannot write while a chunk goes out by
    ``sendfile`` (asyncio refuses the write, and the pinger stops), and a learner hearing nothing
    for ``limits.peer_silence_ms_max`` gives the attempt up."""
    step_s = limits.ping_interval_ms / 1000
    while pause_s > 0:
        stream.ping()
        await asyncio.sleep(min(step_s, pause_s))
        pause_s -= step_s


def resume_offset(data_file: DataFile, header: fmt.Header, end: int, request: fr.Frame) -> int:
    """Where a copy of ``data_file`` (its current ``header`` ending at ``end``) starts for
    ``request``: a ``SNAPSHOT_RESUME``'s offset when the file is the same history and generation,
    reaches it, and has a header chunk with the request's CRC ending exactly there; else 0.
    Blocking (reads one block): run it in a thread."""
    if not isinstance(request, fr.SnapshotResume):
        return 0
    offset = request.offset
    if (
        request.store_uuid != header.store_uuid
        or request.generation != data_file.generation
        or not 0 < offset <= end
    ):
        return 0
    handle = data_file.handle
    block = (offset - 1) // fmt.BLOCK * fmt.BLOCK
    try:
        read_header_at(handle, block)
        if header_end(handle, block) != offset:
            return 0
        _, crc = fmt.parse_chunk_prefix(
            handle.pread(fmt.PREFIX_BYTES, block + 1), path=handle.path, offset=block
        )
    except CorruptionError:
        return 0
    return offset if crc == request.header_crc else 0


def open_for_sendfile(data_file: DataFile) -> IO[bytes] | None:
    """A file object of its own (own file position) on the pinned file, for ``loop.sendfile``;
    None where the handle has no descriptor (a test's fake file operations) or the system cannot
    reopen one (no ``/proc``): the caller reads and writes instead."""
    fileno = getattr(data_file.handle, "fileno", None)
    if fileno is None:
        return None
    try:
        # Reopened through /proc rather than dup'ed: a dup shares the position that
        # loop.sendfile's plain fallback (under TLS) seeks, and two copies may read one file.
        return open(f"/proc/self/fd/{fileno()}", "rb", buffering=0)
    except OSError:
        return None


def range_crc(data_file: DataFile, offset: int, size: int, buffer: bytearray, crc: int) -> int:
    """``crc`` (a CRC32C so far) extended over ``size`` bytes of the file at ``offset``, read into
    ``buffer`` (reused, at least ``size`` long). Blocking: run it in a thread."""
    view = memoryview(buffer)[:size]
    got = 0
    fileno = getattr(data_file.handle, "fileno", None)
    while got < size:
        if fileno is not None:
            read = os.preadv(fileno(), [view[got:]], offset + got)
        else:
            data = data_file.handle.pread(size - got, offset + got)
            view[got : got + len(data)] = data
            read = len(data)
        if read <= 0:
            raise CorruptionError(
                "store file shorter than its header says",
                path=data_file.handle.path,
                offset=offset + got,
            )
        got += read
    return fmt.crc32c(view, crc)


async def send_chunk(
    stream: ChunkStream,
    data_file: DataFile,
    file: IO[bytes] | None,
    shard: int,
    offset: int,
    size: int,
    buffer: bytearray,
    crc: int | None,
) -> int | None:
    """Sends ``SNAPSHOT_CHUNK(shard, offset, bytes [offset, offset + size))`` and returns ``crc``
    (the CRC32C of the bytes sent before) extended over those bytes: the prefix written, then the
    range sent by the kernel from ``file`` while a thread reads it once into ``buffer`` for the
    CRC. ``crc`` None: no CRC wanted (a learner at version 8 or later), the range is only sent
    by the kernel, never read here, and None returned. Without ``file`` the range is read and
    written."""
    if file is None:
        data = await asyncio.to_thread(data_file.handle.pread, size, offset)
        if len(data) != size:
            raise CorruptionError(
                "store file shorter than its header says",
                path=data_file.handle.path,
                offset=offset + len(data),
            )
        stream.send(fr.SnapshotChunk(shard, offset, data))
        await stream.drain()
        return None if crc is None else fmt.crc32c(data, crc)
    writer = stream.writer
    writer.write(chunk_prefix(shard, offset, size))
    loop = asyncio.get_running_loop()
    if crc is None:
        sent = await loop.sendfile(writer.transport, file, offset, size, fallback=True)
        _check_sent(sent, size, data_file, offset)
        return None
    crc_task = asyncio.ensure_future(
        asyncio.to_thread(range_crc, data_file, offset, size, buffer, crc)
    )
    try:
        sent = await loop.sendfile(writer.transport, file, offset, size, fallback=True)
    except BaseException:
        crc_task.cancel()
        with contextlib.suppress(BaseException):
            await crc_task
        raise
    if sent != size:
        crc_task.cancel()
    _check_sent(sent, size, data_file, offset)
    return await crc_task


def _check_sent(sent: int, size: int, data_file: DataFile, offset: int) -> None:
    if sent != size:
        raise CorruptionError(
            f"sent {sent} of {size} bytes: store file shorter than its header says",
            path=data_file.handle.path,
            offset=offset + sent,
        )
