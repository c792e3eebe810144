"""Signed admin messages: what the cluster manager sends to nodes (a new topology, a catch-up
order) and what operators send to the manager (remove a node; add a node, drain, move, rebalance:
purpose ``operator``; a supervisor's report that a node process exited: purpose ``exited``).

Anyone can reach an HTTP port, so a message that changes the topology must prove that its sender
holds the cluster secret (kayos/identity.py). The proof is an HMAC-SHA256 under the secret over a
purpose tag, the cluster id and the message's canonical JSON (docs/node-api.md, "Signed admin
messages", gives the bytes). A replayed message can only say again what was said: a topology is
applied only at a higher epoch than the node holds, and every other signed message names the epoch
it was decided at.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Final

from kayos.errors import InvalidRequest, Unauthenticated
from kayos.identity import ClusterIdentity

SIGNING_VERSION: Final = b"kayos-admin-v1"
PURPOSES: Final = frozenset(
    {
        "topology",
        "catch-up",
        "remove-node",
        "repair",
        "operator",
        "compact",
        "followers",
        "lease",
        "write-hold",
        "exited",
        "secrets",
    }
)


def canonical_json(body: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only: the same bytes for the same value everywhere."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def mac_input(identity: ClusterIdentity, purpose: str, body: Any) -> bytes:
    if purpose not in PURPOSES:
        raise ValueError(f"unknown signing purpose {purpose!r}")
    return b"\x00".join(
        (SIGNING_VERSION, purpose.encode(), identity.cluster_uuid, canonical_json(body))
    )


def sign(identity: ClusterIdentity, purpose: str, body: Any, secret: bytes | None = None) -> str:
    """The hex MAC of ``body`` for ``purpose``, under ``secret`` (by default the one the member
    signs with now)."""
    key = secret or identity.proving_secret
    return hmac.new(key, mac_input(identity, purpose, body), hashlib.sha256).hexdigest()


def check_signed(identity: ClusterIdentity | None, purpose: str, body: Any, mac: Any) -> None:
    """Raises ``Unauthenticated`` unless ``mac`` is ``body``'s MAC for ``purpose`` under the
    cluster's secret (a node without an identity accepts no signed message)."""
    if identity is None:
        raise Unauthenticated("this node has no cluster secret: it accepts no admin message")
    if not isinstance(mac, str) or len(mac) != 2 * hashlib.sha256().digest_size:
        raise Unauthenticated(f"{purpose}: missing or malformed mac")
    # During a rotation two secrets are accepted (docs/security.md).
    if not any(
        hmac.compare_digest(mac, sign(identity, purpose, body, secret))
        for secret in identity.accepted_secrets
    ):
        raise Unauthenticated(f"{purpose}: the mac does not match this cluster's secret")


def open_signed(
    identity: ClusterIdentity | None, purpose: str, message: Any, fields: frozenset[str]
) -> dict[str, Any]:
    """The body of a signed message ``{"body": {...}, "mac"}`` once its MAC is checked
    (``Unauthenticated``) and it has exactly ``fields`` (``InvalidRequest``)."""
    if not isinstance(message, dict) or set(message) != {"body", "mac"}:
        raise InvalidRequest('a signed message is {"body": {...}, "mac": "<hex>"}')
    body = message["body"]
    check_signed(identity, purpose, body, message["mac"])
    if not isinstance(body, dict) or set(body) != fields:
        raise InvalidRequest(f"a {purpose} body has exactly the fields {sorted(fields)}")
    return body
