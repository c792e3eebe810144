"""The fault proxy's stop (a disable, a delete) against a connection accepted just before it:
the listener had taken the connection, but its handler had not run yet when ``stop`` collected
the connections to cancel. Such a connection must be closed, not proxied, or the listener's
``wait_closed`` waits for it for ever (under load, ``test_fault_proxy``'s disable hung so)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from chaos.procs.proxy import Proxy

pytestmark = pytest.mark.chaos

# Far above what a loopback stop takes; it only trips on the hang.
STOP_TIMEOUT_S = 5.0


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.mark.asyncio
async def test_a_connection_whose_handler_runs_after_stop_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    accepted = asyncio.Event()
    release = asyncio.Event()
    original = Proxy.accept

    async def late_accept(self: Proxy, reader: Any, writer: Any) -> None:
        accepted.set()
        await release.wait()  # the handler held until stop has collected the connections
        await original(self, reader, writer)

    monkeypatch.setattr(Proxy, "accept", late_accept)
    port = upstream.sockets[0].getsockname()[1]
    proxy = Proxy("p", ("127.0.0.1", 0), ("127.0.0.1", port), random.Random(1))
    await proxy.start()
    reader, writer = await asyncio.open_connection(*proxy.listen)
    await asyncio.wait_for(accepted.wait(), STOP_TIMEOUT_S)
    stopping = asyncio.create_task(proxy.stop())
    for _ in range(1000):  # until stop has begun: it turns enabled off first, synchronously
        if not proxy.enabled:
            break
        await asyncio.sleep(0)
    assert not proxy.enabled
    release.set()
    await asyncio.wait_for(stopping, STOP_TIMEOUT_S)
    assert await asyncio.wait_for(reader.read(100), STOP_TIMEOUT_S) == b""  # closed, not proxied
    assert proxy.connections == set()
    writer.close()
    upstream.close()
    await upstream.wait_closed()
