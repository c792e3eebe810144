"""A TCP fault proxy with the subset of toxiproxy's HTTP API that ``toxiproxy-python`` uses
(docs/testing.md, "Network faults"): the campaign puts one in front of each node port, and adds
and removes toxics (latency, bandwidth limits, connection resets, black holes) to fault the
traffic that crosses it.

``ProxyServer`` runs the API and every proxy on one asyncio loop in a thread of its own; a
campaign with ``TOXIPROXY_URL`` set uses that real toxiproxy server instead (``api_url``).
Randomness (a toxic's ``toxicity``, latency jitter) comes from an injected seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# What one read from a socket takes at most.
chunk_bytes_max = 64 * 1024
# Chunks read ahead of the writer per direction (latency delays the writer, not the reader).
pump_queue_chunks_max = 256
# The bandwidth toxic sends at most this much between two of its waits, so a limited link
# trickles rather than stalls for a whole chunk's time.
bandwidth_slice_ms = 50
# Starting and stopping the server's thread and loop.
thread_start_timeout_s = 10.0
# Connecting to a proxy's upstream: a node on loopback accepts in milliseconds, a dead one
# refuses at once; the bound only trips on a black-holed address.
upstream_connect_timeout_s = 5.0
# A disable cancels each connection's task and waits this long before cutting the sockets of any
# task still running and cancelling again (a cancel can be lost to a race in the stdlib).
stop_recancel_s = 1.0
# What /version answers (toxiproxy answers its own version; clients only print it).
VERSION = "kayos-fault-proxy 1"

# Toxic types and their attributes (all integers >= 0; missing ones are 0).
TOXIC_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
}
STREAMS = ("upstream", "downstream")
_attribute_max = 2**31 - 1


class ApiError(Exception):
    """A refused API request: its HTTP status and message (toxiproxy's error body)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def api_url() -> str | None:
    """A real toxiproxy's URL when ``TOXIPROXY_URL`` is set (``deploy/`` sets it), else None."""
    url = os.environ.get("TOXIPROXY_URL", "").strip()
    return url.rstrip("/") or None


def split_host_port(text: Any, what: str) -> tuple[str, int]:
    if not isinstance(text, str):
        raise ApiError(400, f"{what} must be a string HOST:PORT")
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ApiError(400, f"{what} {text!r} is not HOST:PORT")
    return host, int(port)


@dataclass
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }

    @staticmethod
    def parse(body: Any, existing: Toxic | None = None) -> Toxic:
        """A toxic from a request body (``existing``: an update, which keeps what it omits)."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        kind = body.get("type", existing.type if existing else None)
        if kind not in TOXIC_ATTRIBUTES:
            raise ApiError(400, f"unknown toxic type {kind!r}; known: {sorted(TOXIC_ATTRIBUTES)}")
        stream = body.get("stream", existing.stream if existing else "downstream")
        if stream not in STREAMS:
            raise ApiError(400, f"stream must be one of {STREAMS}, not {stream!r}")
        name = body.get("name", existing.name if existing else f"{kind}_{stream}")
        if not isinstance(name, str) or not name or "/" in name:
            raise ApiError(400, "name must be a non-empty string without '/'")
        toxicity = body.get("toxicity", existing.toxicity if existing else 1.0)
        if isinstance(toxicity, bool) or not isinstance(toxicity, int | float):
            raise ApiError(400, "toxicity must be a number")
        if not 0.0 <= toxicity <= 1.0:
            raise ApiError(400, "toxicity must be within 0 .. 1")
        raw = body.get("attributes", existing.attributes if existing else {})
        if not isinstance(raw, dict):
            raise ApiError(400, "attributes must be an object")
        unknown = sorted(set(raw) - set(TOXIC_ATTRIBUTES[kind]))
        if unknown:
            raise ApiError(400, f"unknown attributes {unknown} for a {kind} toxic")
        attributes = {}
        for key in TOXIC_ATTRIBUTES[kind]:
            value = raw.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ApiError(400, f"attribute {key} must be an integer")
            if not 0 <= value <= _attribute_max:
                raise ApiError(400, f"attribute {key} must be within 0 .. {_attribute_max}")
            attributes[key] = value
        if kind == "bandwidth" and attributes["rate"] == 0:
            raise ApiError(400, "a bandwidth toxic needs rate > 0 (KB/s)")
        return Toxic(name, kind, stream, float(toxicity), attributes)


class _Close(Exception):
    """Ends a connection; ``reset`` sends TCP RST instead of FIN."""

    def __init__(self, reset: bool) -> None:
        super().__init__("reset" if reset else "closed")
        self.reset = reset


class Connection:
    """One client connection through a proxy and its upstream connection."""

    def __init__(self, proxy: Proxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter]):
        self.proxy = proxy
        self.client = client
        self.server: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        # Whether each toxic applies to this connection (its toxicity, drawn once), and when
        # this connection first saw it (a timeout or reset counts from there).
        self.applies: dict[str, bool] = {}
        self.first_seen: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    def active(self, stream: str | None, *kinds: str) -> list[Toxic]:
        found = []
        for toxic in list(self.proxy.toxics.values()):
            if toxic.type not in kinds or (stream is not None and toxic.stream != stream):
                continue
            if toxic.name not in self.applies:
                self.applies[toxic.name] = self.proxy.rng.random() < toxic.toxicity
            if self.applies[toxic.name]:
                self.first_seen.setdefault(toxic.name, asyncio.get_running_loop().time())
                found.append(toxic)
        return found

    async def run(self) -> None:
        reset = False
        try:
            host, port = self.proxy.upstream
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that lands
                # as the connection completes, and a disable then waited for this task for ever.
                async with asyncio.timeout(upstream_connect_timeout_s):
                    self.server = await asyncio.open_connection(host, port, limit=chunk_bytes_max)
            except (OSError, TimeoutError):
                return
            if not self.proxy.enabled:
                return  # disabled while connecting upstream
            pumps = [
                asyncio.create_task(self._pump(self.client[0], self.server[1], "upstream")),
                asyncio.create_task(self._pump(self.server[0], self.client[1], "downstream")),
                asyncio.create_task(self._watch()),
            ]
            try:
                done, _pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    error = task.exception()
                    if isinstance(error, _Close):
                        reset = error.reset
            finally:
                for task in pumps:
                    task.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._close(reset)

    def abort(self) -> None:
        """Cuts both sockets at once (``stop`` for a task its cancel did not end)."""
        for pair in (self.client, self.server):
            if pair is not None:
                pair[1].transport.abort()

    def _close(self, reset: bool) -> None:
        for pair in (self.client, self.server):
            if pair is None:
                continue
            writer = pair[1]
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                writer.transport.abort()
            else:
                writer.close()

    async def _watch(self) -> None:
        """Ends the connection when a ``reset_peer`` or ``timeout`` (> 0) toxic's time is up."""
        loop = asyncio.get_running_loop()
        while True:
            changed = self.proxy.changed
            due: list[tuple[float, bool]] = []
            for toxic in self.active(None, "reset_peer", "timeout"):
                wait_s = toxic.attributes["timeout"] / 1000
                if toxic.type == "reset_peer" or wait_s > 0:
                    at = self.first_seen[toxic.name] + wait_s
                    due.append((at, toxic.type == "reset_peer"))
            if due:
                at, reset = min(due)
                if loop.time() >= at:
                    raise _Close(reset)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(at):
                        await changed.wait()
            else:
                await changed.wait()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: str
    ) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(pump_queue_chunks_max)

        async def read() -> None:
            while True:
                data = await reader.read(chunk_bytes_max)
                await queue.put((loop.time(), data))
                if not data:
                    return

        reading = asyncio.create_task(read())
        try:
            while True:
                read_at, data = await queue.get()
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    await reading
                    return
                await self._deliver(writer, stream, read_at, data)
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    async def _deliver(
        self, writer: asyncio.StreamWriter, stream: str, read_at: float, data: bytes
    ) -> None:
        loop = asyncio.get_running_loop()
        if self.active(stream, "timeout"):
            return  # a black hole: what was sent is gone, as toxiproxy's timeout drops it
        delay_ms = 0.0
        for toxic in self.active(stream, "latency"):
            jitter = toxic.attributes["jitter"]
            delay_ms += toxic.attributes["latency"] + self.proxy.rng.uniform(-jitter, jitter)
        wait_s = read_at + delay_ms / 1000 - loop.time()
        if wait_s > 0:
            await asyncio.sleep(wait_s)  # the latency toxic itself
        limits = self.active(stream, "bandwidth")
        if not limits:
            writer.write(data)
            await writer.drain()
            return
        rate = min(toxic.attributes["rate"] for toxic in limits) * 1000  # bytes per second
        step = max(1, rate * bandwidth_slice_ms // 1000)
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(len(piece) / rate)  # the bandwidth toxic itself


@dataclass
class Proxy:
    name: str
    listen: tuple[str, int]
    upstream: tuple[str, int]
    rng: random.Random
    enabled: bool = True
    toxics: dict[str, Toxic] = field(default_factory=dict)
    connections: set[Connection] = field(default_factory=set)
    server: asyncio.Server | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": f"{self.listen[0]}:{self.listen[1]}",
            "upstream": f"{self.upstream[0]}:{self.upstream[1]}",
            "enabled": self.enabled,
            "toxics": [toxic.to_json() for toxic in self.toxics.values()],
        }

    def touch(self) -> None:
        """Wakes every connection waiting on a change of toxics."""
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self.accept, self.listen[0], self.listen[1], reuse_address=True
        )
        port = self.server.sockets[0].getsockname()[1]
        self.listen = (self.listen[0], int(port))
        self.enabled = True

    async def stop(self) -> None:
        """Stops listening and closes every connection (disabled, or deleted)."""
        self.enabled = False
        server, self.server = self.server, None
        if server is not None:
            server.close()
        tasks = {c.task for c in self.connections if c.task is not None}
        while tasks:
            for task in tasks:
                task.cancel()
            _done, tasks = await asyncio.wait(tasks, timeout=stop_recancel_s)
            for connection in list(self.connections):
                if connection.task in tasks:
                    connection.abort()  # a task that outlived its cancel: cut its sockets
        if server is not None:
            await server.wait_closed()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serves one accepted connection until it ends (the listener's callback)."""
        if not self.enabled:
            # Accepted just before ``stop`` closed the listener, but run only after it collected
            # the connections to cancel: closed here, or the listener's ``wait_closed`` would
            # wait for it for ever (a disable under load hung test_fault_proxy this way).
            writer.close()
            return
        connection = Connection(self, (reader, writer))
        connection.task = asyncio.current_task()
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)


async def _json_body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"null")
    except ValueError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None


def _reply(body: Any, status: int = 200) -> web.Response:
    if body is None:
        return web.Response(status=status)
    return web.json_response(body, status=status)


class Api:
    """The HTTP routes (docs/testing.md lists them) over the proxies of one loop."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.proxies: dict[str, Proxy] = {}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors])
        app.router.add_get("/version", self.version)
        app.router.add_post("/reset", self.reset)
        app.router.add_get("/proxies", self.list_proxies)
        app.router.add_post("/proxies", self.create)
        app.router.add_get("/proxies/{proxy}", self.get)
        app.router.add_post("/proxies/{proxy}", self.update)
        app.router.add_delete("/proxies/{proxy}", self.delete)
        app.router.add_get("/proxies/{proxy}/toxics", self.list_toxics)
        app.router.add_post("/proxies/{proxy}/toxics", self.add_toxic)
        app.router.add_get("/proxies/{proxy}/toxics/{toxic}", self.get_toxic)
        app.router.add_post("/proxies/{proxy}/toxics/{toxic}", self.update_toxic)
        app.router.add_delete("/proxies/{proxy}/toxics/{toxic}", self.delete_toxic)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
        except ApiError as error:
            return _reply({"error": str(error), "status": error.status}, error.status)
        return response

    def _proxy(self, request: web.Request) -> Proxy:
        name = request.match_info["proxy"]
        if name not in self.proxies:
            raise ApiError(404, f"proxy not found: {name}")
        return self.proxies[name]

    def _toxic(self, request: web.Request) -> tuple[Proxy, Toxic]:
        proxy = self._proxy(request)
        name = request.match_info["toxic"]
        if name not in proxy.toxics:
            raise ApiError(404, f"toxic not found: {name}")
        return proxy, proxy.toxics[name]

    async def version(self, request: web.Request) -> web.Response:
        return web.Response(text=VERSION)

    async def reset(self, request: web.Request) -> web.Response:
        for proxy in self.proxies.values():
            proxy.toxics.clear()
            proxy.touch()
            if not proxy.enabled:
                await proxy.start()
        return _reply(None, 204)

    async def list_proxies(self, request: web.Request) -> web.Response:
        return _reply({name: proxy.to_json() for name, proxy in self.proxies.items()})

    async def create(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        name = body.get("name")
        if not isinstance(name, str) or not name or "/" in name:
            raise ApiError(400, "name must be a non-empty string without '/'")
        if name in self.proxies:
            raise ApiError(409, f"proxy already exists: {name}")
        upstream = split_host_port(body.get("upstream"), "upstream")
        listen = split_host_port(body.get("listen", "127.0.0.1:0"), "listen")
        enabled = body.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ApiError(400, "enabled must be true or false")
        proxy = Proxy(name, listen, upstream, self.rng)
        if enabled:
            try:
                await proxy.start()
            except OSError as exc:
                raise ApiError(409, f"cannot listen on {listen}: {exc}") from None
        else:
            proxy.enabled = False
        self.proxies[name] = proxy
        return _reply(proxy.to_json(), 201)

    async def get(self, request: web.Request) -> web.Response:
        return _reply(self._proxy(request).to_json())

    async def update(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("enabled", True), bool):
            raise ApiError(400, "the body must be an object; enabled true or false")
        enabled = body.get("enabled", proxy.enabled)
        if enabled and not proxy.enabled:
            try:
                await proxy.start()
            except OSError as exc:
                raise ApiError(409, f"cannot listen on {proxy.listen}: {exc}") from None
        elif not enabled and proxy.enabled:
            await proxy.stop()
        return _reply(proxy.to_json())

    async def delete(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        await proxy.stop()
        del self.proxies[proxy.name]
        return _reply(None, 204)

    async def list_toxics(self, request: web.Request) -> web.Response:
        return _reply([toxic.to_json() for toxic in self._proxy(request).toxics.values()])

    async def add_toxic(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = Toxic.parse(await _json_body(request))
        if toxic.name in proxy.toxics:
            raise ApiError(409, f"toxic already exists: {toxic.name}")
        proxy.toxics[toxic.name] = toxic
        proxy.touch()
        return _reply(toxic.to_json())

    async def get_toxic(self, request: web.Request) -> web.Response:
        return _reply(self._toxic(request)[1].to_json())

    async def update_toxic(self, request: web.Request) -> web.Response:
        proxy, existing = self._toxic(request)
        body = await _json_body(request)
        if isinstance(body, dict):
            body = {**body, "name": existing.name, "type": existing.type}
        toxic = Toxic.parse(body, existing)
        proxy.toxics[toxic.name] = toxic
        proxy.touch()
        return _reply(toxic.to_json())

    async def delete_toxic(self, request: web.Request) -> web.Response:
        proxy, toxic = self._toxic(request)
        del proxy.toxics[toxic.name]
        proxy.touch()
        return _reply(None, 204)

    async def close(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        self.proxies.clear()


class ProxyServer:
    """The API on ``host`` (port 0: a free one) and its proxies, on a loop in a daemon thread.
    ``start`` returns the API's URL; ``stop`` closes every proxy and connection."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> None:
        self.host = host
        self.port = port
        self.api = Api(random.Random(seed))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def start(self) -> str:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(thread_start_timeout_s)
        return self.url

    async def _start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        self.port = int(listener.getsockname()[1])
        self._runner = web.AppRunner(self.api.app(), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, listener).start()
        self.url = f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._stop(), self.loop)
        try:
            future.result(thread_start_timeout_s)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(thread_start_timeout_s)
            if not self._thread.is_alive():
                self.loop.close()

    async def _stop(self) -> None:
        await self.api.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> ProxyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
