"""A read-back piece carries the metadata as of its own last seq (docs/replication-protocol.md,
"Applying batches"; docs/storage-format.md, "Rollback", the metadata as of a seq).

Left open by the fix of "a group's mark moved back under partitions with the manager"
(docs/campaigns.md, Findings): a link that read a piece back from its store sent the metadata of
the store's current snapshot, which may be ahead of the piece. The downstream counts a key the
batch changes as written at the batch's last seq, so a group's mark of a later, uncommitted seq
looked committed as soon as the commit point covered the piece, and a tail served a snapshot
from it (lost if the upstream then rolled back). The store tests use real stores and the link's
own read-back; the chain test in-process managed nodes over real stores and loopback links, the
tail's batch commits let through one at a time (a slow disk)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.node.marks import read_mark
from kayos.node.runtime import Node
from kayos.replication.link.sender import LinkSender, build_batch, read_range
from kayos.replication.logic import chain
from kayos.replication.shard.replica import ShardReplica
from kayos.storage import Put, ShardStore
from kayos.storage.batch import ops_to_columns, prepare_columns
from kayos.storage.group import Pending
from kayos.storage.maintenance.compact import compact
from tests.support.links import RecordingStream, SenderReplica, until
from tests.support.replicas import (
    GROUP,
    KEY,
    QUEUE,
    SEED,
    chain_node,
    managed_chain,
    marked,
    wait_before_commits,
)

pytestmark = pytest.mark.unit

MARK = "hwm/q/g"


def group_commit(store: ShardStore, *commits: tuple[list[Put], dict[str, Any] | None]) -> None:
    """``commits`` as one group commit: one header, a commit boundary after each (what
    concurrent commits make, built here without racing threads)."""
    pendings = [
        Pending(prepare_columns(*ops_to_columns(ops)), meta, None, claim_seq=not ops)
        for ops, meta in commits
    ]
    with store.write_lock:
        store._commit_group(pendings)
    assert all(p.error is None for p in pendings)


def test_a_piece_carries_the_metadata_as_of_its_last_seq(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([], meta={MARK: 1}, claim_seq=True)  # 1
        store.commit([Put(b"a", b"x" * 100)])  # 2
        store.commit([Put(b"b", b"x" * 100)])  # 3
        store.commit([], meta={MARK: 2}, claim_seq=True)  # 4: not committed anywhere yet
        entries, covered, meta, exact = read_range(store, 1, store.last_seq, bytes_max=150)
        assert ([e.seq for e in entries], covered) == ([2], 2)
        # Before the fix: the snapshot's map, {MARK: 2}, counted downstream as written at 2.
        assert (meta, exact) == ({MARK: 1}, True)
        _, covered, meta, exact = read_range(store, 2, store.last_seq)
        assert (covered, meta, exact) == (4, {MARK: 2}, True)
    finally:
        store.close()


def test_a_piece_ending_inside_a_group_commit_is_cut_back_to_its_header(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"a", b"x" * 100)])  # 1
        group_commit(
            store,
            ([Put(b"b", b"x" * 100)], None),  # 2
            ([], {MARK: 2}),  # 3
            ([Put(b"c", b"x" * 100)], None),  # 4
            ([Put(b"d", b"x" * 100)], None),  # 5: the group's header
        )
        # (0, 5] cut at 4 by the bytes bound: 4 is inside the group, whose header changed the
        # map, so the piece is cut back to the header below (1), whose map is exact.
        entries, covered, meta, exact = read_range(store, 0, 5, bytes_max=350)
        assert ([e.seq for e in entries], covered) == ([1], 1)
        assert (meta, exact) == ({}, True)
        # From inside the group no header lies in the piece: the older map, not exact.
        _, covered, meta, exact = read_range(store, 1, 5, bytes_max=250)
        assert (covered, meta, exact) == (4, {}, False)
        _, covered, meta, exact = read_range(store, 4, 5)
        assert (covered, meta, exact) == (5, {MARK: 2}, True)
    finally:
        store.close()


def test_a_group_commit_that_changed_no_metadata_keeps_the_map_exact(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([], meta={MARK: 1}, claim_seq=True)  # 1
        group_commit(store, ([Put(b"a", b"x" * 100)], None), ([Put(b"b", b"x" * 100)], None))
        store.commit([], meta={MARK: 2}, claim_seq=True)  # 4
        entries, covered, meta, exact = read_range(store, 1, 4, bytes_max=150)
        assert (covered, meta, exact) == (2, {MARK: 1}, True)
        assert [e.seq for e in entries] == [2]
    finally:
        store.close()


def test_a_piece_behind_a_compaction_carries_no_metadata(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"a", b"x" * 100)])  # 1
        store.commit([Put(b"b", b"x" * 100)])  # 2
        store.commit([], meta={MARK: 2}, claim_seq=True)  # 3
        compact(store)  # the header chain begins anew at seq 3
        store.commit([Put(b"c", b"x")])  # 4
        _, covered, meta, exact = read_range(store, 0, 4, bytes_max=150)
        assert (covered, meta, exact) == (1, None, False)
        _, covered, meta, exact = read_range(store, 1, 4)
        assert (covered, meta, exact) == (4, {MARK: 2}, True)
    finally:
        store.close()


def test_the_walk_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        for i in range(5):
            store.commit([Put(b"k", b"%d" % i)], meta={MARK: i})
        monkeypatch.setattr(limits, "rollback_meta_headers_max", 3)
        with store.snapshot() as snap:
            found = snap.meta_as_of(3)
            assert found is not None
            assert (found.meta, found.at, found.exact) == ({MARK: 2}, 3, True)
            assert snap.meta_as_of(2) is None  # four headers back from 5
    finally:
        store.close()


class Gate:
    """Lets batch commits through one per ``step``, every one after ``open`` (a slow disk)."""

    def __init__(self) -> None:
        self._steps = asyncio.Semaphore(0)
        self._open = False

    async def wait(self) -> None:
        if not self._open:
            await self._steps.acquire()

    def step(self) -> None:
        self._steps.release()

    def open(self) -> None:
        self._open = True
        for _ in range(64):  # wakes whoever waits: one applier per replica
            self._steps.release()


async def settle(gate: Gate, commit: asyncio.Task[int]) -> None:
    gate.open()
    if not commit.done():
        commit.cancel()
    await asyncio.gather(commit, return_exceptions=True)


async def produce_one(node: Node, key: bytes) -> int:
    """One entry of about 110 bytes at the head, durable there (not waiting for the chain)."""
    _, last = await node.produce(QUEUE, [key], [b"x" * 100], None, None, acks=1)
    return last


@pytest.mark.asyncio
async def test_a_tail_fed_by_read_back_serves_no_mark_ahead_of_its_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "abc") as (_, nodes):
        tail = await marked(nodes)  # mark 1 committed and served at c
        middle = nodes["b"].replicas[0]
        # Every batch below b is read back (no memory of recent ones), one in flight at a time,
        # one entry per piece.
        monkeypatch.setattr(limits, "replica_recent_batches_max", 0)
        monkeypatch.setattr(limits, "link_in_flight_batches_max", 1)
        monkeypatch.setattr(limits, "batch_bytes_max", 150)
        gate = Gate()
        wait_before_commits(tail, gate.wait)
        x = await produce_one(nodes["a"], b"x")
        await until(lambda: tail.progress.accepted >= x, "c took x in (not committed)")
        y1 = await produce_one(nodes["a"], b"y1")
        y2 = await produce_one(nodes["a"], b"y2")
        commit = asyncio.create_task(nodes["a"].commit_group(QUEUE, GROUP, 2, None))
        try:
            await until(lambda: read_mark(middle, KEY)[0] == 2, "b holds the mark 2")
            mark_seq = read_mark(middle, KEY)[1]
            assert y1 < y2 < mark_seq
            await until(lambda: middle.durable >= mark_seq, "b durable through the mark")
            # c commits x; b, its window free, reads (x, mark] back: the piece is y1 alone,
            # read from a snapshot that holds the mark 2. c commits it: the commit point
            # reaches y1, not the mark's seq.
            gate.step()
            await until(lambda: tail.progress.accepted >= y1, "c took y1 in")
            gate.step()
            await until(lambda: tail.commit_point >= y1, "the commit point reached y1")
            assert tail.commit_point < mark_seq
            assert not commit.done()
            # Before the fix c held the mark 2 as written at y1: servable, and served.
            mark, written_at = read_mark(tail, KEY)
            assert mark == 1, f"c holds the uncommitted mark {mark} (written at {written_at})"
            page = await nodes["c"].consume(
                QUEUE, GROUP, after=None, upto=None, limit=10, wait_ms=0
            )
            assert page.hwm == 1
            # Let c catch up: the chain commits the mark, and c serves it.
            gate.open()
            assert await commit > 0
            await until(
                lambda: (
                    read_mark(tail, KEY)[0] == 2
                    and chain.mark_servable(tail.progress, read_mark(tail, KEY)[1])
                ),
                "c holds the committed mark 2",
            )
            page = await nodes["c"].consume(
                QUEUE, GROUP, after=None, upto=None, limit=10, wait_ms=0
            )
            assert page.hwm == 2
        finally:
            await settle(gate, commit)


@pytest.mark.asyncio
async def test_a_first_piece_out_of_reach_leaves_the_downstream_its_own_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    print("seed", SEED)
    gate = Gate()
    real = ShardReplica.timed_commit

    async def gated(self: ShardReplica, *args: Any, **kwargs: Any) -> Any:
        if self.node_id == "c":
            await gate.wait()
        return await real(self, *args, **kwargs)

    async with managed_chain(tmp_path, "abc") as (topology, nodes):
        await marked(nodes)  # mark 1 committed and served at c
        await nodes["c"].stop()
        y1 = await produce_one(nodes["a"], b"y1")
        await produce_one(nodes["a"], b"y2")
        commit = asyncio.create_task(nodes["a"].commit_group(QUEUE, GROUP, 2, None))
        try:
            middle = nodes["b"].replicas[0]
            await until(lambda: read_mark(middle, KEY)[0] == 2, "b holds the mark 2")
            await until(lambda: middle.durable >= read_mark(middle, KEY)[1], "b durable")
            compact(middle.store)  # b's header chain begins anew past y1 and y2
            monkeypatch.setattr(limits, "batch_bytes_max", 150)
            monkeypatch.setattr(ShardReplica, "timed_commit", gated)
            nodes["c"] = chain_node(topology, "c", tmp_path, managed=True)
            await nodes["c"].start()
            tail = nodes["c"].replicas[0]
            gate.step()
            await until(lambda: tail.store.last_seq >= y1, "c committed its first piece")
            # The piece (..., y1] is out of b's reach: no map. Before the fix it carried b's
            # current one (the mark 2, of a later seq); a downstream taking a first batch
            # without a map as an empty one would have deleted the mark 1.
            assert read_mark(tail, KEY)[0] == 1
            assert tail.store.last_seq < read_mark(middle, KEY)[1]
            gate.open()
            assert await commit > 0
            await until(lambda: read_mark(tail, KEY)[0] == 2, "c holds the mark 2")
        finally:
            await settle(gate, commit)


@pytest.mark.asyncio
async def test_a_link_reads_back_until_its_map_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"a", b"x" * 100)])  # 1
        group_commit(
            store,
            ([], {MARK: 2}),  # 2
            ([Put(b"b", b"x" * 100)], None),  # 3
            ([Put(b"c", b"x" * 100)], None),  # 4: the group's header
        )
        # Seq 4 as the batch the store took it in from: it carries no metadata of its own.
        last = build_batch(0, 4, 4, [e for e in store.scan(3) if e.seq == 4], None)
        monkeypatch.setattr(limits, "batch_bytes_max", 150)  # one entry per piece
        replica = SenderReplica(store, last)
        stream = RecordingStream()
        sender = LinkSender(replica, stream, 0)  # type: ignore[arg-type]
        task = asyncio.create_task(sender.run())
        try:
            await until(lambda: sender.sent == 4, "the link sent through 4")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # (0, 1] with the whole map; (1, 3] ends inside the group, whose header is past it and
        # changed the map: the map as of 1, not exact; so 4 is read back too, with the mark.
        # Before, 4 went from memory, and the mark 2 written at 2 never went down the link.
        assert [(b.first_seq, b.last_seq, b.meta) for b in stream.sent] == [
            (1, 1, {}),
            (2, 3, None),
            (4, 4, {MARK: 2}),
        ]
    finally:
        store.close()
