"""Link liveness without sockets: the pinger against a fake stream and a manual clock, and the
per-link health that status and metrics show."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from kayos import limits
from kayos.clock import ManualClock
from kayos.replication.link.liveness import LinkHealth, keep_alive
from kayos.replication.wire import frames as fr

pytestmark = pytest.mark.unit

SILENCE_S = limits.peer_silence_ms_max / 1000
# Real time the pinger may take to act: a few ping intervals on a busy machine.
WAIT_S = 10.0


@dataclass
class FakeStream:
    heard_at: float
    # Reading since long ago: silence counts from heard_at.
    reading_since: float | None = float("-inf")
    sent: list[fr.Frame] = field(default_factory=list)
    closed: bool = False
    ping_nonce: int = 0
    pinged_at: dict[int, float] = field(default_factory=dict)
    clock: ManualClock | None = None
    on_round_trip: Callable[[float, float], None] | None = None

    def send(self, frame: fr.Frame) -> int:
        assert not self.closed
        self.sent.append(frame)
        return 1

    def ping(self) -> int:
        self.ping_nonce += 1
        self.send(fr.Ping(self.ping_nonce))
        if self.clock is not None:
            self.pinged_at[self.ping_nonce] = self.clock.monotonic_s()
        return self.ping_nonce

    def unanswered_since(self) -> float | None:
        return min(self.pinged_at.values()) if self.pinged_at else None

    def close(self) -> None:
        self.closed = True


async def until(condition: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not callable(condition) or not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)  # a bounded poll of a condition


@pytest.mark.asyncio
async def test_pings_a_live_peer_and_closes_a_silent_one() -> None:
    clock = ManualClock()
    stream = FakeStream(heard_at=clock.monotonic_s())
    task = asyncio.create_task(keep_alive(stream, clock, "test link"))
    try:
        await until(lambda: len(stream.sent) >= 2, "two pings")
        nonces = [frame.nonce for frame in stream.sent if isinstance(frame, fr.Ping)]
        assert nonces == sorted(set(nonces)), "nonces grow strictly"
        # Heard from just inside the bound: still up.
        clock.advance(SILENCE_S - 0.1)
        await until(lambda: len(stream.sent) >= len(nonces) + 1, "a ping inside the bound")
        assert not stream.closed
        # Silent past the bound: closed, and the pinger ends.
        clock.advance(0.2)
        await asyncio.wait_for(task, WAIT_S)
        assert stream.closed
    finally:
        task.cancel()


@pytest.mark.asyncio
async def test_a_peer_heard_again_stays_up() -> None:
    clock = ManualClock()
    stream = FakeStream(heard_at=clock.monotonic_s())
    task = asyncio.create_task(keep_alive(stream, clock, "test link"))
    try:
        for _ in range(3):
            clock.advance(SILENCE_S - 0.5)
            stream.heard_at = clock.monotonic_s()  # bytes came in
            sent = len(stream.sent)
            await until(lambda sent=sent: len(stream.sent) > sent, "the next ping")
        assert not stream.closed
    finally:
        task.cancel()


def test_link_health_status() -> None:
    clock = ManualClock()
    down = LinkHealth("b", "downstream")
    assert down.status(10, clock) == {
        "peer": "b",
        "direction": "downstream",
        "up": False,
        "last_heard_s": None,
        "lag_entries": 10,
    }
    stream = FakeStream(heard_at=clock.monotonic_s())
    down.attach(stream)
    down.heard(7)
    down.heard(4)  # reports never move it back
    clock.advance(1.5)
    assert down.status(10, clock)["up"] is True
    assert down.status(10, clock)["lag_entries"] == 3
    assert down.status(10, clock)["last_heard_s"] == 1.5
    down.detach(stream)
    clock.advance(2.0)
    status = down.status(10, clock)
    assert status["up"] is False
    assert status["last_heard_s"] == 3.5
    up = LinkHealth("a", "upstream")
    up.heard(25)
    assert up.status(20, clock)["lag_entries"] == 5
    assert up.status(30, clock)["lag_entries"] == 0


@pytest.mark.asyncio
async def test_silence_counts_only_while_this_side_reads() -> None:
    """Time this side spends not reading (its own back-pressure, a rollback) is not the peer's
    silence; once it reads again the peer has the whole bound from then."""
    clock = ManualClock()
    stream = FakeStream(heard_at=clock.monotonic_s(), reading_since=None)
    task = asyncio.create_task(keep_alive(stream, clock, "test link"))
    try:
        clock.advance(10 * SILENCE_S)  # not reading, for far longer than the bound
        sent = len(stream.sent)
        await until(lambda: len(stream.sent) > sent, "a ping while not reading")
        assert not stream.closed
        stream.reading_since = clock.monotonic_s()  # reads again, hears nothing
        clock.advance(SILENCE_S - 0.1)
        sent = len(stream.sent)
        await until(lambda: len(stream.sent) > sent, "a ping inside the bound")
        assert not stream.closed
        clock.advance(0.2)
        await asyncio.wait_for(task, WAIT_S)
        assert stream.closed
    finally:
        task.cancel()


@pytest.mark.asyncio
async def test_a_frozen_peer_shows_its_wait_as_latency_samples() -> None:
    """A peer that answers no PING gives no round trip: the pinger adds, each round, how long the
    oldest unanswered one has waited while this side read, so the manager's slow rule sees a
    frozen node before the detection window; a wait while this side did not read is not the
    peer's."""
    clock = ManualClock()
    stream = FakeStream(heard_at=clock.monotonic_s(), reading_since=clock.monotonic_s())
    stream.clock = clock
    samples: list[tuple[float, float]] = []
    stream.on_round_trip = lambda at, ms: samples.append((at, ms))
    task = asyncio.create_task(keep_alive(stream, clock, "test link"))
    try:
        await until(lambda: stream.ping_nonce >= 1, "the first ping")
        assert samples == []  # nothing waited yet when it went out
        clock.advance(0.4)
        stream.heard_at = clock.monotonic_s()  # bytes, but no PONG
        await until(lambda: stream.ping_nonce >= 2, "the second ping")
        assert samples[-1][1] == pytest.approx(400.0)
        clock.advance(0.4)
        stream.heard_at = clock.monotonic_s()
        await until(lambda: stream.ping_nonce >= 3, "the third ping")
        assert samples[-1][1] == pytest.approx(800.0)  # from the oldest unanswered one
        stream.pinged_at.clear()  # every PONG read
        count = len(samples)
        clock.advance(0.4)
        stream.heard_at = clock.monotonic_s()
        await until(lambda: stream.ping_nonce >= 4, "the fourth ping")
        assert len(samples) == count
        # Waiting while this side does not read: not counted until it reads again.
        stream.reading_since = None
        clock.advance(0.4)
        stream.heard_at = clock.monotonic_s()
        await until(lambda: stream.ping_nonce >= 5, "the fifth ping")
        assert len(samples) == count
        stream.reading_since = clock.monotonic_s()
        clock.advance(0.3)
        stream.heard_at = clock.monotonic_s()
        await until(lambda: stream.ping_nonce >= 6, "the sixth ping")
        assert samples[-1][1] == pytest.approx(300.0)
    finally:
        task.cancel()
