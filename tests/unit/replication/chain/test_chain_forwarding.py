"""What a chain member forwards, and what it keeps while a write waits
(kayos/replication/shard/replica.py): a head drops the waiters of commits that timed out; a group
delete a middle missed reaches its tail; a commit still landing when its link failed is
forwarded by the next link; batches that piled up merge within the frame bounds; a link's
read-back fits one frame and cuts only between commits. In-process nodes on loopback (free
ports), driven through ``Node`` and ``ShardReplica``; every wait is a bounded poll of a
condition; seeds are printed."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.node.runtime import HWM_META
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from tests.support.links import one_shard_topology, until
from tests.support.replicas import SEED, WAIT_S, chain_node, node_chain

pytestmark = pytest.mark.unit


def _hold_commits(
    monkeypatch: pytest.MonkeyPatch, replica: ShardReplica, entries: int
) -> tuple[threading.Event, threading.Event]:
    """Holds the worker thread of each of ``replica``'s store commits of ``entries`` entries,
    once committed, until ``release`` is set; ``entered`` tells that one is held."""
    entered = threading.Event()
    release = threading.Event()
    real_commit = ShardStore.commit_columns

    def commit_columns(store: ShardStore, *args: Any, **kwargs: Any) -> Any:
        result = real_commit(store, *args, **kwargs)
        if store is replica.store and len(args[0]) == entries:
            entered.set()
            assert release.wait(WAIT_S)
        return result

    monkeypatch.setattr(ShardStore, "commit_columns", commit_columns)
    return entered, release


@pytest.mark.asyncio
async def test_timed_out_waiters_do_not_pile_up(tmp_path: Path) -> None:
    """A WAIT_COMMITTED for a seq that never commits must not leave its heap entry behind: a
    client polling with short timeouts would grow the head's memory without bound."""
    print("seed", SEED)
    topology = one_shard_topology(["a", "b"])
    replica = ShardReplica(
        node_id="a",
        topology=topology,
        shard=topology.shards[0],
        store_path=str(tmp_path / "a"),
        clock=chain_node(topology, "a", tmp_path).clock,
        rng=random.Random(SEED),
    )
    try:
        for _ in range(50):
            assert await replica.wait_committed(10**12, 0.001) == 0
        assert len(replica.commit_waiters) == 0
    finally:
        replica.close()


@pytest.mark.asyncio
async def test_group_delete_missed_by_a_middle_reaches_the_tail(tmp_path: Path) -> None:
    """A middle that missed a group delete while its upstream link was down learns it from the
    first batch of the new link (the full metadata). Its tail, linked all along, must learn the
    delete too, also when the middle forwards that batch from memory."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (topology, nodes):
        head, middle, tail = (nodes[n].replicas[0] for n in "abc")
        queue = "q"
        assert topology.chain_for(queue).id == 0
        await nodes["a"].produce(queue, [b"k1"], [b"v1"], None, None, acks=-1)
        await nodes["a"].commit_group(queue, "g", 1, None)
        key = f"{HWM_META}{queue}/g"
        await until(lambda: tail.store.meta.get(key) == 1, "the hwm on the tail")
        # Cut the middle from the head, for good: its link must not come back by itself.
        old_link = next(link for link in nodes["b"].links if link.replica is middle)
        old_link.stop()
        assert middle.upstream_stream is not None
        middle.upstream_stream.close()
        await until(lambda: middle.upstream_stream is None, "the middle's link down")
        delete = asyncio.create_task(nodes["a"].delete_group(queue, "g"))
        await until(lambda: key not in head.store.meta, "the delete on the head")
        assert key in middle.store.meta
        link = UpstreamLink(middle)
        nodes["b"].links.append(link)
        nodes["b"].spawn(link.run())
        await asyncio.wait_for(delete, WAIT_S)
        assert key not in middle.store.meta
        assert key not in tail.store.meta, "the tail kept a group every other member deleted"


@pytest.mark.asyncio
async def test_a_commit_cut_off_by_a_link_failure_is_still_forwarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link to the upstream fails while the middle's store commit of a batch runs in a worker
    thread: the commit lands, but the cancelled applier never steps the progress. The next link
    must count it (wake the senders, report it), or the tail never gets the batch and an acks=all
    producer of it times out unless more traffic happens to follow."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
        middle, tail = (nodes[n].replicas[0] for n in "bc")
        queue = "q"
        await nodes["a"].produce(queue, [b"first"], [b"v"], None, None, acks=-1)
        count = limits.inline_commit_entries_max + 4
        entered, release = _hold_commits(monkeypatch, middle, count)
        keys = [f"k{i}".encode() for i in range(count)]
        _, last = await nodes["a"].produce(queue, keys, [b"v"] * count, None, None, acks=1)
        await until(entered.is_set, "the middle's commit in its worker thread")
        stream = middle.upstream_stream
        assert stream is not None
        stream.close()
        # The link ends with the commit still in its worker thread; the link waits for it to
        # land (settle) before it links again, so it is released here, not once the link is down.
        release.set()
        await until(lambda: middle.upstream_stream is not stream, "the link down")
        committed = await nodes["a"].wait_committed(0, last, 10_000)
        assert committed >= last, f"committed {committed} never reached {last}"
        assert tail.durable >= last


@pytest.mark.asyncio
async def test_batches_that_piled_up_merge_within_the_frame_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches that queue up at a middle during a slow commit are merged into one commit and one
    forwarded BATCH; the merge must stay within ``batch_entries_max`` (a BATCH's column bound),
    or building it fails and the link drops, again and again under load."""
    print("seed", SEED)
    # The link must stay up for the merge's sake alone: on a loaded machine the held commit and
    # the big batches can keep a side quiet past the usual silence bound, which would drop the
    # link for a reason this test is not about.
    monkeypatch.setattr(limits, "peer_silence_ms_max", 120_000)
    async with node_chain(tmp_path) as (_, nodes):
        middle = nodes["b"].replicas[0]
        queue = "q"
        await nodes["a"].produce(queue, [b"first"], [b"v"], None, None, acks=-1)
        slow = limits.inline_commit_entries_max + 4  # committed in a worker thread
        entered, release = _hold_commits(monkeypatch, middle, slow)
        stream = middle.upstream_stream
        assert stream is not None
        received: list[int] = []
        real_recv = stream.recv

        async def recv() -> Any:
            frame = await real_recv()
            if isinstance(frame, fr.Batch):
                received.append(len(frame.seqs))
            return frame

        stream.recv = recv  # type: ignore[method-assign]
        await nodes["a"].produce(queue, [b"slow"] * slow, [b"v"] * slow, None, None, acks=1)
        await until(entered.is_set, "the middle's slow commit")
        # The first under half the bound (so a merge starts), both together over it.
        counts = (limits.batch_entries_max * 2 // 5, limits.batch_entries_max * 7 // 10)
        last = 0
        for part, count in enumerate(counts):
            keys = [f"{part}-{i}".encode() for i in range(count)]
            _, last = await nodes["a"].produce(queue, keys, [b"v"] * count, None, None, acks=1)
        await until(lambda: sum(received) >= sum(counts), "both big batches queued at the middle")
        release.set()
        committed = await nodes["a"].wait_committed(0, last, 20_000)
        assert committed >= last
        assert middle.upstream_stream is stream, "the middle's link dropped"


def test_reads_for_a_link_fit_one_frame_and_cut_only_between_commits(tmp_path: Path) -> None:
    """A link reading back from the store (catch-up, a cache miss) sends frames within the frame
    bounds, and ends a frame only where a commit ended, so an all-or-nothing write stays whole."""
    from kayos.replication.link.sender import read_range
    from kayos.storage import Put

    value = b"v" * 1000
    with ShardStore.open(str(tmp_path / "s")) as store:
        for commit in range(10):  # 10 commits of 3 entries of ~1 KB
            store.commit([Put(b"k%d-%d" % (commit, i), value) for i in range(3)])
        entries, covered, _, _ = read_range(store, 0, store.last_seq, bytes_max=7_500)
        assert [e.seq for e in entries] == [1, 2, 3, 4, 5, 6]  # two whole commits (~6 KB)
        assert covered == 6
        entries, covered, _, _ = read_range(store, 6, store.last_seq, entries_max=4)
        assert covered == 9, "cut after the commit that ends at seq 9, not at the 4th entry"
        entries, covered, _, _ = read_range(store, 0, store.last_seq)
        assert covered == store.last_seq == 30
        assert len(entries) == 30
