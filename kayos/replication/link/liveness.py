"""Liveness of connections: PING every ``limits.ping_interval_ms``, and a peer silent past
``limits.peer_silence_ms_max`` is marked down and its connection closed; the per-link health that
``GET /v1/status`` and ``/metrics`` show (docs/replication-protocol.md, "Liveness")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kayos import limits
from kayos.clock import Clock
from kayos.replication.logic.latency import LatencyWindow
from kayos.replication.wire import frames as fr

log = logging.getLogger("kayos.replication")

Direction = Literal["upstream", "downstream"]


class HeardStream(Protocol):
    """A frame stream that knows when it last received bytes and since when it has been waiting
    for more (``clock.monotonic_s`` times; ``reading_since`` is None while it is not reading)."""

    heard_at: float
    reading_since: float | None
    # Told (time, ms) of each PING round trip, and of each wait for one (keep_alive).
    on_round_trip: Callable[[float, float], None] | None

    def send(self, frame: fr.Frame) -> int: ...

    def ping(self) -> int: ...

    def unanswered_since(self) -> float | None:
        """When the oldest PING not yet answered went out (None: every one was answered)."""
        ...

    def close(self) -> None: ...


def silent_for(stream: HeardStream, clock: Clock) -> float:
    """How long the peer has been silent while this side was reading. Time this side spends not
    reading (its own back-pressure, a rollback) does not count: the peer's bytes wait unread in
    the socket then, so they could not have been heard."""
    since = stream.reading_since
    if since is None:
        return 0.0
    return clock.monotonic_s() - max(stream.heard_at, since)


def note_waiting(stream: HeardStream, clock: Clock) -> None:
    """Tells the link's latency window how long its oldest unanswered PING has waited, counted
    only while this side reads (as ``silent_for``): a peer frozen outright answers nothing, so
    without this its round trips would show no sample at all and only the detection window
    would remove it; with it, each ping interval adds one sample as long as the wait, and the
    manager's slow rule sees it within its slow window (docs/node-api.md, "Latency")."""
    sent, since = stream.unanswered_since(), stream.reading_since
    if sent is None or since is None or stream.on_round_trip is None:
        return
    now = clock.monotonic_s()
    waited_s = now - max(sent, since)
    if waited_s > 0:
        stream.on_round_trip(now, waited_s * 1000)


async def keep_alive(stream: HeardStream, clock: Clock, describe: str) -> None:
    """Pings ``stream`` until it ends; closes it (and returns) once the peer has been silent past
    the bound; each round, an unanswered PING's wait is a latency sample (``note_waiting``). Run
    as a task beside the reader: closing the stream ends the reader's wait."""
    interval_s = limits.ping_interval_ms / 1000
    silence_s = limits.peer_silence_ms_max / 1000
    while True:
        await asyncio.sleep(interval_s)
        silent = silent_for(stream, clock)
        if silent > silence_s:
            log.warning(
                "%s: peer silent for %.1f s (bound %d ms): marked down, connection closed",
                describe,
                silent,
                limits.peer_silence_ms_max,
            )
            stream.close()
            return
        note_waiting(stream, clock)
        try:
            stream.ping()
        except Exception:  # the connection is gone already; its reader ends it
            return


@dataclass(slots=True)
class LinkHealth:
    """One link of one replica as this node sees it. ``peer_seq``: for a downstream, the highest
    seq it reported (ACK or COMMITTED); for the upstream, the highest seq it is known to hold."""

    peer: str
    direction: Direction
    stream: HeardStream | None = None
    heard_at: float | None = None
    peer_seq: int = 0
    # PING/PONG round trips and ACK delays on this link, in ms (GET /v1/status "latency").
    latency: LatencyWindow = field(default_factory=LatencyWindow)

    def attach(self, stream: HeardStream) -> None:
        self.stream = stream

    def detach(self, stream: HeardStream) -> None:
        if self.stream is stream:
            self.heard_at = stream.heard_at
            self.stream = None

    def heard(self, seq: int) -> None:
        self.peer_seq = max(self.peer_seq, seq)

    def status(self, own_durable: int, clock: Clock) -> dict[str, Any]:
        heard_at = self.stream.heard_at if self.stream is not None else self.heard_at
        if self.direction == "downstream":
            lag = max(0, own_durable - self.peer_seq)
        else:
            lag = max(0, self.peer_seq - own_durable)
        return {
            "peer": self.peer,
            "direction": self.direction,
            "up": self.stream is not None,
            "last_heard_s": None if heard_at is None else round(clock.monotonic_s() - heard_at, 3),
            "lag_entries": lag,
        }
