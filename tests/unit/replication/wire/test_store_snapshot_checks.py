"""Store snapshots, the deterministic parts (docs/replication-protocol.md, "Store snapshots";
docs/storage-format.md, "A prefix ending at a header"): the frames' golden bytes, the learner's
checks on what it receives, and that a prefix of a store file ending at a header is a store while
a torn or altered copy is refused."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import CorruptionError, InvalidRequest, ProtocolError, ReplicationError
from kayos.replication.link.snapshot_link import SnapshotProgress, read_chunk, receive_snapshot
from kayos.replication.link.stream import FrameStream
from kayos.replication.shard import filesend
from kayos.replication.shard.snapshot import (
    SnapshotReceiver,
    SnapshotWriter,
    store_is_empty,
)
from kayos.replication.wire import frames as fr
from kayos.storage.engine import Delete, Put, ShardStore, data_file_name
from kayos.storage.maintenance.check import check_store
from kayos.storage.maintenance.compact import compact
from kayos.storage.maintenance.streamcheck import StreamCheck

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
    writer.begin(fr.PROTOCOL_VERSION)
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


def test_an_altered_copy_is_refused_and_removed(tmp_path: Path) -> None:
    source = _filled_store(tmp_path / "source", 20)
    data_file, _, end = source.pin_prefix()
    data = data_file.handle.pread(end, 0)
    data_file.release()
    # A flipped byte in transit: the check as it arrives finds it before the copy's end, and
    # what is kept for the next attempt ends below it.
    target = tmp_path / "target"
    writer = SnapshotWriter(str(target), 0)
    writer.begin(fr.PROTOCOL_VERSION)
    altered = bytearray(data)
    altered[end // 2] ^= 0x40
    writer.write(fr.SnapshotChunk(0, 0, bytes(altered)[: end // 2 + 1]))
    with pytest.raises(CorruptionError):
        writer.write(fr.SnapshotChunk(0, end // 2 + 1, bytes(altered)[end // 2 + 1 :]))
    kept = writer.keep()
    assert 0 < kept <= end // 2
    assert os.path.getsize(writer.path) == kept
    assert data[:kept] == (target / "data.copy.snapshot").read_bytes()
    writer.discard()
    assert os.listdir(target) == []
    source.close()


def test_a_left_over_copy_is_deleted_when_the_store_opens(tmp_path: Path) -> None:
    writer = SnapshotWriter(str(tmp_path), 0)
    writer.begin(fr.PROTOCOL_VERSION)
    writer.write(fr.SnapshotChunk(0, 0, b"\x00partial"))
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
        writer.begin(fr.PROTOCOL_VERSION)
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


def test_a_chunk_sent_with_sendfile_is_the_codecs_frame_with_bin32_data() -> None:
    """The prefix the serving side writes by hand before the kernel sends the data
    (docs/replication-protocol.md, "Store snapshots", its bin32 golden bytes)."""
    data = b"\x01\x02\x03"
    sent = filesend.chunk_prefix(0, 4096, len(data)) + data
    assert sent == bytes.fromhex("0000000e 17 9300cd1000 c600000003 010203")
    assert fr.FrameDecoder().feed(sent) == [fr.SnapshotChunk(0, 4096, data)]
    big = b"x" * 70000
    assert fr.FrameDecoder().feed(filesend.chunk_prefix(7, 2**40, len(big)) + big) == [
        fr.SnapshotChunk(7, 2**40, big)
    ]


def _write_all(writer: SnapshotWriter, data: bytes, start: int, size: int = 5000) -> None:
    for offset in range(start, len(data), size):
        writer.write(fr.SnapshotChunk(0, offset, data[offset : offset + size]))


def test_a_broken_copy_resumes_from_its_verified_offset(tmp_path: Path) -> None:
    """A kept prefix survives the writer (a new process reads its record), the upstream agrees to
    continue from it, and the copy completes from there to a store kayos check accepts."""
    source = _filled_store(tmp_path / "source", 40)
    data_file, header, end = source.pin_prefix()
    try:
        data = data_file.handle.pread(end, 0)
        target = tmp_path / "target"
        first = SnapshotWriter(str(target), 0)
        assert isinstance(first.begin(fr.PROTOCOL_VERSION), fr.SnapshotRequest)
        _write_all(first, data[: end // 2], 0)
        kept = first.keep()
        assert 0 < kept <= end // 2
        second = SnapshotWriter(str(target), 0)
        request = second.begin(fr.PROTOCOL_VERSION)
        assert isinstance(request, fr.SnapshotResume)
        assert (request.offset, request.generation) == (kept, data_file.generation)
        assert filesend.resume_offset(data_file, header, end, request) == kept
        _write_all(second, data, kept)
        sent = SnapshotReceiver(0, received=kept)
        sent.chunk(fr.SnapshotChunk(0, kept, data[kept:]))
        second.install(fr.SnapshotEnd(0, end, sent.crc, data_file.generation, header.last_seq))
        assert check_store(str(target)).ok
        assert sorted(os.listdir(target)) == [data_file_name(data_file.generation)]
    finally:
        data_file.release()
        source.close()


def test_an_upstream_continues_only_the_same_history_and_generation(tmp_path: Path) -> None:
    source = _filled_store(tmp_path / "source", 20)
    data_file, header, end = source.pin_prefix()
    try:
        check = StreamCheck()
        check.feed(data_file.handle.pread(end // 2, 0))
        assert check.header is not None
        good = fr.SnapshotResume(
            0, check.verified, check.header.store_uuid, data_file.generation, check.header_crc
        )
        assert filesend.resume_offset(data_file, header, end, good) == check.verified
        for wrong in (
            dataclasses.replace(good, store_uuid=bytes(16)),
            dataclasses.replace(good, generation=good.generation + 1),
            dataclasses.replace(good, header_crc=good.header_crc ^ 1),
            dataclasses.replace(good, offset=good.offset - 1),
            dataclasses.replace(good, offset=end + 4096),
        ):
            assert filesend.resume_offset(data_file, header, end, wrong) == 0
        assert filesend.resume_offset(data_file, header, end, fr.SnapshotRequest(0)) == 0
    finally:
        data_file.release()
        source.close()


def test_a_learner_whose_upstream_starts_again_from_0_empties_its_copy(tmp_path: Path) -> None:
    source = _filled_store(tmp_path / "source", 20)
    data_file, header, end = source.pin_prefix()
    data = data_file.handle.pread(end, 0)
    data_file.release()
    source.close()
    target = tmp_path / "target"
    first = SnapshotWriter(str(target), 0)
    first.begin(fr.PROTOCOL_VERSION)
    _write_all(first, data[: end // 2], 0)
    assert first.keep() > 0
    second = SnapshotWriter(str(target), 0)
    assert isinstance(second.begin(fr.PROTOCOL_VERSION), fr.SnapshotResume)
    _write_all(second, data, 0)  # the upstream's answer: from 0
    sent = SnapshotReceiver(0)
    sent.chunk(fr.SnapshotChunk(0, 0, data))
    second.install(fr.SnapshotEnd(0, end, sent.crc, 1, header.last_seq))
    assert check_store(str(target)).ok
    # A version 7 upstream is asked from 0 even with a kept prefix.
    third = SnapshotWriter(str(tmp_path / "old"), 0)
    third.begin(fr.PROTOCOL_VERSION)
    _write_all(third, data[: end // 2], 0)
    third.keep()
    assert isinstance(
        SnapshotWriter(str(tmp_path / "old"), 0).begin(fr.SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN - 1),
        fr.SnapshotRequest,
    )


def test_the_same_writer_resumes_after_bytes_past_its_verified_offset(tmp_path: Path) -> None:
    """A failed attempt fed bytes past the last header it verified (even damaged ones): the next
    attempt of the same writer forgets them and goes on from the verified offset."""
    source = _filled_store(tmp_path / "source", 40)
    data_file, header, end = source.pin_prefix()
    data = data_file.handle.pread(end, 0)
    data_file.release()
    source.close()
    writer = SnapshotWriter(str(tmp_path / "target"), 0)
    writer.begin(fr.PROTOCOL_VERSION)
    damaged = bytearray(data[: end // 2])
    damaged[-10] ^= 0xFF
    damaged += data[end // 2 : end // 2 + 8192]
    with pytest.raises(CorruptionError):
        _write_all(writer, bytes(damaged), 0)
    kept = writer.keep()
    request = writer.begin(fr.PROTOCOL_VERSION)
    assert isinstance(request, fr.SnapshotResume)
    assert request.offset == kept
    _write_all(writer, data, kept)
    sent = SnapshotReceiver(0, received=kept)
    sent.chunk(fr.SnapshotChunk(0, kept, data[kept:]))
    writer.install(fr.SnapshotEnd(0, end, sent.crc, 1, header.last_seq))
    assert check_store(str(tmp_path / "target")).ok


def test_a_learner_killed_mid_copy_resumes_from_the_offset_its_last_sync_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No failed attempt ran ``keep`` (the process died): each background sync recorded the
    verified offset it made durable, and the next process resumes from there."""
    monkeypatch.setattr(limits, "snapshot_sync_bytes", 1)
    source = _filled_store(tmp_path / "source", 40)
    data_file, _, end = source.pin_prefix()
    data = data_file.handle.pread(end, 0)
    data_file.release()
    source.close()
    target = tmp_path / "target"
    dying = SnapshotWriter(str(target), 0)
    dying.begin(fr.PROTOCOL_VERSION)
    _write_all(dying, data[: end // 2], 0)
    dying.settle_sync()  # the last sync done; then the process dies without keep()
    request = SnapshotWriter(str(target), 0).begin(fr.PROTOCOL_VERSION)
    assert isinstance(request, fr.SnapshotResume)
    assert 0 < request.offset <= end // 2


def _read_chunks(data: bytes) -> tuple[list[fr.SnapshotChunk], fr.Frame | None]:
    """``read_chunk`` over ``data`` (then the end of the stream): the pieces it handed on and the
    frame it returned."""

    async def run() -> tuple[list[fr.SnapshotChunk], fr.Frame | None]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        pieces: list[fr.SnapshotChunk] = []

        async def take(piece: fr.SnapshotChunk) -> None:
            pieces.append(piece)

        frame = await read_chunk(reader, take, 5.0)
        return pieces, frame

    return asyncio.run(run())


def test_a_chunk_is_read_in_pieces_whatever_its_bin_header() -> None:
    data = bytes(range(256)) * 40
    for encoded in (
        fr.encode(fr.SnapshotChunk(3, 2**33, data)),  # the codec's bin16
        filesend.chunk_prefix(3, 2**33, len(data)) + data,  # the sender's bin32
    ):
        pieces, frame = _read_chunks(encoded)
        assert frame is None
        assert b"".join(piece.data for piece in pieces) == data
        starts = [2**33 + sum(len(p.data) for p in pieces[:i]) for i in range(len(pieces))]
        assert [piece.offset for piece in pieces] == starts
        assert all(piece.shard == 3 for piece in pieces)
    end = fr.SnapshotEnd(3, 10, 7, 1, 2)
    assert _read_chunks(fr.encode(end)) == ([], end)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("0000000e 17 92 00 cd1000 c600000003 010203", "array of 3"),
        ("0000000e 17 93 a1 cd1000 c600000003 010203", "shard has msgpack type"),
        ("0000000e 17 93 00 cd1000 c600000004 010203", "holds a shard"),
        ("0000000e 17 93 00 cd1000 d900000003 010203", "data has msgpack type"),
        ("7fffffff 17 93 00", "frame length"),
    ],
)
def test_a_malformed_chunk_is_a_protocol_error(raw: str, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        _read_chunks(bytes.fromhex(raw))


def test_a_stream_ending_inside_a_chunk_is_an_eof() -> None:
    encoded = filesend.chunk_prefix(0, 0, 100) + b"x" * 50
    with pytest.raises(EOFError):
        _read_chunks(encoded)
