"""The Kestrel front in-process for tests: clients without sockets, and thrift values read back.

Each ``Client`` feeds request bytes through a real ``MemcacheConnection`` and serves the events
through a real ``Session``, collecting the exact reply bytes; time is a ``ManualClock`` for items
and expiry (blocked fetches still wait on the event loop, with small bounds). ``read_value``
decodes a thrift value with Apache Thrift's own protocol, the independent peer of the front's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TType

from kayos.clock import ManualClock
from kestrel_compat.backends.memory import MemoryBackend
from kestrel_compat.core.config import (
    KestrelConfig,
    QueueBuilder,
    QueueConfig,
    QueueSettings,
    ServerConfig,
)
from kestrel_compat.sessions.memcache_session import Session
from kestrel_compat.sessions.service import KestrelService
from kestrel_compat.sessions.session_base import ClientGone
from kestrel_compat.wire.memcache_codec import MemcacheConnection

CLOSED = b"<closed>"


def make_config(
    *,
    server: dict[str, Any] | None = None,
    default: dict[str, Any] | None = None,
    queues: dict[str, dict[str, Any]] | None = None,
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> KestrelConfig:
    from kestrel_compat.core.config import AliasConfig

    settings = QueueSettings(
        default=QueueBuilder(default or {}).resolve(QueueConfig()),
        queues={name: QueueBuilder(values) for name, values in (queues or {}).items()},
        aliases={name: AliasConfig(dests) for name, dests in (aliases or {}).items()},
    )
    return KestrelConfig(server=ServerConfig(**(server or {})), queues=settings)


class Harness:
    def __init__(
        self,
        config: KestrelConfig | None = None,
        *,
        backend: MemoryBackend | None = None,
        clock: ManualClock | None = None,
    ) -> None:
        self.clock = clock or ManualClock()
        self.backend = backend or MemoryBackend()
        self.config = config or KestrelConfig()
        self.shutdowns = 0
        self.service = KestrelService(
            self.config, self.backend, self.clock, on_shutdown=self._on_shutdown
        )

    def _on_shutdown(self) -> None:
        self.shutdowns += 1

    async def start(self) -> Harness:
        await self.service.start()
        return self

    def client(self) -> Client:
        return Client(self)

    async def settle(self) -> None:
        await self.service.persister.drain()

    async def restart(self) -> Harness:
        """A new server on the same stored data (what a crash leaves: no open-read state)."""
        await self.settle()
        self.backend.reopen()
        config = dataclasses.replace(self.config)
        return await Harness(config, backend=self.backend, clock=self.clock).start()


class Client:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.session = Session(harness.service)
        self.codec = MemcacheConnection()
        self.closed = False

    async def send(self, data: bytes) -> bytes:
        """Serve every request in ``data``; the replies, plus ``<closed>`` if the server closed."""
        assert not self.closed, "this client's connection is closed"
        out = bytearray()

        async def write(reply: bytes) -> None:
            out.extend(reply)

        for event in self.codec.receive_data(data):
            try:
                close = await self.session.handle(event, write)
            except ClientGone:
                close = True
            if close:
                self.disconnect()
                out.extend(CLOSED)
                break
        await self.harness.settle()
        return bytes(out)

    def start(self, data: bytes) -> asyncio.Task[bytes]:
        """Send without waiting for the reply (a blocked fetch)."""
        return asyncio.get_running_loop().create_task(self.send(data))

    def disconnect(self) -> None:
        if not self.closed:
            self.closed = True
            self.session.client_left()
            self.session.finish()


async def wait_until(predicate: Any, *, timeout_s: float = 2.0) -> None:
    """Yield to the loop until ``predicate()`` holds; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def value(queue: str, data: bytes) -> bytes:
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue.encode(), len(data), data)


def set_request(queue: str, data: bytes, exptime: int = 0, flags: int = 0) -> bytes:
    return b"set %s %d %d %d\r\n%s\r\n" % (queue.encode(), flags, exptime, len(data), data)


def stats_dict(reply: bytes) -> dict[str, str]:
    assert reply.endswith(b"END\r\n")
    result: dict[str, str] = {}
    for line in reply.decode("latin-1").split("\r\n"):
        if line.startswith("STAT "):
            _, name, rest = line.split(" ", 2)
            result[name] = rest
    return result


async def start_blocked(client: Client, request: bytes, *, queue: str = "q") -> asyncio.Task[bytes]:
    """Send a fetch that will block, and return once it is registered as a waiter on ``queue``."""
    collection = client.harness.service.collection
    before = collection.queues[queue].waiter_count if queue in collection.queues else 0
    task = client.start(request)
    await wait_until(lambda: queue in collection.queues)
    await wait_until(lambda: collection.queues[queue].waiter_count == before + 1)
    return task


def read_value(proto: TBinaryProtocol, ttype: int) -> Any:
    """A value of ``ttype`` read with Apache Thrift's protocol; a struct as {field id: value}."""
    if ttype == TType.STRING:
        return proto.readBinary()
    if ttype == TType.I32:
        return proto.readI32()
    if ttype == TType.I64:
        return proto.readI64()
    if ttype == TType.LIST:
        element, size = proto.readListBegin()
        return [read_value(proto, element) for _ in range(size)]
    assert ttype == TType.STRUCT
    proto.readStructBegin()
    fields: dict[int, Any] = {}
    while True:
        _, field_type, field_id = proto.readFieldBegin()
        if field_type == TType.STOP:
            return fields
        fields[field_id] = read_value(proto, field_type)
