"""A chain of one (docs/replication-protocol.md, "An upstream that lacks committed entries"):
everything it makes durable is committed, and its store's local key ``alone`` says so across a
crash and the re-make that adds a downstream back, so the re-made head keeps the seqs it
acknowledged alone; once it counts a learner in its commit, it commits alone no more. A lone
``ShardReplica`` over a real store in a temporary directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kayos.replication.logic import durablemark
from kayos.replication.shard import lostcommit
from kayos.storage import Put, ShardStore
from tests.support.links import one_shard_topology, until
from tests.support.replicas import standalone_replica

pytestmark = pytest.mark.unit

SEED = 20261124


def _commit_alone(path: Path, prefix: str, count: int) -> None:
    """``count`` one-entry commits into the store at ``path``, as a chain of one writes them."""
    store = ShardStore.open(str(path))
    try:
        for i in range(count):
            store.commit([Put(f"{prefix}{i}".encode(), b"alone")])
    finally:
        store.close()


def _run_alone(path: Path, last: int) -> None:
    """h opens its store at ``path`` as a chain of one: it knows all it holds committed."""
    replica = standalone_replica(one_shard_topology(["h"]), path)
    try:
        assert replica.commit_point == last  # h alone: each acknowledged once durable on h
        assert replica.store.meta.get(durablemark.ALONE_META_KEY) is not None
    finally:
        replica.close()


async def _remade_with_d_drops_nothing(path: Path, marked: int, *, agreed: int, point: int) -> None:
    """The manager adds d back as tail (a re-make: commit point 0); d subscribes, its log agreeing
    with h's through ``agreed``, knowing ``point`` committed. h keeps what it committed alone."""
    remade = standalone_replica(one_shard_topology(["h", "d"]), path)
    try:
        assert remade.marked_committed == marked
        assert durablemark.ALONE_META_KEY not in remade.store.meta  # no chain of one any more
        lostcommit.step_down_to_repair(remade, "d", agreed, point)
        assert not remade.repairing, f"h would drop seqs past {agreed} it acknowledged alone"
    finally:
        await asyncio.gather(*remade.background_tasks, return_exceptions=True)
        remade.close()


@pytest.mark.asyncio
async def test_a_head_that_committed_alone_keeps_its_seqs_after_the_remake(tmp_path: Path) -> None:
    """docs/replication-protocol.md, "An upstream that lacks committed entries": a head whose own
    commit point is past the agreed seq committed seqs alone and drops neither history. A chain
    of one commits every seq it makes durable; the topology that adds the downstream back re-makes
    the replica (another set of downstreams), and the re-made head's commit point is 0 until that
    downstream acks, so the guard sees nothing committed and the head throws its acknowledged
    seqs 101-110 away to take the downstream's."""
    print("seed", SEED)
    path = tmp_path / "h"
    _commit_alone(path, "k", 110)
    _run_alone(path, 110)
    # d subscribes knowing seqs through 105 committed; its log agrees with h's through 100.
    await _remade_with_d_drops_nothing(path, 110, agreed=100, point=105)


@pytest.mark.asyncio
async def test_a_head_that_crashed_alone_keeps_seqs_past_its_mark(tmp_path: Path) -> None:
    """docs/replication-protocol.md, "An upstream that lacks committed entries": the mark of a
    chain of one is raised only now and then, so a crash may leave its last acknowledged seqs
    past it. The store's local key ``alone`` (set when it opened as a chain of one) tells the
    next open that everything it holds was committed: the topology that adds d back finds it."""
    print("seed", SEED)
    path = tmp_path / "h"
    _commit_alone(path, "k", 110)
    _run_alone(path, 110)
    assert durablemark.read(str(path)) == 110
    _commit_alone(path, "late", 10)  # h alone acknowledges 111-120, then crashes
    # d agrees with h through 112 (past h's last mark write) and knows 115 committed.
    await _remade_with_d_drops_nothing(path, 120, agreed=112, point=115)


@pytest.mark.asyncio
async def test_a_chain_of_one_counting_a_learner_commits_alone_no_more(tmp_path: Path) -> None:
    """docs/replication-protocol.md, "An upstream that lacks committed entries": once a chain of
    one counts a learner in its commit, seqs past its commit point wait for the learner, so its
    store's ``alone`` key goes (after the mark took what it committed alone); it comes back when
    the manager's word ends the count."""
    print("seed", SEED)
    path = tmp_path / "h"
    _commit_alone(path, "k", 20)
    replica = standalone_replica(one_shard_topology(["h"]), path)
    try:
        assert replica.store.meta.get(durablemark.ALONE_META_KEY) is not None
        replica.learner_report("l", replica.commit_point)
        await until(lambda: replica.counted_followers == ("l",), "l counted and recorded")
        assert durablemark.ALONE_META_KEY not in replica.store.meta
        assert replica.marked_committed == 20
        await replica.keep_followers(replica.epoch, set())
        assert replica.store.meta.get(durablemark.ALONE_META_KEY) is not None
    finally:
        await asyncio.gather(*replica.background_tasks, return_exceptions=True)
        replica.close()
