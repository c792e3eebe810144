"""A write waits for its shard's replica to be re-made instead of failing at once
(kayos/node/replicas/changing.py; docs/node-api.md, "Writes after a head change"). No clock,
no processes: the waits are bounded by ``asyncio.wait_for``."""

from __future__ import annotations

import asyncio

import pytest

from kayos.node.replicas.changing import ShardsChanging

pytestmark = pytest.mark.unit

WAIT_S = 10.0


@pytest.mark.asyncio
async def test_a_waiter_goes_on_once_the_change_is_over() -> None:
    changing = ShardsChanging()
    changing.add(3)
    assert 3 in changing
    assert 4 not in changing
    waiter = asyncio.create_task(changing.wait(3, WAIT_S))
    await asyncio.sleep(0)  # one turn of the loop: the waiter is parked on the event
    assert not waiter.done()
    changing.discard(3)
    await asyncio.wait_for(waiter, WAIT_S)
    assert 3 not in changing


@pytest.mark.asyncio
async def test_a_shard_not_changing_does_not_wait_and_a_long_change_times_out() -> None:
    changing = ShardsChanging()
    await asyncio.wait_for(changing.wait(1, WAIT_S), WAIT_S)  # nothing to wait for
    changing.add(1)
    changing.add(1)  # a second add keeps the one event
    await asyncio.wait_for(changing.wait(1, 0.01), WAIT_S)  # gives up, raises nothing
    assert 1 in changing
    changing.discard(1)
    changing.discard(1)  # a second discard changes nothing
    assert 1 not in changing
