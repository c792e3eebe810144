"""The asyncio side of link authentication: both halves of the challenge-response, driving the
pure checks of ``kayos.replication.wire.auth`` over a frame stream (docs/replication-protocol.md,
"Handshake" and "Peer authentication")."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import secrets
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kayos import limits
from kayos.errors import KayosError, Unauthenticated, error_from_code
from kayos.identity import ClusterIdentity
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from kayos.topology import Topology, check_node_id

log = logging.getLogger("kayos.replication")


class Stream(Protocol):
    def send(self, frame: fr.Frame) -> int: ...

    async def recv(self) -> fr.Frame | None: ...


def no_identity_error(node_id: str) -> Unauthenticated:
    return Unauthenticated(
        f"{node_id}: the topology file has no cluster_id and secret, so this node takes part in "
        "no replication link; run `kayos init` (or `kayos up`) to write them"
    )


def resolve_host(host: str) -> frozenset[str]:
    """The addresses ``host`` resolves to (none when it does not); blocks on DNS, so
    ``HostAddresses`` runs it in its own thread."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return frozenset()
    return frozenset(str(info[4][0]) for info in infos)


class HostAddresses:
    """The addresses topology hosts stand for: an IP stands for itself; a name is resolved once
    (``prime`` at the node's start) and kept, and again at most every
    ``limits.host_resolve_interval_ms_min`` when a HELLO does not match what is kept. Lookups run
    in this object's own thread, one at a time and one per host at once: slow DNS and a flood of
    HELLOs delay only other handshakes, never the commits of the node's default executor."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[float, frozenset[str]]] = {}
        self._pending: dict[str, asyncio.Future[frozenset[str]]] = {}
        self._executor = ThreadPoolExecutor(1, "kayos-resolve")

    async def prime(self, hosts: Iterable[str]) -> None:
        await asyncio.gather(*(self.addresses(host) for host in set(hosts)))

    async def addresses(self, host: str, *, refresh: bool = False) -> frozenset[str]:
        with contextlib.suppress(ValueError):
            return frozenset({str(ipaddress.ip_address(host))})
        loop = asyncio.get_running_loop()
        known = self._known.get(host)
        if known is not None:
            resolved_at, ips = known
            fresh = loop.time() - resolved_at < limits.host_resolve_interval_ms_min / 1000
            if fresh or not (refresh or not ips):
                return ips
        pending = self._pending.get(host)
        if pending is None:
            pending = loop.run_in_executor(self._executor, resolve_host, host)
            self._pending[host] = pending
            pending.add_done_callback(functools.partial(self._resolved, host, loop.time()))
        return await asyncio.shield(pending)

    def _resolved(self, host: str, started: float, future: asyncio.Future[frozenset[str]]) -> None:
        if self._pending.get(host) is future:
            del self._pending[host]
        if not future.cancelled() and future.exception() is None:
            self._known[host] = (started, future.result())

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def shown(text: str) -> str:
    """Untrusted text for a log line: its repr (no control characters, so it cannot forge a line)
    cut to ``limits.node_id_bytes_max`` characters."""
    cut = limits.node_id_bytes_max
    return repr(text[:cut]) + ("..." if len(text) > cut else "")


async def accept_peer(
    stream: Stream,
    hello: fr.Hello,
    *,
    topology: Topology,
    node_id: str,
    peer_ip: str,
    hosts: HostAddresses,
) -> None:
    """The acceptor's half for a replication link's ``HELLO``: returns once the connector proved
    the secret and ``AUTH_OK`` is sent; raises the refusal otherwise (the caller sends it as
    ``ERROR`` and closes). Logs one line per refusal."""
    try:
        identity = topology.identity
        if identity is None or identity.is_placeholder:
            raise no_identity_error(node_id)
        check_node_id(hello.node_id)
        address = topology.nodes.get(hello.node_id)
        host_ips = await hosts.addresses(address.host) if address is not None else frozenset()
        refusal = auth.check_claimed_address(topology, hello.node_id, peer_ip, host_ips)
        if refusal is not None and address is not None:
            # The name may have moved since it was resolved (rate-limited inside).
            host_ips = await hosts.addresses(address.host, refresh=True)
            refusal = auth.check_claimed_address(topology, hello.node_id, peer_ip, host_ips)
        if refusal is not None:
            raise refusal
        claim = auth.LinkClaim.of_hello(hello, node_id)
        nonce = secrets.token_bytes(limits.auth_nonce_bytes)
        stream.send(fr.AuthChallenge(identity.cluster_uuid, nonce))
        reply = await stream.recv()
        refusal = auth.check_proof(identity, claim, nonce, reply)
        if refusal is not None:
            raise refusal
        assert isinstance(reply, fr.AuthProof)
        # Answered with the secret the connector proved: during a rotation either is accepted.
        used = auth.proving_secret_of(
            identity, auth.CONNECTOR_PROVES, claim, nonce, reply.nonce, reply.mac
        )
        mac = auth.proof(identity, auth.ACCEPTOR_PROVES, claim, nonce, reply.nonce, used)
        stream.send(fr.AuthOk(mac))
    except KayosError as exc:
        log.warning(
            "refused link from %s claiming %s (shard %s, %s): %s: %s",
            peer_ip,
            shown(hello.node_id),
            hello.shard,
            shown(hello.role),
            exc.code,
            exc,
        )
        raise


async def prove_to_upstream(
    stream: Stream, identity: ClusterIdentity | None, claim: auth.LinkClaim
) -> None:
    """The connector's half, after sending ``HELLO``: answers the challenge and checks the
    acceptor's proof. Returns with ``HELLO_OK`` (or ``ERROR``) next on the stream."""
    if identity is None or identity.is_placeholder:
        raise no_identity_error(claim.connector)
    reply = await stream.recv()
    if isinstance(reply, fr.ErrorFrame):
        raise _error_of(reply)
    refusal = auth.check_challenge(identity, reply)
    if refusal is not None:
        raise refusal
    assert isinstance(reply, fr.AuthChallenge)
    nonce = secrets.token_bytes(limits.auth_nonce_bytes)
    mac = auth.proof(identity, auth.CONNECTOR_PROVES, claim, reply.nonce, nonce)
    stream.send(fr.AuthProof(identity.cluster_uuid, nonce, mac))
    answer = await stream.recv()
    if isinstance(answer, fr.ErrorFrame):
        raise _error_of(answer)
    refusal = auth.check_acceptor_proof(identity, claim, reply.nonce, nonce, answer)
    if refusal is not None:
        raise refusal


def _error_of(frame: fr.ErrorFrame) -> KayosError:
    return error_from_code(frame.code, frame.message, redirect=frame.redirect, epoch=frame.epoch)
