"""The HTTP face's time bounds without sockets: a body that never finishes arriving."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.node.http.bodies import read_body

pytestmark = pytest.mark.unit


class TrickledRequest:
    """A request whose headers came but whose body never finishes."""

    content_type = "application/json"

    async def read(self) -> bytes:
        await asyncio.Event().wait()  # never set: the rest of the body never comes
        return b""


@pytest.mark.asyncio
async def test_a_body_that_never_finishes_is_refused_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "http_body_read_ms_max", 50)
    request: Any = TrickledRequest()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(InvalidRequest, match="not received within 50 ms"):
        await asyncio.wait_for(read_body(request), 10.0)
    assert loop.time() - started < 5.0


class ReadRequest:
    """A request whose whole body is there."""

    content_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body


@pytest.mark.asyncio
async def test_large_bodies_are_parsed_off_the_event_loop_and_off_the_commit_pool() -> None:
    """A body over ``http_body_inline_parse_bytes_max`` is parsed and converted in a parse thread
    (the event loop keeps answering peers' pings meanwhile); a small one on the loop."""
    loop_thread = threading.current_thread().name
    big = json.dumps({"messages": [{"value": "v" * 1000}] * 2000}).encode()
    assert len(big) > limits.http_body_inline_parse_bytes_max
    for body, expected in ((b'{"messages": []}', loop_thread), (big, "kayos-parse")):
        seen: list[str] = []

        def convert(parsed: Any, seen: list[str] = seen) -> Any:
            seen.append(threading.current_thread().name)
            return parsed

        request: Any = ReadRequest(body)
        assert await read_body(request, convert) == json.loads(body)
        assert seen[0].startswith(expected), seen
