"""Peer authentication of replication links: the MAC input, both proofs, and the acceptor's and
connector's decisions (docs/replication-protocol.md, "Peer authentication").

Sans-IO and pure: nonces and the peer's resolved addresses come in as arguments, so every accept
or refuse decision is a function of its inputs and is unit-tested without sockets.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from kayos.errors import (
    KayosError,
    ProtocolError,
    Unauthenticated,
    WrongClusterError,
    WrongPeerError,
)
from kayos.identity import ClusterIdentity
from kayos.replication.wire import frames as fr
from kayos.topology import Topology

CONTEXT = b"kayos-link-auth-1"
CONNECTOR_PROVES = 1
ACCEPTOR_PROVES = 2

_U16 = struct.Struct(">H")
_SHARD_EPOCH = struct.Struct(">IQ")


@dataclass(frozen=True, slots=True)
class LinkClaim:
    """What both proofs of one link are about: who connects to whom, for which shard, as what."""

    connector: str
    acceptor: str
    shard: int
    epoch: int
    role: str

    @classmethod
    def of_hello(cls, hello: fr.Hello, acceptor: str) -> LinkClaim:
        return cls(hello.node_id, acceptor, hello.shard or 0, hello.epoch, hello.role)


def mac_input(
    direction: int,
    cluster_uuid: bytes,
    claim: LinkClaim,
    acceptor_nonce: bytes,
    connector_nonce: bytes,
) -> bytes:
    """The bytes both sides MAC; the table in the protocol document, field by field."""
    assert direction in (CONNECTOR_PROVES, ACCEPTOR_PROVES)
    assert len(cluster_uuid) == 16
    connector = claim.connector.encode()
    acceptor = claim.acceptor.encode()
    role = claim.role.encode("ascii")
    return b"".join(
        (
            CONTEXT,
            bytes((direction,)),
            cluster_uuid,
            _U16.pack(len(connector)),
            connector,
            _U16.pack(len(acceptor)),
            acceptor,
            _SHARD_EPOCH.pack(claim.shard, claim.epoch),
            bytes((len(role),)),
            role,
            acceptor_nonce,
            connector_nonce,
        )
    )


def proof(
    identity: ClusterIdentity,
    direction: int,
    claim: LinkClaim,
    acceptor_nonce: bytes,
    connector_nonce: bytes,
    secret: bytes | None = None,
) -> bytes:
    """The MAC under ``secret``, by default the one the member proves with now."""
    data = mac_input(direction, identity.cluster_uuid, claim, acceptor_nonce, connector_nonce)
    return hmac.new(secret or identity.proving_secret, data, hashlib.sha256).digest()


def proving_secret_of(
    identity: ClusterIdentity,
    direction: int,
    claim: LinkClaim,
    acceptor_nonce: bytes,
    connector_nonce: bytes,
    mac: bytes,
) -> bytes | None:
    """Which of the secrets this member accepts ``mac`` was made with; None if none. During a
    rotation (docs/security.md) a member accepts two, and answers a peer with the one it used."""
    for secret in identity.accepted_secrets:
        expected = proof(identity, direction, claim, acceptor_nonce, connector_nonce, secret)
        if hmac.compare_digest(expected, mac):
            return secret
    return None


# --- the acceptor ------------------------------------------------------------------------------


def check_claimed_address(
    topology: Topology, node_id: str, peer_ip: str, host_ips: Iterable[str]
) -> KayosError | None:
    """Step 2: the claimed node is in the topology and its host resolves (``host_ips``) to the
    connection's source address. None when it passes; else the refusal."""
    if node_id not in topology.nodes:
        return WrongPeerError(f"{node_id!r} is not a node of this cluster's topology")
    try:
        peer = _normal(peer_ip)
        allowed = {_normal(ip) for ip in host_ips}
    except ValueError:
        return WrongPeerError(f"cannot compare address {peer_ip!r} with the topology")
    if peer not in allowed:
        host = topology.nodes[node_id].host
        return WrongPeerError(
            f"{node_id} is at {host} in the topology, but this connection comes from {peer_ip}"
        )
    return None


def _normal(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_proof(
    identity: ClusterIdentity,
    claim: LinkClaim,
    acceptor_nonce: bytes,
    reply: fr.Frame | None,
) -> KayosError | None:
    """Steps 3 and 4: the connector's answer to ``AUTH_CHALLENGE``. None when it proves the
    secret for this claim; else the refusal."""
    if reply is None:
        return Unauthenticated(f"{claim.connector} closed the connection instead of proving")
    if not isinstance(reply, fr.AuthProof):
        return ProtocolError(f"expected AUTH_PROOF, got {type(reply).__name__}")
    if reply.cluster_id != identity.cluster_uuid:
        return WrongClusterError(
            f"{claim.connector} belongs to another cluster than {identity.cluster_id}"
        )
    used = proving_secret_of(
        identity, CONNECTOR_PROVES, claim, acceptor_nonce, reply.nonce, reply.mac
    )
    if used is None:
        return Unauthenticated(f"{claim.connector} could not prove the cluster secret")
    return None


# --- the connector -----------------------------------------------------------------------------


def check_challenge(identity: ClusterIdentity, reply: fr.Frame | None) -> KayosError | None:
    """The acceptor's first answer to a link's ``HELLO`` must be a challenge from our cluster
    (an ``ERROR`` is raised by the caller before this)."""
    if isinstance(reply, fr.HelloOk):
        return Unauthenticated("the upstream accepted the link without authenticating it")
    if not isinstance(reply, fr.AuthChallenge):
        name = type(reply).__name__ if reply is not None else "end of stream"
        return ProtocolError(f"expected AUTH_CHALLENGE, got {name}")
    if reply.cluster_id != identity.cluster_uuid:
        return WrongClusterError(
            f"the upstream belongs to another cluster than {identity.cluster_id}"
        )
    return None


def check_acceptor_proof(
    identity: ClusterIdentity,
    claim: LinkClaim,
    acceptor_nonce: bytes,
    connector_nonce: bytes,
    reply: fr.Frame | None,
) -> KayosError | None:
    if not isinstance(reply, fr.AuthOk):
        name = type(reply).__name__ if reply is not None else "end of stream"
        return ProtocolError(f"expected AUTH_OK, got {name}")
    used = proving_secret_of(
        identity, ACCEPTOR_PROVES, claim, acceptor_nonce, connector_nonce, reply.mac
    )
    if used is None:
        return Unauthenticated(f"the upstream {claim.acceptor} could not prove the cluster secret")
    return None
