"""Running one node in this process (``kayos node --config F --id N --data D``)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
import ssl
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from kayos import limits
from kayos.auth.rules import open_bind_problem
from kayos.auth.table import CredentialsTable
from kayos.datadir import DirectoryLock
from kayos.errors import AddressInUseError
from kayos.node.http.app import make_app
from kayos.node.runtime import Node
from kayos.ports import address_in_use, bind_listener
from kayos.tlsconfig import HandshakeLog, MemberTls, TlsFiles, check_exposure, install_member
from kayos.topology import Topology


def tune_gc() -> None:
    """Fewer, not longer, garbage collections: a node's hot path allocates many short-lived
    acyclic objects (freed by reference counting) and keeps a large cache of recent batches that
    every full collection would walk again; collection pauses show up as commit latency."""
    gc.collect()
    gc.freeze()  # what start-up allocated (modules, config) is never scanned again
    gc.set_threshold(*limits.gc_thresholds)


async def serve(
    topology: Topology,
    node_id: str,
    data_dir: str,
    ready: asyncio.Event | None = None,
    listen: Listen | None = None,
    managed: bool = False,
    *,
    tls: TlsFiles | None = None,
    insecure: bool = False,
    credentials_table: CredentialsTable | None = None,
    copy_rate_mb_per_s_max: float = limits.copy_rate_mb_per_s_max,
    config_path: str | None = None,
) -> None:
    """Serves until SIGINT/SIGTERM, then closes links and stores cleanly.

    In this order (docs/node-api.md "Owners, locks and ports"): lock ``data_dir``, bind both
    ports, and only then open the stores and contact peers; a held lock
    (``DirectoryInUseError``) or a taken port (``AddressInUseError``) ends it before that.
    ``listen`` binds elsewhere than the topology's address (a proxy in front of the node);
    ``managed``: manager members can splice the chains (the node's lease, docs/manager.md);
    ``tls``: both faces and the links in TLS, reloaded on SIGHUP; ``credentials_table``: offered
    to the node before it serves (taken if newer than its own); ``insecure``: serve beyond
    loopback without TLS or without client credentials (docs/security.md, "Safe defaults");
    ``config_path``: the file SIGHUP reads the secrets from again (docs/security.md);
    ``copy_rate_mb_per_s_max``: the ceiling of its copies' rate (docs/operations.md)."""
    node = Node(
        topology,
        node_id,
        data_dir,
        managed=managed,
        copy_rate_mb_per_s_max=copy_rate_mb_per_s_max,
    )
    node.config_path = config_path
    lock = DirectoryLock.acquire(data_dir, what=f"node {node_id}'s data dir")
    try:
        if credentials_table is not None:
            node.access.install(credentials_table)
        secure_node(node, listen, tls, insecure)  # after the table: both halves are checked
        http_listener, bin_listener = bind_ports(node, listen)
    except BaseException:
        lock.release()
        raise
    try:
        await _serve(node, http_listener, bin_listener, ready)
    finally:
        http_listener.close()
        lock.release()  # last: after the stores are closed


def check_node_exposure(node: Node, listen: Listen | None, tls: bool, insecure: bool) -> bool:
    """The node's safe-default check before it binds (docs/security.md, "Safe defaults"): every
    address it listens on is loopback, or it has both TLS (kayos.tlsconfig.check_exposure) and
    client credentials (kayos.auth.rules.open_bind_problem), or ``insecure`` says to run open.
    ``InvalidRequest`` names every missing half in one message; returns whether it runs open on
    purpose."""
    listen = listen or Listen()
    hosts = [node.address.host]
    hosts += [where[0] for where in (listen.http, listen.bin) if where is not None]
    what = f"node {node.node_id}"
    lacks_credentials = open_bind_problem(hosts, node.access.table, insecure=False) is not None
    return check_exposure(what, hosts, tls, insecure, lacks_credentials=lacks_credentials)


def secure_node(node: Node, listen: Listen | None, tls: TlsFiles | None, insecure: bool) -> None:
    """Loads the node's TLS files (its faces and links use them) and runs the exposure check."""
    node.insecure = check_node_exposure(node, listen, tls is not None, insecure)
    node.insecure_gauge.set(1 if node.insecure else 0)
    if tls is not None:
        node.tls = MemberTls.load(tls)
        install_member(node.tls)


class LoggedTlsSite(web.SockSite):
    """The HTTP face inside TLS, each connection's handshake done here (not by the server) so
    that a refused one is logged with its reason, as on the binary port (docs/security.md)."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: socket.socket,
        context: ssl.SSLContext,
        refusals: HandshakeLog,
    ) -> None:
        super().__init__(runner, sock)
        self.context = context
        self.refusals = refusals
        self.upgrades: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        handlers = self._runner.server
        assert handlers is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: TlsFirst(self, handlers), sock=self._sock, backlog=self._backlog
        )

    async def upgrade(self, transport: asyncio.BaseTransport, handler: asyncio.Protocol) -> None:
        try:
            secured = await asyncio.get_running_loop().start_tls(
                cast(asyncio.WriteTransport, transport),
                handler,
                self.context,
                server_side=True,
                ssl_handshake_timeout=limits.tls_handshake_ms_max / 1000,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, EOFError) as exc:
            peer = transport.get_extra_info("peername")
            self.refusals.refused_from(str(peer[0] if peer else "?"), exc)
            transport.abort()  # type: ignore[attr-defined]
            return
        if secured is None:  # the peer went away during the handshake
            return
        handler.connection_made(secured)


class TlsFirst(asyncio.Protocol):
    """A new HTTP connection until its TLS handshake ends: reading is paused at once (the
    handshake takes the bytes over) and the aiohttp handler gets the secured transport."""

    def __init__(self, site: LoggedTlsSite, handlers: Any) -> None:
        self.site = site
        self.handlers = handlers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.ReadTransport, transport).pause_reading()
        task = asyncio.get_running_loop().create_task(self.site.upgrade(transport, self.handlers()))
        self.site.upgrades.add(task)
        task.add_done_callback(self.site.upgrades.discard)


def _port_words(node: Node, field: str) -> tuple[str, str]:
    """What a port of the node is and how to move it, for the error about a taken one."""
    what = f"node {node.node_id}'s {field.split('_')[0]} port"
    hint = (
        f"pass another --base-port to kayos up, or change {field} of node {node.node_id} in the "
        "topology file"
    )
    return what, hint


@dataclass(frozen=True, slots=True)
class Listen:
    """Where a node binds when not at its topology address (``kayos node --listen-http``,
    ``--listen-bin``): (host, port) of each, None for the topology's."""

    http: tuple[str, int] | None = None
    bin: tuple[str, int] | None = None


def bind_ports(node: Node, listen: Listen | None = None) -> tuple[socket.socket, socket.socket]:
    """Binds the node's HTTP and binary ports and listens on them (``AddressInUseError`` names the
    taken one); peers that connect while the node starts wait until it serves."""
    address = node.address
    listen = listen or Listen()
    listeners: list[socket.socket] = []
    try:
        for field, (host, port) in (
            ("http_port", listen.http or (address.host, address.http_port)),
            ("bin_port", listen.bin or (address.host, address.bin_port)),
        ):
            what, hint = _port_words(node, field)
            listeners.append(bind_listener(host, port, what=what, hint=hint))
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    return listeners[0], listeners[1]


def _taken(node: Node, field: str) -> AddressInUseError:
    what, hint = _port_words(node, field)
    port = node.address.http_port if field == "http_port" else node.address.bin_port
    return address_in_use(node.address.host, port, what, hint)


async def _serve(
    node: Node,
    http_listener: socket.socket,
    bin_listener: socket.socket,
    ready: asyncio.Event | None,
) -> None:
    node_id = node.node_id
    try:
        await node.start(bin_listener)
    except BaseException as exc:
        bin_listener.close()
        await node.stop()
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            # Defensive: the port is ours since bind_ports listened on it.
            raise _taken(node, "bin_port") from None
        raise
    tune_gc()
    # keepalive_timeout also runs from a connection's start until its first request is whole
    # (aiohttp >= 3.10), so it drops half-sent requests as well as idle keep-alive connections.
    runner = web.AppRunner(
        make_app(node),
        access_log=None,
        keepalive_timeout=limits.http_idle_ms_max / 1000,
        shutdown_timeout=limits.http_shutdown_ms_max / 1000,
    )
    await runner.setup()
    site = (
        LoggedTlsSite(runner, http_listener, node.tls.server, node.binary_port.tls_refusals)
        if node.tls is not None
        else web.SockSite(runner, http_listener)
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await node.stop()
        if exc.errno == errno.EADDRINUSE:
            raise _taken(node, "http_port") from None
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, node.reload)
    logging.getLogger("kayos.node").info(
        "node %s serving http %s bin %s", node_id, node.address.http_port, node.address.bin_port
    )
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        # The lease ends and the manager's watches get their goodbye before the port closes.
        await node.goodbye()
        await runner.cleanup()
        await node.stop()
