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
from kayos.replication.logic import chain
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from tests.support.links import first_answer
from tests.support.links import until as _until
from tests.support.replicas import SEED, WAIT_S, node_chain, stored_keys

pytestmark = pytest.mark.unit

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


def _fail_head_commit(
    monkeypatch: pytest.MonkeyPatch, head: ShardReplica, entries: int, when: threading.Event
) -> None:
    """``head``'s store refuses its commits of ``entries`` entries, once ``when`` is set: the
    batch has gone down the chain by then, which is the case forward-then-persist must handle."""
    real_commit = ShardStore.commit_columns

    def commit_columns(store: ShardStore, *args: Any, **kwargs: Any) -> Any:
        if store is head.store and len(args[0]) == entries:
            assert when.wait(WAIT_S)
            raise StorageError("simulated: the head's disk failed this commit")
        return real_commit(store, *args, **kwargs)

    monkeypatch.setattr(ShardStore, "commit_columns", commit_columns)


def _keys(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


@pytest.mark.asyncio
async def test_a_tail_shows_nothing_past_the_commit_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's fsync is slow: middle and tail hold the batch durably before the head does.
    It is not committed, so a consumer on the tail must not see it until the head's commit lands."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
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
    async with node_chain(tmp_path) as (_, nodes):
        head, middle, tail = (nodes[n].replicas[0] for n in "abc")
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        real_commit = ShardStore.commit_columns
        downstream_has_it = threading.Event()
        _fail_head_commit(monkeypatch, head, THREADED, downstream_has_it)
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
            assert stored_keys(replica) == stored_keys(head), f"{replica.node_id} diverged"
        assert not any(key.startswith(b"q\x00doomed") for key in stored_keys(tail))
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
    """The middle forwarded batch Y to the tail but had not persisted it (its store was busy
    with batch X) when its upstream link ended, and the head lost Y. The middle must make its
    tail subscribe again: the tail then rolls Y back, instead of keeping it under seqs the head
    gives out anew."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
        head, middle, tail = (nodes[n].replicas[0] for n in "abc")
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        x_keys, y_keys = _keys("x", THREADED), _keys("y", THREADED + 1)
        release_x = threading.Event()
        real_commit = ShardStore.commit_columns

        def commit_columns(store: ShardStore, *args: Any, **kwargs: Any) -> Any:
            keys = args[0]
            if store is middle.store and len(keys) == len(x_keys):
                assert release_x.wait(WAIT_S)  # the middle's store is slow with X
            if store is head.store and len(keys) == len(y_keys):
                deadline = WAIT_S
                while tail.durable < y_last and deadline > 0:
                    threading.Event().wait(0.01)  # a bounded poll from the worker thread
                    deadline -= 0.01
                raise StorageError("simulated: the head's disk failed this commit")
            return real_commit(store, *args, **kwargs)

        y_last = 1 + len(x_keys) + len(y_keys)
        monkeypatch.setattr(ShardStore, "commit_columns", commit_columns)
        await nodes["a"].produce(queue, x_keys, [b"v"] * len(x_keys), None, None, acks=1)
        with pytest.raises(StorageError):
            await nodes["a"].produce(queue, y_keys, [b"v"] * len(y_keys), None, None, acks=1)
        assert middle.progress.accepted == y_last, "the middle took Y in"
        assert middle.durable < y_last, "and holds it nowhere durable yet"
        release_x.set()
        await _until(lambda: not head.starting_new_history, "the head's new history")
        # New writes only once the middle follows the head again, level with it: no catch-up
        # (which closes the links below too) can hide the rule under test.
        await _until(
            lambda: "b" in head.downstream_streams and middle.durable == head.durable,
            "the middle linked again",
        )
        for i in range(len(y_keys) + 4):
            await nodes["a"].produce(queue, [f"after-{i}".encode()], [b"v"], None, None, acks=1)
        await _until(
            lambda: tail.commit_point >= head.durable and middle.durable == head.durable,
            "the chain level again",
        )
        for replica in (middle, tail):
            assert stored_keys(replica) == stored_keys(head), f"{replica.node_id} diverged"


@pytest.mark.asyncio
async def test_a_version_1_link_is_refused(tmp_path: Path) -> None:
    """Version 1 persisted before it forwarded and knew no COMMIT_POINT, version 2 did not
    authenticate links: a link handshake below version 3 fails with protocol_error."""
    async with node_chain(tmp_path) as (topology, _):
        hello = fr.Hello(1, "c", 0, topology.epoch, "tail")
        answer = await first_answer(topology.nodes["b"], hello, WAIT_S)
        assert isinstance(answer, fr.ErrorFrame)
        assert answer.code == ProtocolError.code
        assert f"version {fr.LINK_PROTOCOL_VERSION_MIN}" in answer.message


def test_a_discard_forgets_the_reports_of_the_lost_part() -> None:
    """A downstream may report seqs its head then loses; those reports must not count for the
    seqs the head gives out anew, or a write held by the head alone would count as committed."""
    head = chain.Progress(has_upstream=False, downstreams=("b",))
    head, _ = run_events(
        head,
        chain.Durable(1),
        chain.Accepted(21),
        chain.DownstreamCommitted("b", 21),
        chain.Discarded(),
    )
    head, _ = run_events(head, chain.Durable(2))  # seq 2 of the new history, on the head alone
    assert head.commit_point == 1


def run_events(
    progress: chain.Progress, *events: chain.Event
) -> tuple[chain.Progress, list[chain.Action]]:
    actions: list[chain.Action] = []
    for event in events:
        progress, more = chain.step(progress, event)
        actions.extend(more)
    return progress, actions


@pytest.mark.asyncio
async def test_a_stale_report_never_commits_the_new_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The middle and tail commit a batch before the head, whose commit then fails. Until the
    middle links again, the head alone holds its new writes: an acks=all write must wait."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
        head, middle = nodes["a"].replicas[0], nodes["b"].replicas[0]
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        gate = asyncio.Event()  # keeps the middle from linking again
        link = next(link for link in nodes["b"].links if link.replica is middle)
        real_connect = link._connect

        async def gated_connect(*args: Any, **kwargs: Any) -> Any:
            await gate.wait()
            return await real_connect(*args, **kwargs)

        link._connect = gated_connect
        last = 1 + THREADED
        reported = threading.Event()
        real_commit = ShardStore.commit_columns
        _fail_head_commit(monkeypatch, head, THREADED, reported)
        write = asyncio.create_task(
            nodes["a"].produce(
                queue, _keys("doomed", THREADED), [b"v"] * THREADED, None, None, acks=-1
            )
        )
        await _until(
            lambda: head.progress.downstream_committed.get("b", 0) >= last, "b reporting it"
        )
        reported.set()
        with pytest.raises(StorageError):
            await asyncio.wait_for(write, WAIT_S)
        monkeypatch.setattr(ShardStore, "commit_columns", real_commit)
        await _until(lambda: not head.starting_new_history, "the head's new history")
        first, _ = await nodes["a"].produce(queue, [b"after"], [b"v"], None, None, acks=1)
        assert await head.wait_committed(first, 0.2) < first, "committed on the head alone"
        gate.set()
        assert await head.wait_committed(first, WAIT_S) >= first


@pytest.mark.asyncio
async def test_a_commit_still_landing_when_the_link_drops_is_rolled_back_with_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The middle's commit of a batch the head then loses is still in its worker thread when the
    link drops (its awaiting task is cancelled, the thread goes on). It must land before the
    middle subscribes again, so that the divergence rule sees it and rolls it back; landing after
    the SUBSCRIBE, it would stay under seqs the head gives out anew."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
        head, middle, tail = (nodes[n].replicas[0] for n in "abc")
        queue = "q"
        await nodes["a"].produce(queue, [b"before"], [b"v"], None, None, acks=-1)
        last = 1 + THREADED
        release = threading.Event()
        real_commit = ShardStore.commit_columns

        def commit_columns(store: ShardStore, *args: Any, **kwargs: Any) -> Any:
            if store is head.store and len(args[0]) == THREADED:
                deadline = WAIT_S
                while middle.progress.accepted < last and deadline > 0:
                    threading.Event().wait(0.01)  # a bounded poll from the worker thread
                    deadline -= 0.01
                raise StorageError("simulated: the head's disk failed this commit")
            if store is middle.store and len(args[0]) == THREADED:
                assert release.wait(WAIT_S)  # a slow fsync, under way when the link drops
            return real_commit(store, *args, **kwargs)

        monkeypatch.setattr(ShardStore, "commit_columns", commit_columns)
        with pytest.raises(StorageError):
            await nodes["a"].produce(
                queue, _keys("doomed", THREADED), [b"v"] * THREADED, None, None, acks=1
            )
        await _until(lambda: not head.starting_new_history, "the head's new history")
        for i in range(THREADED + 4):
            await nodes["a"].produce(queue, [f"after-{i}".encode()], [b"v"], None, None, acks=1)
        # Give a middle that would subscribe before its commit lands the time to do so (its
        # retry waits 25-75 ms), then let the commit land.
        await _within(lambda: "b" in head.downstream_streams, 1.0)
        release.set()
        await _until(
            lambda: tail.commit_point >= head.durable and middle.durable == head.durable,
            "the chain level again",
        )
        for replica in (middle, tail):
            assert stored_keys(replica) == stored_keys(head), f"{replica.node_id} diverged"
        page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=100, wait_ms=0)
        assert not any(key.startswith(b"doomed") for key in page.keys)


async def _within(condition: Any, seconds: float) -> bool:
    """Whether ``condition`` holds within ``seconds`` (a bounded poll; False is no failure)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        if condition():
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_consumer_reads_its_acks_all_writes_at_the_tail_at_once(tmp_path: Path) -> None:
    """The head answers an acks=all producer once the chain is committed, before its
    COMMIT_POINT reaches the tail; a snapshot opened at the tail right after must still hold the
    write (the tail waits for its commit point to cover what it holds)."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
        queue = "q"
        for i in range(30):
            _, last = await nodes["a"].produce(queue, [b"k%d" % i], [b"v"], None, None, acks=-1)
            page = await nodes["c"].consume(queue, "g", after=0, upto=None, limit=100, wait_ms=0)
            assert page.seqs[-1:] == [last], f"write {i} at seq {last} not seen: {page.seqs[-3:]}"
