"""A new consumer snapshot starts at a committed group mark only (docs/node-api.md, "Consume";
docs/campaigns.md, Findings, "a group's mark moved back").

Forward, then persist: a tail may hold a group commit durably before the middle does. The tail
read the group's mark from its store's metadata, so it served a snapshot starting at a mark
nobody had been told of; when the middle's upstream link then ended, the middle discarded the
batch it had taken in but not begun to commit, the tail rolled back to it, and the group's next
snapshot started lower. In-process managed nodes over real stores and real loopback links; the
middle's store commit is held (a slow disk) by wrapping its ``timed_commit``."""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.errors import UnavailableError
from kayos.node.marks import committed_mark, read_mark
from kayos.node.runtime import Node
from kayos.replication.logic import chain
from kayos.storage import Put, ShardStore
from kayos.storage.maintenance.compact import compact
from tests.support.links import until
from tests.support.replicas import (
    GROUP,
    KEY,
    QUEUE,
    SEED,
    cut_middle,
    granting,
    managed_chain,
    mark_2_held,
    snapshot,
)

pytestmark = pytest.mark.unit


async def served_mark(node: Node) -> int:
    """The mark a new snapshot at ``node`` starts at, once its commit point covers the mark."""
    replica = node.replicas[0]
    await until(lambda: chain.mark_servable(replica.progress, read_mark(replica, KEY)[1]), "level")
    page = await node.consume(QUEUE, GROUP, after=None, upto=None, limit=10, wait_ms=0)
    return page.hwm


@pytest.mark.asyncio
async def test_a_mark_only_durable_at_the_tail_starts_no_snapshot(tmp_path: Path) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "abc") as (_, nodes), mark_2_held(nodes) as held:
        tail = held.tail
        # The middle forwarded the mark 2 and has not committed it; the tail has.
        _mark, written_at = read_mark(tail, KEY)
        assert held.middle.durable < written_at
        assert not chain.mark_servable(tail.progress, written_at)
        assert not held.commit.done()
        # Before the fix the tail served hwm 2 here (and the chain confirmed: the head holds
        # its lease, every link is up). The lease is granted every round meanwhile, as the
        # leader does: the snapshot waits for the commit point longer than one lease lasts.
        with pytest.raises(UnavailableError, match="may not be committed yet"):
            async with granting(nodes["a"]):
                await snapshot(nodes["c"])

        # The middle loses its upstream: its commit of the mark never begins, it discards the
        # batch and the tail rolls back to what the middle holds (seq 3).
        await cut_middle(nodes, for_good=True)
        await until(lambda: tail.store.last_seq == written_at - 1, "c rolled back")
        assert tail.commit_point == written_at - 1
        # Before the fix the store kept its metadata through the rollback: mark 2, of the
        # dropped seq, stayed (at a seq the commit point covers) until the middle's first batch
        # replaced it; a snapshot started at 2, the next one at 1. Now the rollback restores
        # the mark as of seq 3.
        await until(lambda: tail.rolled_back_to() is None, "c's rollback settled")
        assert read_mark(tail, KEY) == (1, written_at - 1)
        assert read_mark(held.middle, KEY)[0] == 1
        assert await committed_mark(tail, KEY, "c", 0.0) == 1


@pytest.mark.asyncio
async def test_a_rolled_back_tail_serves_the_mark_the_chain_commits_again(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "abc") as (_, nodes), mark_2_held(nodes) as held:
        # The middle's link ends and comes back: it discards the mark's batch, the tail rolls
        # back, and the middle takes the batch from the head again.
        await cut_middle(nodes, for_good=False)
        await until(lambda: held.tail.rolled_back_entries > 0, "c rolled back")
        held.release.set()
        assert await held.commit > 0  # the chain committed the mark: acknowledged
        assert await served_mark(nodes["c"]) == 2
        assert held.tail.rolled_back_to() is None


@pytest.mark.asyncio
async def test_a_mark_is_served_once_the_commit_point_covers_it(tmp_path: Path) -> None:
    print("seed", SEED)
    async with managed_chain(tmp_path, "abc") as (_, nodes), mark_2_held(nodes) as held:
        # The head holds its lease (the leader grants it every round) through the snapshot's
        # wait for the commit point.
        with pytest.raises(UnavailableError, match="may not be committed yet"):
            async with granting(nodes["a"]):
                await snapshot(nodes["c"])
        held.release.set()
        assert await held.commit > 0  # the chain committed it: acknowledged
        assert await served_mark(nodes["c"]) == 2


def test_the_store_knows_the_seq_that_last_changed_a_metadata_key(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        store.commit([Put(b"k", b"w")])
        assert store.meta_written_at("hwm/q/g") == 2
        assert store.meta_written_at("hwm/q/other") == 0  # unchanged since it opened
        store.commit([], meta={"hwm/q/g": None}, claim_seq=True)
        assert store.meta_written_at("hwm/q/g") == 4  # a delete is a change too
    finally:
        store.close()
    reopened = ShardStore.open(str(tmp_path / "s"))
    try:
        assert reopened.meta_written_at("hwm/q/g") == 4  # the seq it opened at
    finally:
        reopened.close()


def _replicated(name: str) -> bool:
    return name.startswith("hwm/")


def test_a_rollback_restores_the_replicated_metadata_as_of_its_seq(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        store.commit([], meta={"local": b"a"})  # local, no seq
        store.commit([], meta={"hwm/q/g": 2, "hwm/q/new": 3}, claim_seq=True)
        store.commit([Put(b"k", b"w")], meta={"local": b"b"})
        assert store.rollback_to(2, _replicated)
        assert store.last_seq == 2
        assert store.meta == {"hwm/q/g": 1, "local": b"b"}
        assert store.meta_written_at("hwm/q/g") == 2
        assert store.meta_written_at("hwm/q/new") == 2  # deleted back: changed too
    finally:
        store.close()
    reopened = ShardStore.open(str(tmp_path / "s"))
    try:
        assert reopened.meta == {"hwm/q/g": 1, "local": b"b"}  # the rollback's header holds it
    finally:
        reopened.close()


def test_a_rollback_behind_a_compaction_keeps_the_metadata_and_says_so(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        store.commit([], meta={"hwm/q/g": 2}, claim_seq=True)
        compact(store)  # the header chain starts anew at seq 3
        store.commit([Put(b"k", b"w")])
        assert not store.rollback_to(2, _replicated)
        assert store.last_seq == 2
        assert store.meta == {"hwm/q/g": 2}
        assert store.rollback_to(1)  # restoring nothing asked: nothing missed
    finally:
        store.close()


def test_a_mark_is_servable_only_at_or_below_the_commit_point() -> None:
    progress = chain.Progress(has_upstream=True, downstreams=())
    for event in (chain.Accepted(5), chain.Durable(5), chain.UpstreamCommitPoint(3)):
        progress, _ = chain.step(progress, event)
    assert progress.durable == 5
    assert progress.commit_point == 3
    assert chain.mark_servable(progress, 3)
    assert not chain.mark_servable(progress, 4)
    progress, _ = chain.step(progress, chain.UpstreamCommitPoint(5))
    assert chain.mark_servable(progress, 5)
