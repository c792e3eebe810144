"""Store snapshots: a learner that holds nothing copies its upstream's store file
(docs/replication-protocol.md, "Store snapshots"; docs/storage-format.md, "A prefix ending at a
header").

The upstream side (``serve_snapshot``) streams the bytes of its current data file up to the end of
its latest header; the learner side writes them with a ``SnapshotWriter`` (its decisions are pure:
``SnapshotReceiver`` checks each frame against what came before) and installs the file once it
verifies. The link that carries them is in ``kayos.replication.link.snapshot_link``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from kayos import limits
from kayos.clock import Clock
from kayos.errors import (
    CorruptionError,
    ProtocolError,
    ReplicationError,
    UnavailableError,
)
from kayos.replication.link.pacer import CopyPacer
from kayos.replication.logic import pacing
from kayos.replication.wire import frames as fr
from kayos.storage import engine
from kayos.storage.disk import format as fmt
from kayos.storage.disk.fileops import FileOps, OsFileOps

log = logging.getLogger("kayos.replication")

# Files beside a store that belong to the replica that wrote them: never copied, deleted before
# a copied store is installed (each is rebuilt from the file).
_LOCAL_BESIDE = ("derived", "time-index")


class SnapshotStream(Protocol):
    def send(self, frame: fr.Frame) -> int: ...

    async def drain(self) -> None: ...


class SnapshotSource(Protocol):
    """What of a ``ShardReplica`` serving a snapshot needs."""

    node_id: str
    store: engine.ShardStore
    catching_up: bool
    repairing: bool
    live_rate: pacing.LiveRate
    copies: dict[str, pacing.CopyReport]
    copy_rate_mb_per_s_max: float
    clock: Clock

    @property
    def shard_id(self) -> int: ...

    @property
    def starting_new_history(self) -> bool: ...


async def serve_snapshot(
    replica: SnapshotSource, stream: SnapshotStream, role: str, request: fr.SnapshotRequest
) -> int:
    """Sends the store's bytes up to its latest header, then ``SNAPSHOT_END``; returns the bytes
    sent. Only a learner may ask; a replica catching up or repairing refuses (``unavailable``)."""
    if role != "learner":
        raise ProtocolError(f"only a learner may ask for a snapshot, not a {role}")
    if request.shard != replica.shard_id:
        raise ProtocolError(
            f"SNAPSHOT_REQUEST for shard {request.shard} on a {replica.shard_id} link"
        )
    if replica.catching_up or replica.repairing or replica.starting_new_history:
        raise UnavailableError(
            f"{replica.node_id} is catching up on shard {replica.shard_id}; retry later"
        )
    data_file, header, end = replica.store.pin_prefix()
    pacer = CopyPacer(
        f"shard {replica.shard_id}: snapshot",
        replica.clock,
        replica.live_rate,
        limits.snapshot_produce_share_max,
        ceiling_mb_per_s=replica.copy_rate_mb_per_s_max,
        reports=replica.copies,
    )
    try:
        crc = 0
        offset = 0
        while offset < end:
            started = time.perf_counter()
            size = min(limits.snapshot_chunk_bytes_max, end - offset)
            data = await asyncio.to_thread(data_file.handle.pread, size, offset)
            if len(data) != size:
                raise CorruptionError(
                    "store file shorter than its header says",
                    path=data_file.handle.path,
                    offset=offset + len(data),
                )
            crc = fmt.crc32c(data, crc)
            stream.send(fr.SnapshotChunk(replica.shard_id, offset, data))
            offset += size
            await stream.drain()
            await pacer.after_piece(time.perf_counter() - started, size)
        stream.send(
            fr.SnapshotEnd(replica.shard_id, end, crc, data_file.generation, header.last_seq)
        )
        await stream.drain()
    finally:
        data_file.release()
        report = pacer.finish()
    log.info(
        "shard %s: sent a snapshot of %d bytes through seq %s (paused %.1f s, end share %.3f, "
        "%.1f MB/s)",
        replica.shard_id,
        end,
        header.last_seq,
        report.paused_s,
        report.share,
        report.mean_mb_per_s,
    )
    return end


# --- the learner's side -------------------------------------------------------------------------


def store_is_empty(directory: str) -> bool:
    """A shard directory with no store yet, or only an empty one (data files of at most one
    block): a learner copies such a shard by snapshot."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return True
    sizes = [
        os.path.getsize(os.path.join(directory, name))
        for name in names
        if engine.parse_generation(name) is not None
    ]
    return all(size <= fmt.BLOCK for size in sizes)


@dataclass(slots=True)
class SnapshotReceiver:
    """The learner's checks on the frames of one snapshot, pure: each chunk must follow the bytes
    before it, the total stay within ``snapshot_bytes_max``, and the end match what came."""

    shard: int
    received: int = 0
    crc: int = 0

    def chunk(self, frame: fr.SnapshotChunk) -> None:
        if frame.shard != self.shard:
            raise ProtocolError(f"SNAPSHOT_CHUNK for shard {frame.shard} on a {self.shard} link")
        if frame.offset != self.received:
            raise ProtocolError(
                f"SNAPSHOT_CHUNK at offset {frame.offset}; {self.received} bytes came before it"
            )
        if self.received + len(frame.data) > limits.snapshot_bytes_max:
            raise ProtocolError(f"a snapshot over snapshot_bytes_max={limits.snapshot_bytes_max}")
        self.received += len(frame.data)
        self.crc = fmt.crc32c(frame.data, self.crc)

    def end(self, frame: fr.SnapshotEnd) -> None:
        if frame.shard != self.shard:
            raise ProtocolError(f"SNAPSHOT_END for shard {frame.shard} on a {self.shard} link")
        if frame.total_bytes != self.received or frame.prefix_crc != self.crc:
            raise ReplicationError(
                f"snapshot ends at {frame.total_bytes} bytes with CRC {frame.prefix_crc:#010x}; "
                f"received {self.received} bytes with CRC {self.crc:#010x}"
            )


def check_prefix(path: str, total_bytes: int, last_seq: int, ops: FileOps | None = None) -> None:
    """Raises ``CorruptionError`` unless the file at ``path`` is a store whose last valid header
    (region CRC included) ends exactly at ``total_bytes`` and names ``last_seq``."""
    handle = (ops or OsFileOps()).open(path)
    try:
        if handle.size() != total_bytes:
            raise CorruptionError(
                f"copy holds {handle.size()} bytes, not {total_bytes}", path=path, offset=0
            )
        block, header = engine.find_last_header(handle)
        end = engine.header_end(handle, block)
        if end != total_bytes:
            raise CorruptionError(
                f"the last valid header ends at {end}, not at the copy's end {total_bytes}",
                path=path,
                offset=block,
            )
        if header.last_seq != last_seq:
            raise CorruptionError(
                f"the last header names seq {header.last_seq}, not {last_seq}",
                path=path,
                offset=block,
            )
    finally:
        handle.close()


class SnapshotWriter:
    """Writes one snapshot to ``data.<gen>.kys.snapshot`` in ``directory`` (blocking calls: run
    them in a thread) and installs it as the store, or removes it."""

    def __init__(self, directory: str, shard: int) -> None:
        self.directory = directory
        self.receiver = SnapshotReceiver(shard)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "data.copy" + engine.SNAPSHOT_SUFFIX)
        self._unsynced = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        # The background fdatasync under way, if any, and the error of the last one that failed.
        self._syncing: threading.Thread | None = None
        self._sync_error: OSError | None = None

    def write(self, frame: fr.SnapshotChunk) -> None:
        self.receiver.chunk(frame)
        view = memoryview(frame.data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._unsynced += len(frame.data)
        if self._unsynced >= limits.snapshot_sync_bytes and not self._sync_running():
            # Start the written pages towards the disk while the next ones come in; only the
            # sync at the end is waited for (it then has little left to write).
            self._unsynced = 0
            self._syncing = threading.Thread(
                target=self._background_sync, name="kayos-snapshot-sync", daemon=True
            )
            self._syncing.start()

    def _sync_running(self) -> bool:
        return self._syncing is not None and self._syncing.is_alive()

    def _background_sync(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            self._sync_error = exc

    def _settle_sync(self) -> None:
        """Waits for the background sync (the descriptor is closed only after it)."""
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None

    def install(self, frame: fr.SnapshotEnd) -> None:
        """Checks the copy against ``SNAPSHOT_END`` and the file's own header, then renames it in
        as the store (its derived state and time index deleted: rebuilt from the file)."""
        self.receiver.end(frame)
        self._settle_sync()
        if self._sync_error is not None:
            raise self._sync_error
        os.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = -1
        check_prefix(self.path, frame.total_bytes, frame.last_seq)
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if engine.parse_generation(name) is not None:
                os.unlink(path)
            elif name in _LOCAL_BESIDE:
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        final = os.path.join(self.directory, engine.data_file_name(frame.generation))
        os.rename(self.path, final)
        OsFileOps().sync_dir(self.directory)

    def discard(self) -> None:
        self._settle_sync()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
