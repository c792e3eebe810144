"""Review of session 10's safety changes: findings pinned by tests (docs/campaigns.md, Findings).

A group's mark is served only once the commit point covers the seq that last changed it
(``ShardStore.meta_written_at``, ``chain.mark_servable``). After a rollback that restored the
replicated metadata, no key may report a seq past the store's last one: the commit point of the
history the replica is now on cannot reach a dropped seq until the shard takes that many writes
again, so on an idle shard the tail would refuse every new snapshot for good."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.errors import ProtocolError
from kayos.node.marks import read_mark
from kayos.replication import durablemark, lostcommit
from kayos.replication import frames as fr
from kayos.storage import Put, ShardStore
from tests.support.links import first_answer, one_shard_topology, until
from tests.support.marks import KEY, cut_middle, mark_2_held
from tests.support.nodes import chain_node, managed_chain, node_chain, standalone_replica


def _replicated(name: str) -> bool:
    return name.startswith("hwm/")


def test_a_key_the_rollback_left_unchanged_reports_no_dropped_seq(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        # A consumer's commit retried with the same mark (its first answer timed out): the same
        # value at a later seq, which the rollback then drops.
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        assert store.meta_written_at("hwm/q/g") == 3
        assert store.rollback_to(2, _replicated)
        assert store.meta == {"hwm/q/g": 1}
        assert store.meta_written_at("hwm/q/g") <= store.last_seq == 2
    finally:
        store.close()


def test_a_key_unchanged_since_the_store_opened_reports_no_dropped_seq(tmp_path: Path) -> None:
    """The common case: a tail killed with an uncommitted suffix restarts (every key then
    counts as written at the seq it opened at), and its new upstream orders a rollback."""
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        store.commit([Put(b"k", b"w")])
        store.commit([Put(b"k", b"x")])
    finally:
        store.close()
    reopened = ShardStore.open(str(tmp_path / "s"))
    try:
        assert reopened.meta_written_at("hwm/q/g") == 4  # the seq it opened at
        assert reopened.rollback_to(2, _replicated)
        assert reopened.meta == {"hwm/q/g": 1}
        assert reopened.meta_written_at("hwm/q/g") <= reopened.last_seq == 2
        assert reopened.meta_written_at("hwm/q/never") <= 2
    finally:
        reopened.close()


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
        await asyncio.gather(*remade._background, return_exceptions=True)
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
        await asyncio.gather(*replica._background, return_exceptions=True)
        replica.close()


@pytest.mark.asyncio
async def test_a_rollback_that_kept_the_metadata_settles_on_an_idle_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/storage-format.md, "Rollback": past ``limits.rollback_meta_headers_max`` headers (or
    behind a compaction) the store keeps its metadata and the replica serves no snapshot until a
    link replaced it (local key ``rolled_back``). Only a link's first BATCH replaced it; an
    upstream holding nothing past the rollback seq sent none, so on a shard nobody writes to the
    tail answered 503 to every new consumer for as long as the shard stayed idle. Now the idle
    upstream sends its whole map as of that seq (METADATA, docs/replication-protocol.md, "The
    metadata on an idle link"): the tail settles and holds the middle's map, without the mark
    its rollback dropped."""
    print("seed", SEED)
    monkeypatch.setattr(limits, "rollback_meta_headers_max", 0)  # no header chain walked
    # Each store rollback and whether it restored the metadata: the link may settle the rollback
    # (METADATA) before a poll of the local key could see it set, so the key is not what shows
    # that the metadata was kept.
    rollbacks: list[tuple[str, int, bool]] = []
    real_rollback_to = ShardStore.rollback_to

    def rollback_to(store: ShardStore, seq: int, *args: Any, **kwargs: Any) -> bool:
        restored = bool(real_rollback_to(store, seq, *args, **kwargs))
        rollbacks.append((store.path, seq, restored))
        return restored

    monkeypatch.setattr(ShardStore, "rollback_to", rollback_to)
    async with managed_chain(tmp_path, "abc") as (_, nodes), mark_2_held(nodes) as held:
        tail = held.tail
        _mark, written_at = read_mark(tail, KEY)
        await cut_middle(nodes, for_good=True)  # the middle holds through seq written_at - 1
        await until(lambda: rollbacks, "c rolled back")  # recorded once the call returned
        assert rollbacks == [(tail.store.path, written_at - 1, False)]  # the metadata was kept
        await until(lambda: tail.upstream_stream is not None, "c linked to b again")
        # Nothing is written any more: the middle has nothing past seq written_at - 1 to send.
        await until(lambda: tail.rolled_back_to() is None, "c's rollback settled", 10.0)
        # The middle's map as of that seq: the mark 2 of the dropped seq is gone.
        assert read_mark(tail, KEY)[0] == 1
        assert tail.store.meta == {**tail.store.meta, KEY: held.middle.store.meta[KEY]}


@pytest.mark.asyncio
async def test_a_head_repairs_from_a_downstream_that_is_repairing_itself(tmp_path: Path) -> None:
    """docs/node-api.md, "Self-repair": a head whose store opened below its durable mark asks its
    downstreams, then the other nodes, until it holds the mark's seq. Here both stores of a chain
    a -> b were cut short (a truncation past each one's last durable-mark write): a lost its last
    two seqs, which b holds; b lost two past its own mark, which nobody holds. b refused every
    SUBSCRIBE while it repaired, the repair link of its head included (downstream.py), and
    re-fetched from its upstream a, which refused it while it repaired: neither ever served,
    although b held every seq a needs. Now b serves its head's repair link."""
    print("seed", SEED)
    async with node_chain(tmp_path, "ab") as (topology, nodes):
        for i in range(12):
            await nodes["a"].produce("q", [f"k{i}".encode()], [b"v"], None, None, acks=-1)
        head, middle = (nodes[n].replicas[0] for n in "ab")
        last = head.durable
        await until(lambda: middle.commit_point >= last, "b knowing every seq committed")
        paths = {n: nodes[n].replicas[0].store_path for n in "ab"}
        for node in nodes.values():
            await node.stop()
        store = ShardStore.open(paths["a"])
        try:
            store.rollback_to(last - 2)  # a lost seqs it acknowledged: b holds them
        finally:
            store.close()
        durablemark.write(paths["a"], last)
        durablemark.write(paths["b"], last + 2)  # b lost two seqs past its mark: nobody holds them
        for n in "ab":
            nodes[n] = chain_node(topology, n, tmp_path)
            await nodes[n].start()

        def led() -> bool:
            replica = nodes["a"].replicas.get(0)
            return replica is not None and not replica.repairing and replica.durable >= last

        await until(led, "a re-fetching seqs it lost from b and leading", 15.0)
        head = nodes["a"].replicas[0]
        assert head.store.get(b"q\x00k11") is not None, "a lacks the last acknowledged entry"
        # a's new writes reach b's mark: b repairs from its upstream as before.
        for i in range(2):
            await nodes["a"].produce("q", [f"new{i}".encode()], [b"v"], None, None, acks=-1)
        await until(lambda: not nodes["b"].replicas[0].repairing, "b repaired from a", 15.0)


@pytest.mark.asyncio
async def test_a_version_4_link_is_refused_clearly(tmp_path: Path) -> None:
    """A rolling upgrade's mixed chain: a node one version behind (its SUBSCRIBE names no commit
    point, so a head could not tell it lost committed entries) is refused with protocol_error
    naming the version links need, never served (docs/replication-protocol.md, "Version")."""
    async with node_chain(tmp_path, "ab") as (topology, _):
        answer = await first_answer(
            topology.nodes["a"], fr.Hello(4, "b", 0, topology.epoch, "tail")
        )
        assert isinstance(answer, fr.ErrorFrame)
        assert answer.code == ProtocolError.code
        assert "replication links need protocol version 5; b speaks 4" in answer.message
