"""The campaign's fault proxy (chaos/procs/proxy.py) driven by toxiproxy-python, the client the
campaign uses against a real toxiproxy too: proxies created, listed, disabled and enabled; the
latency, bandwidth, timeout and reset_peer toxics doing what they say to real TCP traffic on
127.0.0.1 (an echo server upstream); the client's errors for 400, 404 and 409.

Timings are lower bounds only (a toxic can only make traffic slower), never upper ones."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.procs.proxy import ProxyServer

pytestmark = pytest.mark.chaos

# One exchange through the proxy; far above what loopback takes, so it only trips on a hang.
EXCHANGE_TIMEOUT_S = 10.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def toxiproxy() -> Iterator[Toxiproxy]:
    with ProxyServer(seed=1) as server:
        client = Toxiproxy()
        client.update_api_consumer("127.0.0.1", server.port)
        yield client


def _address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def exchange(listen: str, payload: bytes) -> bytes:
    """Sends ``payload`` through the proxy and reads the echo back."""
    with socket.create_connection(_address(listen), EXCHANGE_TIMEOUT_S) as sock:
        sock.settimeout(EXCHANGE_TIMEOUT_S)
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            data = sock.recv(65536)
            if not data:
                break
            got += data
        return got


def test_create_list_and_pass_traffic(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="echo")
    assert proxy.listen.startswith("127.0.0.1:")
    assert not proxy.listen.endswith(":0")
    assert proxy.enabled is True
    assert set(toxiproxy.proxies()) == {"echo"}
    assert toxiproxy.get_proxy("echo").upstream == echo
    assert exchange(proxy.listen, b"hello") == b"hello"
    payload = bytes(range(256)) * 2000  # 512 KB, several reads each way
    assert exchange(proxy.listen, payload) == payload
    assert toxiproxy.version() == b"kayos-fault-proxy 1"


def test_latency_toxic_delays_and_its_removal_ends_it(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="slow")
    proxy.add_toxic(type="latency", attributes={"latency": 300, "jitter": 0})
    assert set(proxy.toxics()) == {"latency_downstream"}
    assert proxy.toxics()["latency_downstream"].attributes == {"latency": 300, "jitter": 0}
    began = time.monotonic()
    assert exchange(proxy.listen, b"x") == b"x"
    assert time.monotonic() - began >= 0.3
    proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 200})
    began = time.monotonic()
    assert exchange(proxy.listen, b"y") == b"y"
    assert time.monotonic() - began >= 0.5  # both directions now
    proxy.destroy_toxic("latency_downstream")
    proxy.destroy_toxic("latency_upstream")
    assert proxy.toxics() == {}
    assert exchange(proxy.listen, b"z") == b"z"


def test_bandwidth_toxic_limits_the_rate(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="narrow")
    proxy.add_toxic(type="bandwidth", attributes={"rate": 20})  # 20 KB/s back to the client
    payload = b"b" * 20_000
    began = time.monotonic()
    assert exchange(proxy.listen, payload) == payload
    assert time.monotonic() - began >= 0.9  # 20,000 bytes at 20,000 bytes/s


def test_reset_peer_toxic_resets_connections(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="resets")
    with socket.create_connection(_address(proxy.listen), EXCHANGE_TIMEOUT_S) as sock:
        sock.settimeout(EXCHANGE_TIMEOUT_S)
        sock.sendall(b"before")
        assert sock.recv(100) == b"before"
        proxy.add_toxic(type="reset_peer", attributes={"timeout": 0})
        with pytest.raises(ConnectionResetError):
            sock.recv(100)  # the live connection is reset
    with pytest.raises(ConnectionResetError):
        exchange(proxy.listen, b"new")  # and so is a new one, while the toxic stays
    proxy.destroy_toxic("reset_peer_downstream")
    assert exchange(proxy.listen, b"after") == b"after"


def test_timeout_toxic_holds_then_closes(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="hole")
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    with socket.create_connection(_address(proxy.listen), EXCHANGE_TIMEOUT_S) as sock:
        sock.settimeout(0.5)
        sock.sendall(b"lost")
        with pytest.raises(TimeoutError):
            sock.recv(100)  # nothing passes; the connection stays open
    proxy.destroy_toxic("timeout_upstream")
    proxy.add_toxic(type="timeout", attributes={"timeout": 200})
    with socket.create_connection(_address(proxy.listen), EXCHANGE_TIMEOUT_S) as sock:
        sock.settimeout(EXCHANGE_TIMEOUT_S)
        sock.sendall(b"lost too")
        assert sock.recv(100) == b""  # closed after 200 ms, nothing delivered


def test_disable_stops_listening_and_enable_listens_again(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="flaky")
    with socket.create_connection(_address(proxy.listen), EXCHANGE_TIMEOUT_S) as live:
        live.settimeout(EXCHANGE_TIMEOUT_S)
        with proxy.down():
            assert toxiproxy.get_proxy("flaky").enabled is False
            assert live.recv(100) == b""  # live connections are closed
            with pytest.raises(ConnectionRefusedError):
                exchange(proxy.listen, b"refused")
        assert toxiproxy.get_proxy("flaky").enabled is True
    assert exchange(proxy.listen, b"back") == b"back"


def test_reset_clears_toxics_and_enables(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="r")
    proxy.add_toxic(type="latency", attributes={"latency": 1000})
    proxy.disable()
    assert toxiproxy.reset()
    again = toxiproxy.get_proxy("r")
    assert again.enabled is True
    assert again.toxics() == {}
    assert exchange(again.listen, b"ok") == b"ok"


def test_errors_come_back_as_the_clients_exceptions(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="dup")
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=echo, name="dup")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="slicer", attributes={})
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"latency": -1})
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"latnecy": 5})
    proxy.add_toxic(type="latency", name="same", attributes={"latency": 5})
    with pytest.raises(ProxyExists):  # the client's exception for any 409
        proxy.add_toxic(type="latency", name="same", attributes={"latency": 5})
    with pytest.raises(NotFound):
        proxy.destroy_toxic("missing")
    assert proxy.destroy()
    with pytest.raises(NotFound):
        proxy.destroy()
    url = f"http://127.0.0.1:{toxiproxy_port()}/proxies"
    reply = requests.post(url, data=b"{not json", timeout=EXCHANGE_TIMEOUT_S)
    assert reply.status_code == 400
    assert reply.json()["status"] == 400


def toxiproxy_port() -> int:
    from toxiproxy.api import APIConsumer

    return int(APIConsumer.port)
