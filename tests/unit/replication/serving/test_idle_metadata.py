"""METADATA (protocol version 6): an idle upstream sends its whole replicated map, so that a
replica whose rollback kept its metadata settles without a write (docs/replication-protocol.md,
"The metadata on an idle link"; end to end in
``test_a_rollback_that_kept_the_metadata_settles_on_an_idle_shard``). In-process nodes over real
stores and loopback links; a raw connection plays the downstream."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kayos import limits
from kayos.errors import ProtocolError
from kayos.node.marks import read_mark
from kayos.replication.link.sender import LinkSender, build_batch
from kayos.replication.link.upstream import check_idle_map, replace_meta
from kayos.replication.shard.local_meta import (
    LOCAL_META_PREFIXES,
    ROLLED_BACK_META_KEY,
    TAKEOVER_META_KEY,
)
from kayos.replication.shard.replica import ShardReplica
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from kayos.storage import Put, ShardStore
from kayos.topology import Topology
from tests.support.links import (
    TEST_IDENTITY,
    RawLink,
    RecordingStream,
    SenderReplica,
    answer_challenge,
    one_shard_topology,
    until,
)
from tests.support.replicas import (
    SEED,
    cut_middle,
    managed_chain,
    mark_2_held,
    node_chain,
    standalone_replica,
)

pytestmark = pytest.mark.unit

QUEUE = "q"
KEY = f"hwm/{QUEUE}/g"


def _subscribe_idle(topology: Topology, head: ShardReplica, version: int) -> list[fr.Frame]:
    """Subscribes to a as its tail b at ``version``, from the seq after a's last: the frames a
    sends after SUBSCRIBED, up to and including the first METADATA (or the PONG answering a
    PING sent once that many frames came, when ``version`` takes none)."""
    address = topology.nodes["a"]
    link = RawLink.open(address.host, address.bin_port)
    try:
        link.send(fr.Hello(version, "b", 0, topology.epoch, "tail"))
        claim = auth.LinkClaim("b", "a", 0, topology.epoch, "tail")
        assert isinstance(answer_challenge(link, TEST_IDENTITY, claim), fr.AuthOk)
        assert isinstance(link.next(), fr.HelloOk)
        link.send(fr.Subscribe(0, head.durable + 1, tuple(head.takeover_table()), 0))
        frames: list[fr.Frame] = []
        while True:
            frame = link.next()
            assert frame is not None, f"a closed the link after {frames}"
            if isinstance(frame, fr.Ping):
                link.send(fr.Pong(frame.nonce))
                continue
            frames.append(frame)
            if isinstance(frame, fr.Metadata | fr.Pong):
                return frames
            if isinstance(frame, fr.Subscribed) and version < fr.METADATA_PROTOCOL_VERSION_MIN:
                link.send(fr.Ping(1))
    finally:
        link.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(("version", "head_rolled_back"), [(5, False), (6, False), (6, True)])
async def test_an_idle_upstream_sends_its_map_to_a_version_6_peer_only(
    tmp_path: Path, version: int, head_rolled_back: bool
) -> None:
    """``head_rolled_back``: a's store holds the key ``rolled_back`` from a rollback it had as
    a member; a head's map is the shard's, so it still sends it."""
    async with node_chain(tmp_path, "ab") as (topology, nodes):
        await nodes["a"].produce(QUEUE, [b"k0"], [b"v0"], None, None, acks=-1)
        await nodes["a"].commit_group(QUEUE, "g", 1, None)
        await nodes["b"].stop()  # the raw connection plays b
        head = nodes["a"].replicas[0]
        if head_rolled_back:
            head.store.commit([], meta={ROLLED_BACK_META_KEY: 1})
            assert not head.map_unsettled()
        frames = await asyncio.to_thread(_subscribe_idle, topology, head, version)
        subscribed = frames[0]
        assert isinstance(subscribed, fr.Subscribed)
        assert subscribed.rollback_to is None
        sent = [f for f in frames if isinstance(f, fr.Metadata)]
        link = head.sending_links.get("b")
        if version < fr.METADATA_PROTOCOL_VERSION_MIN:
            # A version 5 peer never gets the frame it would refuse: the old behaviour.
            assert not sent
            assert link is None or not link.idle_map
            return
        assert sent == [fr.Metadata(0, head.durable, {KEY: read_mark(head, KEY)[0]})]
        assert not any(isinstance(f, fr.Batch) for f in frames)
        assert read_mark(head, KEY)[0] == 1


def test_a_map_not_as_of_the_last_seq_received_or_naming_a_local_key_is_refused() -> None:
    replica = cast(ShardReplica, SimpleNamespace(shard_id=0))
    check_idle_map(replica, fr.Metadata(0, 7, {KEY: 1}), 7)
    with pytest.raises(ProtocolError, match="as of 6, where shard 0 as of 7 was due"):
        check_idle_map(replica, fr.Metadata(0, 6, {KEY: 1}), 7)
    with pytest.raises(ProtocolError, match="METADATA of shard 1"):
        check_idle_map(replica, fr.Metadata(1, 7, {KEY: 1}), 7)
    with pytest.raises(ProtocolError, match="local to a replica: 'rolled_back'"):
        check_idle_map(replica, fr.Metadata(0, 7, {ROLLED_BACK_META_KEY: 3}), 7)


@pytest.mark.asyncio
async def test_the_map_replaces_the_replicated_keys_and_settles_a_rollback(
    tmp_path: Path,
) -> None:
    replica = standalone_replica(one_shard_topology(["h"]), tmp_path / "h")
    try:
        store = replica.store
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={KEY: 2, "hwm/q/gone": 5}, claim_seq=True)
        store.commit([], meta={ROLLED_BACK_META_KEY: store.last_seq})
        last, table = store.last_seq, store.meta.get(TAKEOVER_META_KEY)
        await replace_meta(replica, fr.Metadata(0, last, {KEY: 1}))
        assert replica.rolled_back_to() is None
        assert store.meta.get(KEY) == 1
        assert "hwm/q/gone" not in store.meta
        assert store.meta.get(TAKEOVER_META_KEY) == table  # local keys stay
        assert store.last_seq == last  # no seq claimed
        assert store.meta_written_at(KEY) <= last
    finally:
        replica.close()


class _RolledBack(SenderReplica):
    """A member whose rollback kept its metadata (``unsettled`` until its upstream replaced it)."""

    catching_up = False
    repairing = False
    unsettled = True

    def map_unsettled(self) -> bool:
        return self.unsettled

    def replicated_meta(self, name: str) -> bool:
        return not name.startswith(LOCAL_META_PREFIXES)


@pytest.mark.asyncio
async def test_a_member_whose_rollback_kept_its_map_sends_none_until_it_is_replaced(
    tmp_path: Path,
) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"a", b"x")])  # 1
        store.commit([], meta={KEY: 1}, claim_seq=True)  # 2
        nothing_remembered = build_batch(0, 99, 99, [], None)
        replica = _RolledBack(store, nothing_remembered)
        stream = RecordingStream()
        sender = LinkSender(replica, stream, 0, idle_map=True)  # type: ignore[arg-type]
        task = asyncio.create_task(sender.run())
        try:
            await until(lambda: sender.sent == 2, "the link sent through 2")
            # Read back without its map (it may hold marks of dropped seqs), and no METADATA.
            assert [(b.first_seq, b.last_seq, b.meta) for b in stream.sent] == [(1, 2, None)]
            replica.unsettled = False  # its upstream replaced its map
            replica.changed.notify()
            await until(lambda: len(stream.sent) == 2, "the map sent once settled")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert stream.sent[1] == fr.Metadata(0, 2, {KEY: 1})
        assert sender.meta_exact
    finally:
        store.close()


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
