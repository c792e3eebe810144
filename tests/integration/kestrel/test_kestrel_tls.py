"""The Kestrel front's ports inside TLS, as an option (docs/security.md, "TLS"): with
``--tls-cert``/``--tls-key`` a memcache client that trusts the CA is served over TLS, and a plain
connection gets no answer; without them the front stays plain (every other Kestrel test)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kayos import tlsconfig
from kayos.local import certs
from tests.support.kestrel_front import REPLY_S, KestrelProcess, closed_by_server

pytestmark = pytest.mark.integration


def test_the_front_serves_memcache_inside_tls_and_refuses_plain(tmp_path: Path) -> None:
    certs.write_cluster_certs(str(tmp_path / "tls"), {"front": "127.0.0.1"})
    cert, key = tmp_path / "tls" / "front.pem", tmp_path / "tls" / "front.key"
    front = KestrelProcess(tmp_path, args=["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        context = tlsconfig.client_context(str(tmp_path / "tls" / "ca.pem"))
        raw = socket.create_connection((front.host, front.port), timeout=REPLY_S)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as secured:
            secured.sendall(b"set q 0 0 5\r\nhello\r\nget q\r\n")
            reply = b""
            while not reply.endswith(b"END\r\n"):
                chunk = secured.recv(4096)
                assert chunk, reply
                reply += chunk
        assert reply == b"STORED\r\nVALUE q 0 5\r\nhello\r\nEND\r\n"
        with socket.create_connection((front.host, front.port), timeout=REPLY_S) as plain:
            plain.sendall(b"get q\r\n")
            assert closed_by_server(plain)
    finally:
        front.close()
