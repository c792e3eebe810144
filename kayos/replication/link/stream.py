"""What both sides of a replication link share: frames over a stream, wake-ups, error frames.

``FrameStream`` (frames over an asyncio stream pair, with the PINGs and CONFIRMs it keeps count
of), ``Pulse`` (wakes every waiter of a condition), the helpers that read past PINGs or surface
the other direction's failure, and error frames. None of it is one replica's state: the replica
(``kayos.replication.shard.replica``), the link sides (``upstream``, ``downstream``), the snapshot
link and the node use it alike. See docs/replication-protocol.md for the frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

from kayos import limits
from kayos.clock import Clock, SystemClock
from kayos.errors import KayosError, ProtocolError, WrongRoleError, error_from_code
from kayos.replication.wire import frames as fr

# A link's PINGs awaiting their PONG that are remembered (each PING is timed until answered).
_PINGS_UNANSWERED_MAX = 64


class Pulse:
    """Wakes every waiter on ``notify``; waiters re-check their condition. Each waiter has a
    future of its own, so cancelling one wait never disturbs another."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def waiter(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return future

    def waiting(self) -> int:
        """How many waits are parked until the next ``notify`` (cancelled ones included)."""
        return len(self._waiters)


class FrameStream:
    """Frames over an asyncio stream pair: ``send`` encodes and writes, ``recv`` decodes."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        clock: Clock | None = None,
        *,
        frame_bytes_max: int = limits.frame_bytes_max,
    ) -> None:
        self.reader = reader
        self.writer = writer
        # When bytes last came in (the clock's monotonic time): liveness closes a silent link.
        self.clock = clock or SystemClock()
        self.heard_at = self.clock.monotonic_s()
        # Since when this side has been waiting for bytes (None while it is not reading): time
        # spent not reading, on its own work or back-pressure, is not the peer's silence.
        self.reading_since: float | None = None
        self._decoder = fr.FrameDecoder(frame_bytes_max=frame_bytes_max)
        # The protocol version frames are encoded and decoded at: the newest, unless a client
        # connection's handshake picked an older one (``use_protocol_version``).
        self.protocol_version = fr.PROTOCOL_VERSION
        self._ready: list[fr.Frame] = []
        # PINGs sent and not yet answered, by nonce: when each went out. Told each round trip
        # in ms when its PONG is read (a link's latency window).
        self._pinged: dict[int, float] = {}
        self.on_round_trip: Callable[[float, float], None] | None = None
        # Seconds spent decoding received bytes (a copy link's throttle counts its work).
        self.decode_s = 0.0
        # The last PING nonce sent and the highest PONG nonce read: nonces grow per connection,
        # so a PONG at or past a nonce answers every PING up to it.
        self.ping_nonce = 0
        self.pong_nonce = 0
        # CONFIRMs (docs/replication-protocol.md, "Confirming a snapshot"): the last nonce sent and
        # when, and the highest nonces answered held and not held (a later answer covers every
        # earlier CONFIRM: the peer answers only on what happened after it received its one).
        self.confirm_nonce = 0
        self.confirm_sent_s = 0.0
        self.held_nonce = 0
        self.refused_nonce = 0

    def unanswered_since(self) -> float | None:
        return min(self._pinged.values()) if self._pinged else None

    def ping(self) -> int:
        """Sends a PING with the next nonce and returns that nonce."""
        self.ping_nonce += 1
        self.send(fr.Ping(self.ping_nonce))
        return self.ping_nonce

    def confirm(self, since_s: float) -> int:
        """The nonce of a CONFIRM sent at or after ``since_s`` (monotonic) and not yet answered,
        sending a new one if there is none."""
        pending = self.confirm_nonce > max(self.held_nonce, self.refused_nonce)
        if not (pending and self.confirm_sent_s >= since_s):
            self.confirm_nonce += 1
            self.confirm_sent_s = self.clock.monotonic_s()
            self.send(fr.Confirm(self.confirm_nonce))
        return self.confirm_nonce

    def confirmed(self, nonce: int) -> bool | None:
        """The answer to CONFIRM ``nonce``: held, not held, or None while none has come."""
        if self.held_nonce >= nonce:
            return True
        if self.refused_nonce >= nonce:
            return False
        return None

    def lift_frame_bound(self) -> None:
        """The full ``limits.frame_bytes_max`` from now on: the handshake is done."""
        self._decoder.frame_bytes_max = limits.frame_bytes_max

    def use_protocol_version(self, version: int) -> None:
        """Frames are encoded and decoded at ``version`` from now on (the version a client
        connection's handshake picked: docs/replication-protocol.md, "Handshake")."""
        self._decoder.protocol_version = version
        self.protocol_version = version

    def send(self, frame: fr.Frame) -> int:
        if type(frame) is fr.Ping:
            if len(self._pinged) >= _PINGS_UNANSWERED_MAX:
                self._pinged.clear()  # a peer that answers none: nothing to measure
            self._pinged[frame.nonce] = self.clock.monotonic_s()
        data = fr.encode(frame, self.protocol_version)
        self.writer.write(data)
        return len(data)

    async def drain(self) -> None:
        await self.writer.drain()

    async def recv(self) -> fr.Frame | None:
        """The next frame, or None at a clean end of stream."""
        while not self._ready:
            self.reading_since = self.clock.monotonic_s()
            try:
                data = await self.reader.read(256 * 1024)
            finally:
                self.reading_since = None
            if not data:
                if self._decoder.buffered_bytes:
                    raise ProtocolError("stream ended inside a frame")
                return None
            self.heard_at = self.clock.monotonic_s()
            started = time.perf_counter()
            self._ready.extend(self._decoder.feed(data))
            self.decode_s += time.perf_counter() - started
            self._ready.reverse()
        frame = self._ready.pop()
        if type(frame) is fr.Pong:
            self.pong_nonce = max(self.pong_nonce, frame.nonce)
        elif type(frame) is fr.Confirmed:
            if frame.held:
                self.held_nonce = max(self.held_nonce, frame.nonce)
            else:
                self.refused_nonce = max(self.refused_nonce, frame.nonce)
        if type(frame) is fr.Pong and self._pinged:
            sent = self._pinged.pop(frame.nonce, None)
            if sent is not None and self.on_round_trip is not None:
                now = self.clock.monotonic_s()
                self.on_round_trip(now, (now - sent) * 1000)
        return frame

    def buffered(self) -> bool:
        """Frames decoded and not yet returned, or bytes of one begun: the next frame is read
        with ``recv``, not from ``reader`` directly (as a store copy reads its chunks)."""
        return bool(self._ready) or self._decoder.buffered_bytes > 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def recv_or_companion_failure(
    stream: FrameStream, companion: asyncio.Task[None]
) -> fr.Frame | None:
    """The next frame. ``companion`` (the task working the other direction of the link) closes
    the stream when it ends, which ends this read: then its exception is raised, if it had one."""
    frame = await stream.recv()
    if frame is None and companion.done() and not companion.cancelled():
        error = companion.exception()
        if error is not None:
            raise error
    return frame


async def recv_answering_pings(stream: FrameStream) -> fr.Frame | None:
    """The next frame other than PING (answered) and PONG: both sides ping from HELLO_OK on,
    so pings may come before SUBSCRIBE and SUBSCRIBED."""
    while True:
        frame = await stream.recv()
        if isinstance(frame, fr.Ping):
            stream.send(fr.Pong(frame.nonce))
        elif not isinstance(frame, fr.Pong):
            return frame


async def until_hung_up(stream: FrameStream) -> None:
    """Reads (answering PINGs) until the peer hangs up, or a liveness check closes a peer silent
    for too long: how the side that sent a whole store snapshot ends its link. Closing at once
    would leave the peer's PONGs unread here, and a socket closed with bytes unread is reset: the
    snapshot's last chunks, still in flight or not yet read by a learner slower than the link,
    would be lost with it and the copy fail (docs/replication-protocol.md, "Store snapshots")."""
    while (frame := await recv_answering_pings(stream)) is not None:
        raise ProtocolError(f"unexpected {type(frame).__name__} after a snapshot's end")


def close_with(stream: FrameStream) -> Callable[[asyncio.Task[None]], None]:
    """A done-callback for the task working one direction of a link: closes ``stream`` when the
    task ends, which ends the other direction's read (``recv_or_companion_failure``)."""

    def close(_: asyncio.Task[None]) -> None:
        stream.close()

    return close


def error_frame(exc: KayosError, request_id: int | None, epoch: int) -> fr.ErrorFrame:
    redirect = exc.redirect if isinstance(exc, WrongRoleError) else None
    return fr.ErrorFrame(request_id, exc.code, str(exc)[:1000] or exc.code, redirect, epoch)


def raise_error_frame(frame: fr.ErrorFrame) -> None:
    raise error_from_code(frame.code, frame.message, redirect=frame.redirect, epoch=frame.epoch)


class SendingLink(Protocol):
    """What a replica uses of the sending side of one of its links below
    (``kayos.replication.link.sender.LinkSender``, which imports this module)."""

    closed: bool

    def offer(self, batch: fr.Batch) -> None: ...
