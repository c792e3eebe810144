"""The server's connections (``kestrel_compat.server``) and eager requests
(``kestrel_compat.eager``): pipelined requests are answered in order, in one write when none waits
(docs/kestrel-compat.md §1, §11); a blocked GET holds back what was pipelined behind it; a client
that half-closes still gets its replies; an idle client is closed. In-process, on port 0."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from kestrel_compat.core.config import KestrelConfig, ServerConfig
from kestrel_compat.eager import Finished, start_eagerly
from kestrel_compat.server import KestrelServer
from kestrel_compat.wire.memcache_replies import END, STORED
from tests.support.kestrel import set_request, value

pytestmark = pytest.mark.unit

REPLY_S = 2.0


def server_config(**server: object) -> KestrelConfig:
    settings = {"port": 0, "text_port": None, "thrift_port": None, **server}
    return KestrelConfig(server=ServerConfig(**settings))  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(config: KestrelConfig) -> AsyncIterator[KestrelServer]:
    server = KestrelServer(config)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def read_exactly(reader: asyncio.StreamReader, size: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(size), REPLY_S)


# --- eager requests ---


@pytest.mark.asyncio
async def test_a_coroutine_that_never_waits_finishes_in_the_caller() -> None:
    async def answer() -> int:
        return 7

    assert start_eagerly(answer(), name="t") == Finished(7)


@pytest.mark.asyncio
async def test_a_coroutine_that_waits_goes_on_as_a_task() -> None:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[int] = loop.create_future()
    steps: list[str] = []

    async def waits() -> int:
        steps.append("before")
        got = await gate
        steps.append("after")
        return got + 1

    started = start_eagerly(waits(), name="t")
    assert isinstance(started, asyncio.Task)
    assert steps == ["before"]  # Ran in the caller up to the wait.
    gate.set_result(1)
    assert await started == 2
    assert steps == ["before", "after"]


@pytest.mark.asyncio
async def test_errors_and_cancellation_reach_the_coroutine() -> None:
    async def fails() -> None:
        raise KeyError("now")

    with pytest.raises(KeyError):
        start_eagerly(fails(), name="t")
    cleaned: list[bool] = []

    async def waits_forever() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            cleaned.append(True)

    started = start_eagerly(waits_forever(), name="t")
    assert isinstance(started, asyncio.Task)
    await asyncio.sleep(0)
    started.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started
    assert cleaned == [True]


# --- connections ---


@pytest.mark.asyncio
async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running(server_config()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        requests = set_request("q", b"a") + set_request("q", b"b") + b"get q\r\nget q\r\nget q\r\n"
        writer.write(requests)
        expected = STORED * 2 + value("q", b"a") + value("q", b"b") + END
        assert await read_exactly(reader, len(expected)) == expected
        writer.close()


@pytest.mark.asyncio
async def test_a_blocked_get_holds_back_what_follows_and_half_close_is_answered() -> None:
    async with running(server_config()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"get q/t=5000\r\nget r\r\n")
        with pytest.raises(TimeoutError):  # Nothing answered while the first request waits.
            await asyncio.wait_for(reader.read(1), 0.05)
        other_reader, other = await asyncio.open_connection("127.0.0.1", server.port)
        other.write(set_request("q", b"x"))
        other.write_eof()  # Half-closed: the reply still comes, then the server closes.
        assert await read_exactly(other_reader, len(STORED)) == STORED
        assert await asyncio.wait_for(other_reader.read(), REPLY_S) == b""
        other.close()
        expected = value("q", b"x") + END
        assert await read_exactly(reader, len(expected)) == expected
        writer.close()


@pytest.mark.asyncio
async def test_an_idle_client_is_closed() -> None:
    async with running(server_config(client_timeout_ms=50)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"get q\r\n")
        assert await read_exactly(reader, len(END)) == END
        assert await asyncio.wait_for(reader.read(), REPLY_S) == b""
        assert server.service.collection.stats.curr_connections == 0
        writer.close()
