"""Failed group commits are retried with a bounded exponential backoff (docs/kestrel-compat.md §10;
``limits.commit_retry_delay_ms_min``/``_max``): a removal confirmed while the backend fails reaches
it once the backend is back, even on a queue that never changes again, so a crash afterwards does
not serve the item a second time. Timers are a fake and the jitter a seeded RNG: nothing waits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from kestrel_compat import limits
from kestrel_compat.backends.memory import MemoryBackend
from kestrel_compat.backends.persister import Persister, commit_retry_delay_s
from kestrel_compat.core.persistence import GroupState
from kestrel_compat.wire.memcache_replies import END, STORED
from tests.support.kestrel import Harness, set_request, value

pytestmark = pytest.mark.unit

SEED = 5


class FakeTimer:
    def __init__(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.delay_s = delay_s
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimers:
    """Records the timers a persister starts; the test fires them."""

    def __init__(self) -> None:
        self.started: list[FakeTimer] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(delay_s, callback)
        self.started.append(timer)
        return timer

    def pending(self) -> list[FakeTimer]:
        return [timer for timer in self.started if not timer.cancelled]

    def fire(self) -> None:
        (timer,) = self.pending()
        timer.cancelled = True
        timer.callback()


def harness_with_timers(timers: FakeTimers) -> Harness:
    harness = Harness()
    service = harness.service
    service.persister = Persister(
        harness.backend,
        service.collection,
        rng=random.Random(SEED),
        call_later=timers.call_later,
    )
    return harness


def ceiling_s(retry: int) -> float:
    ceiling_ms = min(
        limits.commit_retry_delay_ms_max, limits.commit_retry_delay_ms_min << (retry - 1)
    )
    return ceiling_ms / 1000


def test_retry_delays_double_up_to_the_bound_with_jitter() -> None:
    rng = random.Random(SEED)
    for retry in range(1, 40):
        delay_s = commit_retry_delay_s(retry, rng)
        assert ceiling_s(min(retry, 30)) / 2 <= delay_s <= ceiling_s(min(retry, 30))
    assert commit_retry_delay_s(1000, rng) <= limits.commit_retry_delay_ms_max / 1000


@pytest.mark.asyncio
async def test_failed_commit_of_a_removal_is_retried_until_stored() -> None:
    timers = FakeTimers()
    harness = await harness_with_timers(timers).start()
    client = harness.client()
    assert await client.send(set_request("q", b"x")) == STORED
    assert timers.pending() == []
    # The removal's group commit fails: nothing will change q again, so only a retry stores it.
    harness.backend.fail_next = True
    assert await client.send(b"get q\r\n") == value("q", b"x")
    (first,) = timers.pending()
    assert ceiling_s(1) / 2 <= first.delay_s <= ceiling_s(1)
    # The first retry fails too (the outage goes on): the next waits up to twice as long.
    harness.backend.fail_next = True
    timers.fire()
    await harness.settle()
    (second,) = timers.pending()
    assert ceiling_s(2) / 2 <= second.delay_s <= ceiling_s(2)
    # The backend is back: the retry stores the removal and no further timer starts.
    timers.fire()
    await harness.settle()
    assert timers.pending() == []
    restarted = await harness.restart()
    assert await restarted.client().send(b"get q\r\n") == END


@pytest.mark.asyncio
async def test_no_retry_for_a_deleted_queue_or_after_close() -> None:
    timers = FakeTimers()
    harness = await harness_with_timers(timers).start()
    client = harness.client()
    await client.send(set_request("q", b"x") + set_request("r", b"y"))
    harness.backend.fail_next = True
    await client.send(b"get q\r\n")
    await client.send(b"delete q\r\n")
    timers.fire()  # q is gone: the retry commits nothing and starts no timer.
    await harness.settle()
    assert timers.pending() == []
    harness.backend.fail_next = True
    await client.send(b"get r\r\n")
    assert len(timers.pending()) == 1
    await harness.service.close()
    assert timers.pending() == []


class GatedBackend(MemoryBackend):
    """Group commits wait until ``gate`` is set: one can be held in flight."""

    completes_at_once = False

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0

    async def commit_group(self, log: str, group: str, state: GroupState) -> None:
        if not self.gate.is_set():
            self.held += 1
            await self.gate.wait()
        await super().commit_group(log, group, state)


async def turns_until(condition: Callable[[], bool]) -> None:
    """Turns of the event loop until ``condition`` holds (bounded; fails past the bound)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


@pytest.mark.asyncio
async def test_a_stop_writes_the_removals_confirmed_just_before_it() -> None:
    # The stop closes every queue before it drains the last group commits: a removal whose
    # commit was still queued (behind one in flight) must be written all the same, or the
    # restarted front serves it again.
    backend = GatedBackend()
    harness = await Harness(backend=backend).start()
    client = harness.client()
    assert await client.send(set_request("q", b"x") + set_request("q", b"y")) == STORED + STORED
    backend.gate.clear()
    # The first removal's commit is held; the second's queues behind it. (The harness's client
    # waits for every commit after a request, so the requests go in a task of their own.)
    first = client.start(b"get q\r\n")
    await turns_until(lambda: backend.held == 1)
    second = harness.client().start(b"get q\r\n")
    await turns_until(lambda: harness.service.collection.current_items() == 0)
    closing = asyncio.ensure_future(harness.service.close())
    backend.gate.set()
    await closing
    assert await first == value("q", b"x")
    assert await second == value("q", b"y")
    restarted = await harness.restart()
    assert await restarted.client().send(b"get q\r\n") == END
