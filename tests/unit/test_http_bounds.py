"""The HTTP face's time bounds without sockets: a body that never finishes arriving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.node.app import read_body


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
