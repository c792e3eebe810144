"""Store snapshots, the deterministic parts (docs/replication-protocol.md, "Store snapshots";
docs/storage-format.md, "A prefix ending at a header"): the frames' golden bytes, the learner's
checks on what it receives, and that a prefix of a store file ending at a header is a store while
a torn or altered copy is refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import CorruptionError, InvalidRequest, ProtocolError, ReplicationError
from kayos.replication.link.snapshot_link import SnapshotProgress, receive_snapshot
from kayos.replication.link.stream import FrameStream
from kayos.replication.shard.snapshot import (
    SnapshotReceiver,
    SnapshotWriter,
    check_prefix,
    store_is_empty,
)
from kayos.replication.wire import frames as fr
from kayos.storage.engine import Delete, Put, ShardStore, data_file_name
from kayos.storage.maintenance.check import check_store
from kayos.storage.maintenance.compact import compact

pytestmark = pytest.mark.unit


def test_snapshot_frames_golden_bytes() -> None:
    request = bytes.fromhex("00000003 16 9100")
    chunk = bytes.fromhex("0000000b 17 9300cd1000c403010203")
    end = bytes.fromhex("0000000f 18 9500cd2000ce1234abcd01cd03e8")
    frames = [
        fr.SnapshotRequest(0),
        fr.SnapshotChunk(0, 4096, b"\x01\x02\x03"),
        fr.SnapshotEnd(0, 8192, 0x1234ABCD, 1, 1000),
    ]
    assert [fr.encode(frame) for frame in frames] == [request, chunk, end]
    assert fr.FrameDecoder().feed(request + chunk + end) == frames


def test_snapshot_chunk_data_is_bounded() -> None:
    with pytest.raises(InvalidRequest):
        fr.SnapshotChunk(0, 0, b"")
    with pytest.raises(InvalidRequest):
        fr.SnapshotChunk(0, 0, b"x" * (limits.snapshot_chunk_bytes_max + 1))
    with pytest.raises(InvalidRequest):
        fr.SnapshotEnd(0, 1, 2**32, 1, 1)  # the CRC is a u32


def test_receiver_refuses_gaps_other_shards_and_a_wrong_end() -> None:
    receiver = SnapshotReceiver(3)
    receiver.chunk(fr.SnapshotChunk(3, 0, b"abc"))
    with pytest.raises(ProtocolError, match="offset 10"):
        receiver.chunk(fr.SnapshotChunk(3, 10, b"d"))
    with pytest.raises(ProtocolError, match="shard 4"):
        receiver.chunk(fr.SnapshotChunk(4, 3, b"d"))
    receiver.chunk(fr.SnapshotChunk(3, 3, b"d"))
    with pytest.raises(ReplicationError, match="received 4 bytes"):
        receiver.end(fr.SnapshotEnd(3, 5, receiver.crc, 1, 1))
    with pytest.raises(ReplicationError):
        receiver.end(fr.SnapshotEnd(3, 4, receiver.crc ^ 1, 1, 1))
    receiver.end(fr.SnapshotEnd(3, 4, receiver.crc, 1, 1))


def _filled_store(path: Path, commits: int) -> ShardStore:
    store = ShardStore.open(str(path), clock=ManualClock())
    for n in range(commits):
        ops: list[Put | Delete] = [Put(b"k%04d" % (n * 10 + i), b"v" * 300) for i in range(10)]
        if n % 3 == 2:
            ops.append(Delete(b"k%04d" % (n * 10 - 5)))
        store.commit(ops, meta={"takeover": b"t%d" % n})
    return store


def _copy(store: ShardStore, target: Path, *, chunk: int = 5000) -> fr.SnapshotEnd:
    """What ``serve_snapshot`` sends, written by the learner's writer (installed on success)."""
    data_file, header, end = store.pin_prefix()
    writer = SnapshotWriter(str(target), 0)
    try:
        for offset in range(0, end, chunk):
            data = data_file.handle.pread(min(chunk, end - offset), offset)
            writer.write(fr.SnapshotChunk(0, offset, data))
        finish = fr.SnapshotEnd(0, end, writer.receiver.crc, data_file.generation, header.last_seq)
        writer.install(finish)
    except BaseException:
        writer.discard()
        raise
    finally:
        data_file.release()
    return finish


@pytest.mark.parametrize("sync_bytes", [1, limits.snapshot_sync_bytes])
def test_a_copied_prefix_is_the_same_store(
    tmp_path: Path, sync_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether background syncs start on every chunk (each while the last may still run) or not
    at all before the end, the installed copy is the upstream's store."""
    monkeypatch.setattr(limits, "snapshot_sync_bytes", sync_bytes)
    source = _filled_store(tmp_path / "source", 40)
    target = tmp_path / "target"
    (target / "derived").mkdir(parents=True)
    (target / "time-index").write_bytes(b"node-local")
    assert store_is_empty(str(target))
    finish = _copy(source, target)
    assert sorted(os.listdir(target)) == [data_file_name(finish.generation)]
    assert not store_is_empty(str(target))
    assert check_store(str(target)).ok
    copy = ShardStore.open(str(target), clock=ManualClock())
    try:
        assert copy.last_seq == source.last_seq == finish.last_seq
        assert copy.meta == source.meta
        assert copy.scan() == source.scan()
        assert copy.recovery.dropped_bytes == 0
    finally:
        copy.close()
        source.close()


def test_a_pinned_prefix_survives_a_compaction_and_later_commits(tmp_path: Path) -> None:
    source = _filled_store(tmp_path / "source", 30)
    data_file, header, end = source.pin_prefix()
    try:
        compact(source)  # swaps files: the pinned handle keeps reading the old one
        source.commit([Put(b"after", b"x")])
        data = data_file.handle.pread(end, 0)
    finally:
        data_file.release()
    assert len(data) == end
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    (copy_dir / data_file_name(data_file.generation)).write_bytes(data)
    copy = ShardStore.open(str(copy_dir), clock=ManualClock())
    try:
        assert copy.last_seq == header.last_seq == source.last_seq - 1
    finally:
        copy.close()
        source.close()


def test_a_torn_or_altered_copy_is_refused_and_removed(tmp_path: Path) -> None:
    source = _filled_store(tmp_path / "source", 20)
    data_file, header, end = source.pin_prefix()
    data = data_file.handle.pread(end, 0)
    data_file.release()
    path = tmp_path / "copy"
    path.write_bytes(data[: end - 100])  # torn inside the last header
    with pytest.raises(CorruptionError):
        check_prefix(str(path), end, header.last_seq)
    path.write_bytes(data[: end - 100] + bytes(100))  # the right length, a broken last header
    with pytest.raises(CorruptionError, match="ends at"):
        check_prefix(str(path), end, header.last_seq)
    path.write_bytes(data)
    with pytest.raises(CorruptionError, match="names seq"):
        check_prefix(str(path), end, header.last_seq + 1)
    check_prefix(str(path), end, header.last_seq)

    # A flipped byte in transit: the end-to-end CRC differs, nothing is installed.
    target = tmp_path / "target"
    writer = SnapshotWriter(str(target), 0)
    altered = bytearray(data)
    altered[end // 2] ^= 0x40
    writer.write(fr.SnapshotChunk(0, 0, bytes(altered)[: end // 2 + 1]))
    writer.write(fr.SnapshotChunk(0, end // 2 + 1, bytes(altered)[end // 2 + 1 :]))
    crc_of_original = SnapshotReceiver(0)
    crc_of_original.chunk(fr.SnapshotChunk(0, 0, data))
    with pytest.raises(ReplicationError):
        writer.install(
            fr.SnapshotEnd(0, end, crc_of_original.crc, data_file.generation, header.last_seq)
        )
    writer.discard()
    assert os.listdir(target) == []
    source.close()


def test_a_left_over_copy_is_deleted_when_the_store_opens(tmp_path: Path) -> None:
    writer = SnapshotWriter(str(tmp_path), 0)
    writer.write(fr.SnapshotChunk(0, 0, b"partial"))
    assert os.path.exists(writer.path)  # a learner killed here leaves this file
    store = ShardStore.open(str(tmp_path), clock=ManualClock())
    store.close()
    assert not os.path.exists(writer.path)


class _NoWriter:
    """The sending half of a stream no test frame answers to."""

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def _receive_from(frames: list[fr.Frame], directory: Path) -> SnapshotProgress:
    """Runs the learner's receive loop over ``frames`` (as bytes on a stream that then ends)."""

    async def run() -> SnapshotProgress:
        reader = asyncio.StreamReader()
        reader.feed_data(b"".join(fr.encode(frame) for frame in frames))
        reader.feed_eof()
        stream = FrameStream(reader, _NoWriter(), ManualClock())  # type: ignore[arg-type]
        writer = SnapshotWriter(str(directory), 0)
        progress = SnapshotProgress("c")
        try:
            await receive_snapshot(stream, writer, "c", progress)
        except BaseException:
            writer.discard()
            raise
        return progress

    return asyncio.run(run())


def _chunks_of(data: bytes, size: int) -> list[fr.Frame]:
    return [fr.SnapshotChunk(0, at, data[at : at + size]) for at in range(0, len(data), size)]


def test_receive_overlaps_writing_and_installs_at_the_end(tmp_path: Path) -> None:
    source = _filled_store(tmp_path / "source", 30)
    data_file, header, end = source.pin_prefix()
    data = data_file.handle.pread(end, 0)
    data_file.release()
    source.close()
    receiver = SnapshotReceiver(0)
    receiver.chunk(fr.SnapshotChunk(0, 0, data))
    finish = fr.SnapshotEnd(0, end, receiver.crc, 1, header.last_seq)
    chunks = _chunks_of(data, 3000)
    assert len(chunks) > limits.snapshot_chunks_queued_max  # the queue fills and drains
    progress = _receive_from([*chunks, fr.Ping(7), finish], tmp_path / "copy")
    assert (progress.received_bytes, progress.total_bytes) == (end, end)
    assert progress.last_seq == header.last_seq
    assert os.listdir(tmp_path / "copy") == [data_file_name(1)]


def test_receive_stops_at_a_gap_or_an_early_end_and_leaves_nothing(tmp_path: Path) -> None:
    data = bytes(range(256)) * 64
    chunks = _chunks_of(data, 1000)
    with pytest.raises(ProtocolError, match="offset"):
        _receive_from([*chunks[:3], *chunks[4:]], tmp_path / "gap")
    assert os.listdir(tmp_path / "gap") == []
    with pytest.raises(EOFError):
        _receive_from(chunks[:5], tmp_path / "cut")  # the upstream died mid-copy
    assert os.listdir(tmp_path / "cut") == []
