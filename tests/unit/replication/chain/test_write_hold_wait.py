"""A write that reaches a head during its write hold waits for the hold's end and then goes on,
instead of failing ``unavailable`` (docs/node-api.md, "Writes after a head change"): the
leader's word that shortens the hold lets it go at once, and a hold that runs out lets it go by
itself. In-process nodes on loopback over real stores; every wait is a bounded poll."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from kayos.node.runtime import Node
from tests.support.links import until
from tests.support.replicas import node_chain

pytestmark = pytest.mark.unit

SEED = 20261129  # the nodes' randomness is tests.support.replicas.SEED; nothing here draws
QUEUE = "q"
WAIT_S = 10.0  # the bound of every wait below


async def _produce(node: Node, key: bytes) -> tuple[int, int]:
    return await node.produce(QUEUE, [key], [b"v"], None, None, acks=-1)


@pytest.mark.asyncio
async def test_a_write_during_the_hold_waits_and_goes_on_when_the_hold_is_shortened(
    tmp_path: Path,
) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (_topology, nodes):
        head = nodes["a"].replicas[0]
        head.writes_held_until_s = head.clock.monotonic_s() + 3600  # far longer than any wait
        write = asyncio.create_task(_produce(nodes["a"], b"k1"))
        await until(lambda: head.writes_waiting_for_hold == 1, "the write waiting", WAIT_S)
        assert not write.done()
        head.writes_held_until_s = -math.inf  # the leader's word: nothing left of the hold
        first, last = await asyncio.wait_for(write, WAIT_S)
        assert first == last
        assert head.writes_waiting_for_hold == 0


@pytest.mark.asyncio
async def test_a_write_during_the_hold_goes_on_when_the_hold_runs_out(tmp_path: Path) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (_topology, nodes):
        head = nodes["a"].replicas[0]
        head.writes_held_until_s = head.clock.monotonic_s() + 0.2
        first, last = await asyncio.wait_for(_produce(nodes["a"], b"k1"), WAIT_S)
        assert first == last
        assert head.clock.monotonic_s() >= head.writes_held_until_s


@pytest.mark.asyncio
async def test_a_hold_shortened_but_not_over_keeps_the_write_waiting(tmp_path: Path) -> None:
    print("seed", SEED)
    async with node_chain(tmp_path) as (_topology, nodes):
        head = nodes["a"].replicas[0]
        head.writes_held_until_s = head.clock.monotonic_s() + 3600
        write = asyncio.create_task(_produce(nodes["a"], b"k1"))
        await until(lambda: head.writes_waiting_for_hold == 1, "the write waiting", WAIT_S)
        head.writes_held_until_s = head.clock.monotonic_s() + 1800  # shorter, not over
        await until(lambda: head.writes_waiting_for_hold == 1, "waiting again", WAIT_S)
        assert not write.done()
        head.writes_held_until_s = -math.inf
        await asyncio.wait_for(write, WAIT_S)
