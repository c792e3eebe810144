"""Forward, then persist (docs/replication-protocol.md, "Applying batches"): chain members forward
a batch before their own commit of it is durable, so a downstream may hold seqs its upstream
loses. Each rule that keeps such seqs harmless is pinned here with in-process nodes on loopback.
Every wait is a bounded poll of a condition; the seed is printed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.errors import ProtocolError, StorageError
from kayos.replication import frames as fr
from kayos.replication.replica import ShardReplica
from kayos.storage import ShardStore
from tests.unit.test_replica_review import SEED, WAIT_S, _chain, _stored_keys, _until

# A batch this big commits in a worker thread, so holding its commit blocks no event loop.
THREADED = limits.inline_commit_entries_max + 4


def _hold_before_commit(
    monkeypatch: pytest.MonkeyPatch, replica: ShardReplica, entries: int
) -> tuple[threading.Event, threading.Event]:
    """Holds ``replica``'s store commits of ``entries`` entries before they write anything, until
    ``release`` is set; ``entered`` tells that one is held."""
    entered = threading.Event()
    release = threading.Event()
    real_commit = ShardStore.commit_columns

    def commit_columns(store: ShardStore, *args: Any, **kwargs: Any) -> Any:
        if store is replica.store and len(args[0]) == entries:
            entered.set()
            assert release.wait(WAIT_S)
        return real_commit(store, *args, **kwargs)

    monkeypatch.setattr(ShardStore, "commit_columns", commit_columns)
    return entered, release


def _keys(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


@pytest.mark.asyncio
async def test_a_tail_shows_nothing_past_the_commit_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's fsync is slow: middle and tail hold the batch durably before the head does.
    It is not committed, so a consumer on the tail must not see it until the head's commit lands."""
    print("seed", SEED)
    async with _chain(tmp_path) as (_, nodes):
        head, tail = nodes["a"].replicas[0], nodes["c"].replicas[0]
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        entered, release = _hold_before_commit(monkeypatch, head, THREADED)
        keys = _keys("held", THREADED)
        write = asyncio.create_task(
            nodes["a"].produce(queue, keys, [b"v"] * THREADED, None, None, acks=-1)
        )
        try:
            await _until(entered.is_set, "the head's commit held")
            await _until(lambda: tail.durable > head.durable, "the tail ahead of the head")
            page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=100, wait_ms=0)
            assert page.keys == [b"before"], "a consumer saw seqs only some members hold"
            assert page.boundary <= head.durable
            assert tail.commit_point <= head.durable
        finally:
            release.set()
        _, last = await asyncio.wait_for(write, WAIT_S)
        await _until(lambda: tail.commit_point >= last, "the commit point at the batch")
        page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=100, wait_ms=0)
        assert page.keys == [b"before", *keys]


@pytest.mark.asyncio
async def test_a_failed_head_commit_is_dropped_everywhere_and_writes_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's store refuses a commit after the batch went down the chain, where the middle
    and tail persist it. The producer gets the error; no consumer ever sees the batch; the head
    starts a new history and every replica rolls the lost batch back; writes go on."""
    print("seed", SEED)
    async with _chain(tmp_path) as (_, nodes):
        head, middle, tail = (nodes[n].replicas[0] for n in "abc")
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        real_commit = ShardStore.commit_columns
        downstream_has_it = threading.Event()

        def commit_columns(store: ShardStore, *args: Any, **kwargs: Any) -> Any:
            if store is head.store and len(args[0]) == THREADED:
                # Fail only once the others hold the batch: the case this rule is for.
                assert downstream_has_it.wait(WAIT_S)
                raise StorageError("simulated: the head's disk failed this commit")
            return real_commit(store, *args, **kwargs)

        monkeypatch.setattr(ShardStore, "commit_columns", commit_columns)
        doomed = _keys("doomed", THREADED)
        write = asyncio.create_task(
            nodes["a"].produce(queue, doomed, [b"v"] * THREADED, None, None, acks=-1)
        )
        await _until(lambda: tail.durable >= 1 + THREADED, "the tail holding the doomed batch")
        page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=100, wait_ms=0)
        assert page.keys == [b"before"]
        downstream_has_it.set()
        with pytest.raises(StorageError):
            await asyncio.wait_for(write, WAIT_S)
        monkeypatch.setattr(ShardStore, "commit_columns", real_commit)
        # Writes are refused until the new takeover entry is down, then accepted again.
        _, last = await _until_written(nodes["a"], queue)
        await _until(lambda: tail.commit_point >= last, "the tail committed past the new write")
        for replica in (middle, tail):
            assert _stored_keys(replica) == _stored_keys(head), f"{replica.node_id} diverged"
        assert not any(key.startswith(b"q\x00doomed") for key in _stored_keys(tail))
        page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=100, wait_ms=0)
        assert page.keys == [b"before", b"after"]
        assert len(head.takeover_table()) == 2, "a new history starts after the failure"


async def _until_written(node: Any, queue: str) -> tuple[int, int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        try:
            result: tuple[int, int] = await node.produce(
                queue, [b"after"], [b"v"], None, None, acks=-1
            )
            return result
        except StorageError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.01)  # a bounded poll: the head is starting its new history


@pytest.mark.asyncio
async def test_a_member_that_lost_its_upstream_with_unpersisted_seqs_relinks_its_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The middle forwarded a batch it had not persisted yet when its upstream link ended: the
    upstream may have lost it too, so the tail must subscribe again (and be told to roll back if
    its history went further than the middle's)."""
    print("seed", SEED)
    async with _chain(tmp_path) as (_, nodes):
        middle, tail = nodes["b"].replicas[0], nodes["c"].replicas[0]
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        await _until(lambda: "c" in middle.downstream_streams, "the tail linked")
        tail_stream = middle.downstream_streams["c"]
        entered, release = _hold_before_commit(monkeypatch, middle, THREADED)
        keys = _keys("k", THREADED)
        _, last = await nodes["a"].produce(queue, keys, [b"v"] * THREADED, None, None, acks=1)
        try:
            await _until(entered.is_set, "the middle's commit held")
            await _until(lambda: tail.durable >= last, "the tail holding what the middle lacks")
            stream = middle.upstream_stream
            assert stream is not None
            stream.close()
            await _until(lambda: middle.upstream_stream is None, "the middle's link down")
        finally:
            # The held commit lands before the middle links again (its retry waits >= 25 ms),
            # so the middle is not behind its upstream then and no catch-up closes the tail's
            # link: only the rule under test does.
            release.set()
        await _until(
            lambda: middle.downstream_streams.get("c") is not tail_stream, "the tail's link closed"
        )
        assert await nodes["a"].wait_committed(0, last, int(WAIT_S * 1000)) >= last
        await _until(lambda: tail.commit_point >= last, "the tail committed through the batch")
        assert _stored_keys(tail) == _stored_keys(middle)


@pytest.mark.asyncio
async def test_a_version_1_link_is_refused(tmp_path: Path) -> None:
    """Version 1 persisted before it forwarded and knew no COMMIT_POINT: a chain must not mix
    the two rules, so a link handshake below version 2 fails with protocol_error."""
    async with _chain(tmp_path) as (topology, _):
        address = topology.nodes["b"]
        reader, writer = await asyncio.open_connection(address.host, address.bin_port)
        try:
            writer.write(fr.encode(fr.Hello(1, "c", 0, topology.epoch, "tail")))
            decoder = fr.FrameDecoder()
            frames: list[fr.Frame] = []
            while not frames:
                data = await asyncio.wait_for(reader.read(65536), WAIT_S)
                assert data, "closed without an answer"
                frames.extend(decoder.feed(data))
            assert isinstance(frames[0], fr.ErrorFrame)
            assert frames[0].code == ProtocolError.code
            assert "version 2" in frames[0].message
        finally:
            writer.close()
