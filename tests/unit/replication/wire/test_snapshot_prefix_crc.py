"""``SNAPSHOT_END.prefix_crc`` by protocol version (docs/replication-protocol.md, "Store
snapshots"): an acceptor computes it only for a learner older than version 8 and otherwise sends
0, "not computed", without reading the bytes it sends; a learner checks it only from an upstream
older than version 8."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import ReplicationError
from kayos.replication.shard import filesend
from kayos.replication.shard.snapshot import SnapshotReceiver, SnapshotWriter
from kayos.replication.wire import frames as fr
from kayos.storage.disk import format as fmt
from kayos.storage.engine import Put, ShardStore

pytestmark = pytest.mark.unit

OLD = fr.SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN - 1
NEW = fr.SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN


def _store(path: Path) -> ShardStore:
    store = ShardStore.open(str(path), clock=ManualClock())
    for n in range(20):
        store.commit([Put(b"k%04d" % (n * 10 + i), b"v" * 300) for i in range(10)])
    return store


class _Stream:
    """A ``ChunkStream`` over one end of a socket pair."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    def send(self, frame: fr.Frame) -> int:
        data = fr.encode(frame)
        self.writer.write(data)
        return len(data)

    def ping(self) -> int:
        return self.send(fr.Ping(1))

    async def drain(self) -> None:
        await self.writer.drain()


async def _send_range(store: ShardStore, crc: int | None) -> tuple[int | None, bytes, bytes, int]:
    """``send_chunk`` of the pinned prefix from the kernel: what it returned, what came out of
    the socket, the file's bytes, and the bytes it read into its buffer."""
    data_file, _, end = store.pin_prefix()
    ours, theirs = socket.socketpair()
    try:
        reader, peer_writer = await asyncio.open_connection(sock=theirs)
        own_reader, writer = await asyncio.open_connection(sock=ours)
        file = filesend.open_for_sendfile(data_file)
        assert file is not None
        buffer = bytearray(end)
        try:
            sending = filesend.send_chunk(_Stream(writer), data_file, file, 0, 0, end, buffer, crc)
            got, received = await asyncio.gather(
                sending, reader.readexactly(len(filesend.chunk_prefix(0, 0, end)) + end)
            )
        finally:
            file.close()
        writer.close()
        peer_writer.close()
        del own_reader
        expected = data_file.handle.pread(end, 0)
        return got, received, expected, len(buffer) - buffer.count(0)
    finally:
        data_file.release()


def test_a_chunk_for_a_new_learner_is_sent_unread_and_for_an_old_one_with_its_crc(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path / "source")
    try:
        got, received, expected, read = asyncio.run(_send_range(store, None))
        assert got is None
        assert read == 0
        assert received.endswith(expected)
        assert fr.FrameDecoder().feed(received) == [fr.SnapshotChunk(0, 0, expected)]
        got, received, expected, read = asyncio.run(_send_range(store, 5))
        assert got == fmt.crc32c(expected, 5)
        assert read > 0
        assert received.endswith(expected)
    finally:
        store.close()


def test_a_learner_checks_prefix_crc_only_from_an_upstream_older_than_version_8() -> None:
    old = SnapshotReceiver(0)
    new = SnapshotReceiver(0, checks_crc=False)
    for receiver in (old, new):
        receiver.chunk(fr.SnapshotChunk(0, 0, b"abcd"))
    assert new.crc == 0
    new.end(fr.SnapshotEnd(0, 4, 0, 1, 1))
    with pytest.raises(ReplicationError, match="CRC"):
        old.end(fr.SnapshotEnd(0, 4, 0, 1, 1))
    old.end(fr.SnapshotEnd(0, 4, fmt.crc32c(b"abcd"), 1, 1))
    with pytest.raises(ReplicationError, match="received 4 bytes"):
        new.end(fr.SnapshotEnd(0, 5, 0, 1, 1))


@pytest.mark.parametrize(
    ("version", "checks"), [(OLD, True), (NEW, False), (fr.PROTOCOL_VERSION, False)]
)
def test_a_writer_checks_prefix_crc_by_its_upstreams_version(
    tmp_path: Path, version: int, checks: bool
) -> None:
    writer = SnapshotWriter(str(tmp_path / "copy"), 0)
    writer.begin(version)
    try:
        assert writer.receiver.checks_crc is checks
    finally:
        writer.discard()


class _Pinged:
    """A ``ChunkStream`` that counts the pings sent on it."""

    writer: asyncio.StreamWriter

    def __init__(self) -> None:
        self.pings = 0

    def send(self, frame: fr.Frame) -> int:
        raise AssertionError(f"only pings are sent in a pause, not {frame}")

    def ping(self) -> int:
        self.pings += 1
        return self.pings

    async def drain(self) -> None:
        return None


@pytest.mark.parametrize(("pause_s", "pings"), [(0.0, 0), (0.005, 1), (0.025, 3)])
def test_a_pause_between_chunks_pings_the_learner_every_ping_interval(
    monkeypatch: pytest.MonkeyPatch, pause_s: float, pings: int
) -> None:
    """The link's pinger stops once a write is refused during a sendfile, and a learner gives an
    attempt up after peer_silence_ms_max without a byte: a pacer's pause is slept in steps of a
    ping interval, each after a PING."""
    monkeypatch.setattr(limits, "ping_interval_ms", 10)
    stream = _Pinged()
    asyncio.run(filesend.pause_pinging(stream, pause_s))
    assert stream.pings == pings
