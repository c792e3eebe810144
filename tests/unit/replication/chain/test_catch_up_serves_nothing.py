"""A replica in catch-up serves nobody: its store may hold part of an all-or-nothing batch (catch-up
sends only the newest version of each key), so a consume parked on it is refused, and its links
below close until it is whole again. In-process nodes on loopback; every wait is a bounded poll."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kayos import limits
from kayos.errors import UnavailableError
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from tests.support.links import TEST_IDENTITY, RawLink, answer_challenge, link_hello, until
from tests.support.replicas import SEED, WAIT_S, node_chain

pytestmark = pytest.mark.unit


@pytest.mark.asyncio
async def test_a_long_poll_parked_before_catch_up_serves_nothing_during_it(
    tmp_path: Path,
) -> None:
    """A replica in catch-up serves no consumers (its store may hold part of an all-or-nothing
    batch). A consume long-polling on the tail when a new link puts it in catch-up is woken by
    the catch-up's own commits: it must not read its page from the half-caught-up store."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (_, nodes):
        middle, tail = (nodes[n].replicas[0] for n in "bc")
        queue = "q"
        await nodes["a"].produce(queue, [b"k0"], [b"v"], None, None, acks=-1)
        await until(lambda: tail.durable >= 1 and not tail.catching_up, "the tail level")
        old_link = next(link for link in nodes["c"].links if link.replica is tail)
        old_link.stop()
        assert tail.upstream_stream is not None
        tail.upstream_stream.close()
        await until(lambda: tail.upstream_stream is None, "the tail's link down")
        poll = asyncio.create_task(
            nodes["c"].consume(queue, "g", after=tail.durable, upto=None, limit=10, wait_ms=20_000)
        )
        await until(lambda: tail.changed.waiting(), "the consume parked")
        # More than one catch-up BATCH: a frame holds at most batch_entries_max entries.
        count = limits.batch_entries_max // 2
        last = 0
        for part in range(3):
            keys = [f"{part}-{i}".encode() for i in range(count)]
            _, last = await nodes["a"].produce(queue, keys, [b"v"] * count, None, None, acks=1)
        await until(lambda: middle.durable >= last, "the middle ahead of the tail")
        link = UpstreamLink(tail)
        nodes["c"].links.append(link)
        nodes["c"].spawn(link.run())
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(poll, WAIT_S)


@pytest.mark.asyncio
async def test_a_replica_in_catch_up_feeds_no_link_below(tmp_path: Path) -> None:
    """Catch-up may split an all-or-nothing batch (it sends only the newest version of each key),
    so a middle in catch-up closes its links below and refuses new subscriptions until it is
    whole again; its tail keeps serving the consistent state it had."""
    print("seed", SEED)
    async with node_chain(tmp_path) as (topology, nodes):
        middle = nodes["b"].replicas[0]
        await until(lambda: "c" in middle.downstream_streams, "the tail linked")
        middle.catching_up = True
        middle.close_downstream_links()
        address = topology.nodes["b"]

        def subscribe_as_the_tail() -> list[fr.Frame | None]:
            link = RawLink.open(address.host, address.bin_port)
            try:
                link.send(link_hello("c", 0, topology.epoch, "tail"))
                claim = auth.LinkClaim("c", "b", 0, topology.epoch, "tail")
                accepted = answer_challenge(link, TEST_IDENTITY, claim)
                link.send(fr.Subscribe(0, 1, ()))
                return [accepted, link.next(), link.next()]
            finally:
                link.close()

        frames = await asyncio.to_thread(subscribe_as_the_tail)
        assert isinstance(frames[0], fr.AuthOk)
        assert isinstance(frames[1], fr.HelloOk)
        assert isinstance(frames[2], fr.ErrorFrame)
        assert frames[2].code == UnavailableError.code
        middle.catching_up = False
        await until(lambda: "c" in middle.downstream_streams, "the tail linked again")
