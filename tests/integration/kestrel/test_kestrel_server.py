"""The Kestrel memcache front as a real process on a loopback port, driven by real clients
(python-memcached, pymemcache) and by raw sockets for exact bytes (spec §1-§7, §13)."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kestrel_front import REPLY_S, KestrelProcess, closed_by_server, read_exactly

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KestrelProcess]:
    process = KestrelProcess(tmp_path)
    try:
        yield process
    finally:
        process.close()


def exchange(sock: socket.socket, request: bytes, expected_size: int) -> bytes:
    """Send ``request``; read until ``expected_size`` bytes or EOF, within REPLY_S."""
    sock.sendall(request)
    return read_exactly(sock, expected_size)


# --- raw bytes -----------------------------------------------------------------------------------


def test_raw_set_get_open_close(server: KestrelProcess) -> None:
    with server.connect() as sock:
        assert exchange(sock, b"set q 5 0 5\r\nhello\r\n", 8) == b"STORED\r\n"
        reply = b"VALUE q 0 5\r\nhello\r\nEND\r\n"
        assert exchange(sock, b"get q/t=100/open\r\n", len(reply)) == reply
        assert exchange(sock, b"get q/close\r\n", 5) == b"END\r\n"
        assert exchange(sock, b"get q\r\n", 5) == b"END\r\n"


def test_raw_errors_close_the_connection(server: KestrelProcess) -> None:
    with server.connect() as sock:
        assert exchange(sock, b"bogus\r\n", 14) == b"CLIENT_ERROR\r\n"
        assert closed_by_server(sock)
    with server.connect() as sock:
        exchange(sock, b"set q 0 0 1\r\nx\r\n", 8)
        reply = b"VALUE q 0 1\r\nx\r\nEND\r\n"
        assert exchange(sock, b"get q/open\r\n", len(reply)) == reply
        assert exchange(sock, b"get q\r\n", 7) == b"ERROR\r\n"
        assert closed_by_server(sock)
    with server.connect() as sock:  # The close aborted the open read: it is back.
        assert exchange(sock, b"get q\r\n", len(reply)) == reply


def test_blocked_get_of_departed_client_takes_nothing(server: KestrelProcess) -> None:
    """§3.4: a waiter whose client left never consumes an item."""
    with server.connect() as waiter:
        waiter.sendall(b"get q/t=10000\r\n")
        with server.connect() as probe:
            stats = b""
            deadline = time.monotonic() + REPLY_S
            while b"STAT queue_q_waiters 1\r\n" not in stats:
                assert time.monotonic() < deadline, "the waiter never registered"
                probe.sendall(b"stats\r\n")
                stats = b""
                while not stats.endswith(b"END\r\n"):
                    stats += probe.recv(65536)
    with server.connect() as producer:
        assert exchange(producer, b"set q 0 0 1\r\nx\r\n", 8) == b"STORED\r\n"
        reply = b"VALUE q 0 1\r\nx\r\nEND\r\n"
        assert exchange(producer, b"get q\r\n", len(reply)) == reply


def test_blocked_get_receives_item(server: KestrelProcess) -> None:
    with server.connect() as waiter, server.connect() as producer:
        waiter.sendall(b"get q/t=5000\r\n")
        # The waiter's GET is queued first on the server only once it is read; a set that lands
        # before it is still fetched at once, so the outcome is the same either way.
        assert exchange(producer, b"set q 0 0 2\r\nhi\r\n", 8) == b"STORED\r\n"
        reply = b"VALUE q 0 2\r\nhi\r\nEND\r\n"
        assert read_exactly(waiter, len(reply)) == reply


def test_shutdown_stops_the_server(server: KestrelProcess) -> None:
    with server.connect() as sock:
        sock.sendall(b"shutdown\r\n")
        assert closed_by_server(sock)
    assert server.wait_exit(10) == 0


def test_sigterm_stops_gracefully(server: KestrelProcess) -> None:
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0


def test_config_file_is_used(tmp_path: Path) -> None:
    process = KestrelProcess(
        tmp_path, config="[server]\nmax_open_transactions = 2\n[queues.q]\nmax_items = 1\n"
    )
    try:
        with process.connect() as sock:
            assert exchange(sock, b"set q 0 0 1\r\nx\r\n", 8) == b"STORED\r\n"
            assert exchange(sock, b"set q 0 0 1\r\ny\r\n", 12) == b"NOT_STORED\r\n"
    finally:
        process.close()


# --- python-memcached ----------------------------------------------------------------------------


def test_python_memcached(server: KestrelProcess) -> None:
    memcache: Any = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")
    client = memcache.Client([f"{server.host}:{server.port}"], dead_retry=0)
    try:
        assert client.set("work", b"job-1")
        assert client.set("work", b"job-2")
        assert client.get("work") == b"job-1"
        assert client.get("work/t=100/open") == b"job-2"
        assert client.get("work/close") is None
        assert client.get("work/t=100") is None
        stats = dict(client.get_stats()[0][1])
        assert stats["queue_work_total_items"] == "2"
        assert stats["cmd_set"] == "2"
        assert client.delete("work")
    finally:
        client.disconnect_all()


# --- pymemcache ----------------------------------------------------------------------------------


def test_pymemcache(server: KestrelProcess) -> None:
    base = pytest.importorskip("pymemcache.client.base", reason="pymemcache is in the dev extra")

    class KestrelClient(base.Client):  # type: ignore[misc, name-defined]
        """pymemcache expects VALUE to echo the key sent; Kestrel echoes the bare queue name."""

        def _extract_value(
            self,
            expect_cas: bool,
            line: bytes,
            buf: bytes,
            remapped_keys: dict[bytes, Any],
            prefixed_keys: list[bytes],
        ) -> Any:
            parts = line.split()
            parts[1] = prefixed_keys[0]
            return super()._extract_value(
                expect_cas, b" ".join(parts), buf, remapped_keys, prefixed_keys
            )

    client = KestrelClient((server.host, server.port), default_noreply=False, timeout=REPLY_S)
    try:
        assert client.set("jobs", b"a")
        assert client.set("jobs", b"b")
        assert client.get("jobs") == b"a"
        assert client.get("jobs/t=100/open") == b"b"
        assert client.get("jobs/close") is None
        assert client.get("jobs") is None
        stats = client.stats()
        assert stats[b"queue_jobs_total_items"] == 2
        assert client.version() == b"2.4.1"
    finally:
        with contextlib.suppress(Exception):
            client.close()


def test_pylibmc(server: KestrelProcess) -> None:
    # pylibmc ships wheels only up to CPython 3.11 (pyproject's dev extra installs it there).
    pylibmc: Any = pytest.importorskip("pylibmc", reason="no pylibmc wheel for this Python")
    client = pylibmc.Client([f"{server.host}:{server.port}"])
    assert client.set("q", b"x")
    assert client.get("q/t=100/open") == b"x"
    assert client.get("q/close") is None
    # libmemcached parses only memcached's own stat names, so per-queue stats do not show here.
    stats = dict(client.get_stats()[0][1])
    assert stats["curr_items"] == b"0"
    assert stats["total_items"] == b"1"
    assert stats["cmd_set"] == b"1"
