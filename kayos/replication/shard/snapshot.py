"""Store snapshots: a learner that holds nothing copies its upstream's store file
(docs/replication-protocol.md, "Store snapshots"; docs/storage-format.md, "A prefix ending at a
header").

The upstream side (``serve_snapshot``) sends the bytes of its current data file up to the end of
its latest header, from 0 or from where a resuming learner verified up to (``filesend``: where to
start, and each chunk sent by the kernel). The learner side writes them with a ``SnapshotWriter``,
which checks them as they arrive with ``kayos check``'s checks (``StreamCheck``; the frames'
order with the pure ``SnapshotReceiver``), keeps the verified prefix durably across attempts, and
installs the file once all of it verified. The link that carries them is in
``kayos.replication.link.snapshot_link``.
"""

from __future__ import annotations

import asyncio
import json
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
from kayos.replication.shard import filesend
from kayos.replication.wire import frames as fr
from kayos.storage import engine
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import header_end, read_header_at
from kayos.storage.disk.fileops import OsFileOps
from kayos.storage.maintenance.streamcheck import StreamCheck

log = logging.getLogger("kayos.replication")

# Files beside a store that belong to the replica that wrote them: never copied, deleted before
# a copied store is installed (each is rebuilt from the file).
_LOCAL_BESIDE = ("derived", "time-index")


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
    replica: SnapshotSource,
    stream: filesend.ChunkStream,
    role: str,
    request: fr.SnapshotRequest | fr.SnapshotResume,
    learner_version: int,
) -> int:
    """Sends the store's bytes up to its latest header (from a ``SNAPSHOT_RESUME``'s offset when
    the file allows it: ``filesend.resume_offset``), then ``SNAPSHOT_END``; returns the bytes
    sent. Only a learner may ask; a replica catching up or repairing refuses (``unavailable``).
    ``prefix_crc`` is computed only for a learner whose ``HELLO`` named ``learner_version`` below
    8; a newer one is sent 0, "not computed" (its own checks cover every byte)."""
    if role != "learner":
        raise ProtocolError(f"only a learner may ask for a snapshot, not a {role}")
    if request.shard != replica.shard_id:
        raise ProtocolError(
            f"{type(request).__name__} for shard {request.shard} on a {replica.shard_id} link"
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
    file = None
    try:
        start = await asyncio.to_thread(filesend.resume_offset, data_file, header, end, request)
        file = filesend.open_for_sendfile(data_file)
        wants_crc = learner_version < fr.SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN
        buffer = bytearray(min(limits.snapshot_chunk_bytes_max, end - start) if wants_crc else 0)
        crc: int | None = 0 if wants_crc else None
        offset = start
        while offset < end:
            started = time.perf_counter()
            size = min(limits.snapshot_chunk_bytes_max, end - offset)
            crc = await filesend.send_chunk(
                stream, data_file, file, replica.shard_id, offset, size, buffer, crc
            )
            offset += size
            await stream.drain()
            await filesend.pause_pinging(stream, pacer.decide(time.perf_counter() - started, size))
        stream.send(
            fr.SnapshotEnd(replica.shard_id, end, crc or 0, data_file.generation, header.last_seq)
        )
        await stream.drain()
    finally:
        if file is not None:
            file.close()
        data_file.release()
        report = pacer.finish()
    log.info(
        "shard %s: sent a snapshot of %d bytes from offset %d through seq %s%s "
        "(paused %.1f s, end share %.3f, %.1f MB/s)",
        replica.shard_id,
        end - start,
        start,
        header.last_seq,
        "" if file is not None else " (read and written: no sendfile)",
        report.paused_s,
        report.share,
        report.mean_mb_per_s,
    )
    return end - start


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
    # False: the upstream sends prefix_crc = 0, "not computed" (version 8 or later), and the
    # bytes are covered by the stream check's chunk and region CRCs alone.
    checks_crc: bool = True

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
        if self.checks_crc:
            self.crc = fmt.crc32c(frame.data, self.crc)

    def end(self, frame: fr.SnapshotEnd) -> None:
        if frame.shard != self.shard:
            raise ProtocolError(f"SNAPSHOT_END for shard {frame.shard} on a {self.shard} link")
        if frame.total_bytes != self.received or (self.checks_crc and frame.prefix_crc != self.crc):
            raise ReplicationError(
                f"snapshot ends at {frame.total_bytes} bytes with CRC {frame.prefix_crc:#010x}; "
                f"received {self.received} bytes with CRC {self.crc:#010x}"
            )


class SnapshotWriter:
    """One learner's copy of a store file in ``data.copy.snapshot`` in ``directory``, over as many
    attempts as it takes (blocking calls: run them in a thread). Each attempt ``begin``s (the
    frame to ask with: from the verified offset of the attempts before, or from 0), ``write``s
    chunks (checked as they arrive by a ``StreamCheck``), and ends with ``install`` or ``keep``
    (the verified prefix made durable for the next attempt); ``discard`` removes it all."""

    def __init__(self, directory: str, shard: int) -> None:
        self.directory = directory
        self.shard = shard
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "data.copy" + engine.SNAPSHOT_SUFFIX)
        self.record_path = os.path.join(directory, "data.copy.verified" + engine.SNAPSHOT_SUFFIX)
        self.check = StreamCheck(self.path)
        self.receiver = SnapshotReceiver(shard)
        self.start = 0
        self._fd = -1
        self._first_chunk = True
        self._checks_crc = True
        self._unsynced = 0
        # The background fdatasync under way, if any, and the error of the last one that failed.
        self._syncing: threading.Thread | None = None
        self._sync_error: OSError | None = None
        self._load_record()

    def _load_record(self) -> None:
        """Takes up the verified prefix an earlier attempt (or process) recorded, if its header
        still checks out at the recorded offset; else the copy starts from 0."""
        try:
            with open(self.record_path) as file:
                record = json.load(file)
            offset, header_crc = int(record["offset"]), int(record["header_crc"])
            handle = OsFileOps().open(self.path)
        except (OSError, ValueError, KeyError, TypeError):
            return
        try:
            block = (offset - 1) // fmt.BLOCK * fmt.BLOCK
            if offset <= 0 or handle.size() < offset or header_end(handle, block) != offset:
                return
            header = read_header_at(handle, block)
            _, crc = fmt.parse_chunk_prefix(
                handle.pread(fmt.PREFIX_BYTES, block + 1), path=self.path, offset=block
            )
            if crc == header_crc:
                self.check.resume(offset, header, block, crc)
        except CorruptionError:
            return
        finally:
            handle.close()

    def begin(self, peer_version: int) -> fr.SnapshotRequest | fr.SnapshotResume:
        """Opens the file for an attempt, cut at the verified offset, and returns the frame that
        asks for the rest (``SNAPSHOT_RESUME`` only to a peer at version 8 or later)."""
        verified = self.check.verified
        header = self.check.header
        resume = (
            verified > 0
            and header is not None
            and peer_version >= fr.SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN
        )
        if resume and header is not None:
            check = self.check
            check.resume(verified, header, check.header_block, check.header_crc)
        else:
            self.check = StreamCheck(self.path)
            verified = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(self._fd, verified)
        self.start = verified
        self._checks_crc = peer_version < fr.SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN
        self.receiver = SnapshotReceiver(self.shard, verified, checks_crc=self._checks_crc)
        self._first_chunk = True
        if not resume or header is None:
            return fr.SnapshotRequest(self.shard)
        return fr.SnapshotResume(
            self.shard, verified, header.store_uuid, header.generation, self.check.header_crc
        )

    def write(self, frame: fr.SnapshotChunk) -> None:
        if self._first_chunk:
            self._first_chunk = False
            if frame.offset == 0 and self.start > 0:
                # The upstream could not continue from the verified offset: from 0 again.
                os.ftruncate(self._fd, 0)
                self.check = StreamCheck(self.path)
                self.receiver = SnapshotReceiver(self.shard, checks_crc=self._checks_crc)
                self.start = 0
        self.receiver.chunk(frame)
        view = memoryview(frame.data)
        offset = frame.offset
        while view:
            written = os.pwrite(self._fd, view, offset)
            view = view[written:]
            offset += written
        self.check.feed(frame.data)
        self._unsynced += len(frame.data)
        if self._unsynced >= limits.snapshot_sync_bytes and not self._sync_running():
            # Start the written pages towards the disk while the next ones come in; only the
            # sync at the end is waited for (it then has little left to write).
            self._unsynced = 0
            # Bytes below the verified offset are written: once synced, the offset is recorded,
            # so a learner killed mid-copy resumes from it too.
            mark = (self.check.verified, self.check.header_crc)
            self._syncing = threading.Thread(
                target=self._background_sync, args=mark, name="kayos-snapshot-sync", daemon=True
            )
            self._syncing.start()

    def _sync_running(self) -> bool:
        return self._syncing is not None and self._syncing.is_alive()

    def _background_sync(self, verified: int, header_crc: int) -> None:
        try:
            os.fdatasync(self._fd)
            if verified > 0:
                self._record(verified, header_crc)
        except OSError as exc:
            self._sync_error = exc

    def _record(self, verified: int, header_crc: int) -> None:
        """Records ``verified`` (its bytes already synced) for the next attempt or process:
        written to a temporary name, synced, renamed in."""
        temp = os.path.join(self.directory, "data.copy.verified-new" + engine.SNAPSHOT_SUFFIX)
        with open(temp, "w") as file:
            json.dump({"offset": verified, "header_crc": header_crc}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, self.record_path)
        OsFileOps().sync_dir(self.directory)

    def settle_sync(self) -> None:
        """Waits for the background sync (the descriptor is closed only after it)."""
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None

    def install(self, frame: fr.SnapshotEnd) -> None:
        """Checks the copy against ``SNAPSHOT_END`` and what the stream check verified, then
        renames it in as the store (its derived state and time index deleted: rebuilt from the
        file)."""
        self.receiver.end(frame)
        self.settle_sync()
        if self._sync_error is not None:
            raise self._sync_error
        os.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = -1
        header = self.check.header
        if self.check.verified != frame.total_bytes or header is None:
            raise CorruptionError(
                f"verified {self.check.verified} bytes of a copy of {frame.total_bytes}",
                path=self.path,
                offset=self.check.verified,
            )
        if header.last_seq != frame.last_seq:
            raise CorruptionError(
                f"the last header names seq {header.last_seq}, not {frame.last_seq}",
                path=self.path,
                offset=self.check.header_block,
            )
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
        _unlink_if_there(self.record_path)
        OsFileOps().sync_dir(self.directory)

    def keep(self) -> int:
        """After a failed attempt: the verified prefix made durable (the file synced and cut at
        the verified offset, synced again), then its offset recorded; returns that offset."""
        self.settle_sync()
        verified = self.check.verified
        header = self.check.header
        if self._fd >= 0:
            try:
                os.fdatasync(self._fd)
                os.ftruncate(self._fd, verified)
                os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1
        if verified == 0 or header is None:
            _unlink_if_there(self.record_path)
            return 0
        self._record(verified, self.check.header_crc)
        return verified

    def discard(self) -> None:
        self.settle_sync()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        _unlink_if_there(self.path)
        _unlink_if_there(self.record_path)


def _unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
