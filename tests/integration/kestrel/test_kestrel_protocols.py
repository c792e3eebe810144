"""The Kestrel front's text (spec §10) and thrift (spec §11) protocols as a real process on
ephemeral loopback ports: a raw-socket text session with exact bytes, and Apache Thrift's own
client (TSocket, TFramedTransport, TBinaryProtocol) doing put/get/confirm; all three protocols
see the same queues. Every wait is bounded."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport.TSocket import TSocket
from thrift.transport.TTransport import TFramedTransport

from tests.support.kestrel import read_value
from tests.support.kestrel_front import REPLY_S, STARTUP_S, closed_by_server, read_exactly
from tests.support.kestrel_front import KestrelProcess as MemcacheProcess
from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.integration

_LISTENING = re.compile(rb"kestrel (?:(text|thrift) )?listening on [^:]+:(\d+)\n")


class KestrelProcess(MemcacheProcess):
    """``python -m kestrel_compat`` with all three protocols on ports the kernel picks."""

    def __init__(self, tmp_path: Path) -> None:  # Not the parent's: other arguments, all ports.
        self.host = "127.0.0.1"
        command = [
            sys.executable, "-m", "kestrel_compat", "--host", self.host,
            "--port", "0", "--text-port", "0", "--thrift-port", "0",
        ]  # fmt: skip
        self._log = open(tmp_path / "kestrel.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self._log, env=dict(os.environ)
        )
        self.ports = self._read_ports()

    def _read_ports(self) -> dict[str, int]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + STARTUP_S
        ports: dict[str, int] = {}
        pending = b""
        while len(ports) < 3:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not report its ports in time"
            ready, _, _ = select.select([self.process.stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.process.stdout.fileno(), 1024)
            assert chunk, "the server exited before listening"
            pending += chunk
            for front, port in _LISTENING.findall(pending):
                ports[(front or b"memcache").decode()] = int(port)
        return ports

    def connect(self, front: str = "memcache") -> socket.socket:
        return socket.create_connection((self.host, self.ports[front]), timeout=REPLY_S)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KestrelProcess]:
    process = KestrelProcess(tmp_path)
    try:
        yield process
    finally:
        process.close()


def exchange(sock: socket.socket, request: bytes, expected: bytes) -> bytes:
    """Send ``request``; read as many bytes as ``expected`` holds (or EOF), within REPLY_S."""
    sock.sendall(request)
    return read_exactly(sock, len(expected))


# --- text protocol -------------------------------------------------------------------------------


def test_text_session_exact_bytes(server: KestrelProcess) -> None:
    """§10: put, get (opening), confirm by the next get, peek, monitor, status, version, quit."""
    with server.connect("text") as sock:
        for request, reply in [
            (b"put q:\nfirst\nsecond\nthird\n\n", b"+3\n"),
            (b"get q\n", b":first\n"),
            (b"get q 100\n", b":second\n"),
            (b"peek q\n", b":third\n"),
            (b"monitor q 100\n", b":third\n*\n"),
            (b"confirm q 1\n", b"+1\n"),
            (b"confirm q 1\n", b"-Not that many transactions open.\n"),
            (b"get q 50\n", b"*\n"),
            (b"status\n", b":UP\n"),
            (b"version\n", b":2.4.1\n"),
            (b"bogus\n", b"-Unknown command: bogus\n"),
            (b"flush q\n", b"+0\n"),
            (b"delete q\n", b"+0\n"),
        ]:
            assert exchange(sock, request, reply) == reply, request
        sock.sendall(b"quit\n")
        assert closed_by_server(sock)


def test_text_disconnect_aborts_and_memcache_sees_it(server: KestrelProcess) -> None:
    """§10, §3.4: a text read open at disconnect goes back to the head, where memcache reads it."""
    with server.connect("text") as sock:
        assert exchange(sock, b"put shared:\nitem\n\n", b"+1\n") == b"+1\n"
        assert exchange(sock, b"get shared\n", b":item\n") == b":item\n"
    with server.connect("memcache") as sock:
        # A blocked GET is woken by the abort the server makes when it sees the close.
        reply = b"VALUE shared 0 4\r\nitem\r\nEND\r\n"
        assert exchange(sock, b"get shared/t=3000\r\n", reply) == reply


# --- thrift --------------------------------------------------------------------------------------


class ThriftClient:
    """Calls of ``service Kestrel`` built at runtime with Apache Thrift's protocol classes."""

    def __init__(self, host: str, port: int) -> None:
        self.socket = TSocket(host, port)
        self.socket.setTimeout(REPLY_S * 1000)
        self.transport = TFramedTransport(self.socket)
        self.protocol = TBinaryProtocol(self.transport)
        self.transport.open()
        self.seqid = 0

    def close(self) -> None:
        self.transport.close()

    def call(self, method: str, fields: list[tuple[int, int, Any]]) -> Any:
        self.seqid += 1
        proto = self.protocol
        proto.writeMessageBegin(method, TMessageType.CALL, self.seqid)
        proto.writeStructBegin(f"{method}_args")
        for field_id, ttype, value in fields:
            proto.writeFieldBegin("arg", ttype, field_id)
            if ttype == TType.STRING:
                proto.writeString(value)
            elif ttype == TType.I32:
                proto.writeI32(value)
            else:
                element, values = value
                begin = proto.writeListBegin if ttype == TType.LIST else proto.writeSetBegin
                begin(element, len(values))
                for item in values:
                    proto.writeBinary(item) if element == TType.STRING else proto.writeI64(item)
            proto.writeFieldEnd()
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeMessageEnd()
        self.transport.flush()
        name, message_type, seqid = proto.readMessageBegin()
        assert (name, seqid) == (method, self.seqid)
        if message_type == TMessageType.EXCEPTION:
            error = TApplicationException()
            error.read(proto)
            proto.readMessageEnd()
            raise error
        result = read_value(proto, TType.STRUCT)
        proto.readMessageEnd()
        return result.get(0)

    # The methods of kestrel.thrift used here.

    def put(self, queue: str, items: list[bytes], expiration_msec: int = 0) -> int:
        return int(
            self.call(
                "put",
                [
                    (1, TType.STRING, queue),
                    (2, TType.LIST, (TType.STRING, items)),
                    (3, TType.I32, expiration_msec),
                ],
            )
        )

    def get(
        self, queue: str, max_items: int, timeout_msec: int = 0, auto_abort_msec: int = 0
    ) -> list[tuple[bytes, int]]:
        fields = [
            (1, TType.STRING, queue),
            (2, TType.I32, max_items),
            (3, TType.I32, timeout_msec),
            (4, TType.I32, auto_abort_msec),
        ]
        return [(item[1], item[2]) for item in self.call("get", fields)]

    def confirm(self, queue: str, ids: list[int]) -> int:
        return int(
            self.call("confirm", [(1, TType.STRING, queue), (2, TType.SET, (TType.I64, ids))])
        )

    def peek(self, queue: str) -> dict[int, Any]:
        result: dict[int, Any] = self.call("peek", [(1, TType.STRING, queue)])
        return result


@pytest.fixture
def thrift_client(server: KestrelProcess) -> Iterator[ThriftClient]:
    client = ThriftClient(server.host, server.ports["thrift"])
    try:
        yield client
    finally:
        client.close()


def test_thrift_put_get_confirm(server: KestrelProcess, thrift_client: ThriftClient) -> None:
    """§11 with Apache Thrift's client: put, reliable get with ids, confirm, plain get."""
    client = thrift_client
    assert client.put("jobs", [b"one", b"two", b"three"]) == 3
    assert client.get("jobs", 1, 0, 30_000) == [(b"one", 1)]
    assert client.get("jobs", 5, 0, 30_000) == []  # maxOpenTransactions 1 per connection
    assert client.confirm("jobs", [1, 42]) == 1
    assert client.get("jobs", 5) == [(b"two", 0), (b"three", 0)]
    assert client.get("jobs", 1, 100) == []
    info = client.peek("jobs")
    assert 1 not in info  # no head item
    assert (info[2], info[3], info[6], info[7]) == (0, 0, 0, 0)
    assert client.call("get_version", []) == b"2.4.1"
    assert client.call("current_status", []) == 3
    with pytest.raises(TApplicationException) as raised:
        client.call("nope", [])
    assert raised.value.type == TApplicationException.UNKNOWN_METHOD
    assert client.put("jobs", [b"after"]) == 1  # The connection is still in step.


def test_thrift_reads_survive_disconnect(server: KestrelProcess) -> None:
    """§11: a thrift open read outlives its connection; another connection confirms it by id."""
    first = ThriftClient(server.host, server.ports["thrift"])
    assert first.put("q", [b"kept"]) == 1
    [(data, read_id)] = first.get("q", 1, 0, 60_000)
    assert data == b"kept"
    first.close()
    second = ThriftClient(server.host, server.ports["thrift"])
    try:
        deadline = time.monotonic() + REPLY_S
        while second.peek("q")[7] != 1:  # open_transactions, once the server saw the close
            assert time.monotonic() < deadline
            time.sleep(0.02)  # a bounded poll of a condition
        assert second.get("q", 1) == []
        assert second.confirm("q", [read_id]) == 1
        assert second.peek("q")[7] == 0
    finally:
        second.close()


def test_three_protocols_share_queues(server: KestrelProcess, thrift_client: ThriftClient) -> None:
    """One engine: thrift put → text get; text put → memcache get; memcache set → thrift get."""
    assert thrift_client.put("shared", [b"t"]) == 1
    with server.connect("text") as text:
        assert exchange(text, b"get shared\n", b":t\n") == b":t\n"
        assert exchange(text, b"confirm shared 1\n", b"+1\n") == b"+1\n"
        assert exchange(text, b"put shared:\nx\n\n", b"+1\n") == b"+1\n"
    with server.connect("memcache") as memcache:
        reply = b"VALUE shared 0 1\r\nx\r\nEND\r\n"
        assert exchange(memcache, b"get shared\r\n", reply) == reply
        assert exchange(memcache, b"set shared 0 0 1\r\nm\r\n", b"STORED\r\n") == b"STORED\r\n"
    assert thrift_client.get("shared", 5) == [(b"m", 0)]
