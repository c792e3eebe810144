"""The asyncio side of link authentication: both halves of the challenge-response, driving the
pure checks of ``kayos.replication.auth`` over a frame stream (docs/replication-protocol.md,
"Handshake" and "Peer authentication")."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import secrets
import socket
from typing import Protocol

from kayos import limits
from kayos.errors import KayosError, Unauthenticated, error_from_code
from kayos.identity import ClusterIdentity
from kayos.replication import auth
from kayos.replication import frames as fr
from kayos.topology import Topology

log = logging.getLogger("kayos.replication")


class Stream(Protocol):
    def send(self, frame: fr.Frame) -> int: ...

    async def recv(self) -> fr.Frame | None: ...


def no_identity_error(node_id: str) -> Unauthenticated:
    return Unauthenticated(
        f"{node_id}: the topology file has no cluster_id and secret, so this node takes part in "
        "no replication link; run `kayos init` (or `kayos up`) to write them"
    )


async def host_addresses(host: str) -> set[str]:
    """The addresses a topology host stands for: itself if it is an IP, else what it resolves to
    (an unresolvable host matches nothing)."""
    with contextlib.suppress(ValueError):
        return {str(ipaddress.ip_address(host))}
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {str(info[4][0]) for info in infos}


async def accept_peer(
    stream: Stream,
    hello: fr.Hello,
    *,
    topology: Topology,
    node_id: str,
    peer_ip: str,
) -> None:
    """The acceptor's half for a replication link's ``HELLO``: returns once the connector proved
    the secret and ``AUTH_OK`` is sent; raises the refusal otherwise (the caller sends it as
    ``ERROR`` and closes). Logs one line per refusal."""
    try:
        identity = topology.identity
        if identity is None or identity.is_placeholder:
            raise no_identity_error(node_id)
        address = topology.nodes.get(hello.node_id)
        host_ips = await host_addresses(address.host) if address is not None else set()
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
        mac = auth.proof(identity, auth.ACCEPTOR_PROVES, claim, nonce, reply.nonce)
        stream.send(fr.AuthOk(mac))
    except KayosError as exc:
        log.warning(
            "refused link from %s claiming %s (shard %s, %s): %s: %s",
            peer_ip,
            hello.node_id,
            hello.shard,
            hello.role,
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
