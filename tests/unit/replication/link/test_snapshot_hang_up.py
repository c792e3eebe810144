"""The end of a link that served a store snapshot (kayos.replication.link.stream.until_hung_up):
the upstream reads, answering PINGs, until the learner hangs up, so that it never closes a socket
with the learner's PONGs unread (which resets the connection and loses the snapshot's tail)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kayos.errors import ProtocolError
from kayos.replication.link.stream import FrameStream, until_hung_up
from kayos.replication.wire import frames as fr

pytestmark = pytest.mark.unit


class _Stream:
    """Frames to read, then the peer's hang-up (None); what was sent."""

    def __init__(self, frames: list[Any]) -> None:
        self.frames = [*frames, None]
        self.sent: list[Any] = []

    async def recv(self) -> Any:
        return self.frames.pop(0)

    def send(self, frame: Any) -> int:
        self.sent.append(frame)
        return 0


def test_reads_answering_pings_until_the_learner_hangs_up() -> None:
    stream = _Stream([fr.Pong(1), fr.Ping(7), fr.Pong(2), fr.Ping(8)])
    asyncio.run(until_hung_up(cast(FrameStream, stream)))
    assert stream.frames == []  # read through the hang-up
    assert stream.sent == [fr.Pong(7), fr.Pong(8)]


def test_a_frame_other_than_ping_or_pong_after_the_end_is_refused() -> None:
    stream = _Stream([fr.Pong(1), fr.Subscribe(0, 1, (), 0)])
    with pytest.raises(ProtocolError, match="after a snapshot's end"):
        asyncio.run(until_hung_up(cast(FrameStream, stream)))
