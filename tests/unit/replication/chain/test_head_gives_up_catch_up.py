"""A head gives up a catch-up its store still names (campaign seed 2512, docs/campaigns.md): a
member whose upstream went before it reached its catch-up target, made head of a chain of one,
removes the target in the commit of its takeover entry, leaves the catching-up state, serves its
reads and feeds its learners (docs/replication-protocol.md, "A head gives up its catch-up"). A real
``ShardReplica`` and a real in-process ``Node`` over a store prepared in a temporary directory;
every wait is a bounded poll."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.node.runtime import Node
from kayos.replication.shard.local_meta import (
    CATCH_UP_META_KEY,
    TAKEOVER_META_KEY,
    pack_takeover,
)
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from kayos.storage import ShardStore
from kayos.topology import ShardChain, Topology
from tests.support.links import (
    TEST_IDENTITY,
    RawLink,
    answer_challenge,
    link_hello,
    one_shard_topology,
)
from tests.support.replicas import SEED, standalone_replica

pytestmark = pytest.mark.unit

HELD = 40  # entries the member's store holds, each its own commit
TARGET = HELD + 7  # the upstream's last seq when the member's last SUBSCRIBE found it behind
QUEUE = "q"
OLD_MASTER = (bytes([7]) * 16, 0)


def _lone_head_topology(*others: str) -> Topology:
    """Shard 0 is a chain of ``h`` alone; ``others`` are nodes outside it."""
    nodes = one_shard_topology(["h", *others]).nodes
    return Topology(1, nodes, {0: ShardChain(0, ("h",), ())}, TEST_IDENTITY)


def _store_left_catching_up(path: Path) -> None:
    """What an interrupted catch-up leaves: ``HELD`` entries of queue ``q`` and the target."""
    path.mkdir(parents=True, exist_ok=True)
    store = ShardStore.open(str(path))
    try:
        for i in range(HELD):
            meta = {TAKEOVER_META_KEY: pack_takeover([OLD_MASTER])} if i == 0 else None
            store.commit_columns([f"{QUEUE}\x00{i:08d}".encode()], [b"v"], meta=meta)
        store.commit([], meta={CATCH_UP_META_KEY: TARGET})
    finally:
        store.close()


@pytest.mark.asyncio
async def test_a_head_removes_its_catch_up_target_in_its_takeover_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    print("seed", SEED)
    path = tmp_path / "h"
    _store_left_catching_up(path)
    topology = _lone_head_topology()
    replica = standalone_replica(topology, path)
    last = replica.store.last_seq
    try:
        restored = replica.catching_up
        assert restored, "the stored target is read back at open"
        commits: list[dict[str, Any]] = []
        real_commit = replica.store.commit

        def commit(*args: Any, **kwargs: Any) -> Any:
            commits.append(dict(kwargs.get("meta") or {}))
            return real_commit(*args, **kwargs)

        replica.store.commit = commit  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="kayos.replication"):
            await replica.become_head()
        assert not replica.catching_up
        assert CATCH_UP_META_KEY not in replica.store.meta
        # One commit: the takeover entry's, which removes the target (a crash cannot leave a
        # head whose store still names it).
        assert [sorted(meta) for meta in commits] == [[CATCH_UP_META_KEY, TAKEOVER_META_KEY]]
        assert commits[0][CATCH_UP_META_KEY] is None
        assert replica.takeover_table()[-1][1] == last
        warned = [
            r.getMessage() for r in caplog.records if "gives up its catch-up" in r.getMessage()
        ]
        assert warned == [
            f"shard 0: head gives up its catch-up at seq {last} (target {TARGET}, its upstream "
            "gone): it leads from its last seq"
        ], warned
    finally:
        replica.close()
    reopened = standalone_replica(topology, path)
    try:
        assert not reopened.catching_up, "the target stays given up across a restart"
        assert CATCH_UP_META_KEY not in reopened.store.meta
    finally:
        reopened.close()


@pytest.mark.asyncio
async def test_a_head_giving_up_a_target_past_the_rollback_window_logs_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the window, read-back left out versions superseded by seqs the store never got:
    they may be missing from the history the head leads, which it says as an error."""
    print("seed", SEED)
    path = tmp_path / "h"
    _store_left_catching_up(path)
    store = ShardStore.open(str(path))
    try:
        far = store.last_seq + limits.rollback_window_seqs + 1
        store.commit([], meta={CATCH_UP_META_KEY: far})
    finally:
        store.close()
    replica = standalone_replica(_lone_head_topology(), path)
    try:
        with caplog.at_level(logging.WARNING, logger="kayos.replication"):
            await replica.become_head()
        assert not replica.catching_up
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        assert f"gives up its catch-up at seq {HELD}" in errors[0], errors
        assert f"target {far}" in errors[0], errors
        assert "may be missing" in errors[0], errors
    finally:
        replica.close()


def _subscribe_as_learner(topology: Topology) -> fr.Frame | None:
    """A learner d's SUBSCRIBE from seq 1 to h: the frame that answers it."""
    address = topology.nodes["h"]
    link = RawLink.open(address.host, address.bin_port)
    try:
        link.send(link_hello("d", 0, topology.epoch, "learner"))
        claim = auth.LinkClaim("d", "h", 0, topology.epoch, "learner")
        assert isinstance(answer_challenge(link, TEST_IDENTITY, claim), fr.AuthOk)
        assert isinstance(link.next(), fr.HelloOk)
        link.send(fr.Subscribe(0, 1, ()))
        return link.next()
    finally:
        link.close()


@pytest.mark.asyncio
async def test_a_lone_head_left_catching_up_serves_reads_and_its_learners(tmp_path: Path) -> None:
    """The campaign's shape: the store of a member cut off mid catch-up opens as the head of a
    chain of it alone. Its consumers read what it holds, and a learner's SUBSCRIBE is answered
    (it was refused ``unavailable`` for good)."""
    print("seed", SEED)
    topology = _lone_head_topology("d")
    _store_left_catching_up(tmp_path / "h" / "shards" / "0")
    node = Node(topology, "h", str(tmp_path / "h"), rng=random.Random(SEED))
    await node.start()
    try:
        replica = node.replicas[0]
        assert replica.role == "head"
        assert not replica.catching_up
        page = await node.consume(QUEUE, "g", after=None, upto=None, limit=1000, wait_ms=0)
        assert len(page.seqs) == HELD
        answer = await asyncio.to_thread(_subscribe_as_learner, topology)
        assert isinstance(answer, fr.Subscribed), answer
        assert answer.last_seq == replica.store.last_seq
    finally:
        await node.stop()
