"""How a request proves its credential (docs/security.md, "Proving a credential").

HTTP: every request carries ``Authorization: Kayos-Proof name=N, time=T, nonce=R, proof=P``: a
proof (kayos/auth/keys.py) over ``kayos-http-v1``, the method, the raw path with its query, ``T``
(the client's clock, ms since the epoch) and ``R`` (16 random bytes, hex). A node takes ``T``
within ``auth_clock_skew_ms_max`` of its own clock and each nonce once (``NonceWindow``). The body
is not covered: on a plain connection an active man in the middle could change it, which is why a
node off loopback runs TLS (docs/security.md, "Threat model").

Binary port: after HELLO a node that holds credentials sends AUTH_CHALLENGE (its nonce); the
client answers CLIENT_PROOF with its name, its own nonce and a proof over ``kayos-bin-v1``, the
cluster id, both nonces and the name. The node's nonce is fresh per connection, so nothing is
remembered.

The cluster's own requests (the manager's polls and watches) prove ``@cluster``, whose key is
derived from the cluster secret. Pure: the clock is a number passed in.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from kayos import limits
from kayos.auth.keys import CLUSTER_PRINCIPAL, cluster_client_key, make_proof, proof_matches
from kayos.auth.table import Credential, CredentialsTable

SCHEME: Final = "Kayos-Proof"
HTTP_LABEL: Final = b"kayos-http-v1"
BINARY_LABEL: Final = b"kayos-bin-v1"
NONCE_HEX_CHARS: Final = 32
_HEADER = re.compile(
    r"Kayos-Proof name=([A-Za-z0-9@:._-]{1,64}), time=([0-9]{1,15}), "
    r"nonce=([0-9a-f]{32}), proof=([0-9a-f]{64})"
)

# The reasons a request is refused (the label of kayos_auth_refusals_total): 401s, then 403.
REASONS: Final = (
    "missing",  # no credential where the route needs one
    "malformed",  # an Authorization header that is not a Kayos-Proof
    "unknown",  # a name the table does not hold
    "bad_proof",  # a proof that no secret of the name makes
    "stale",  # the client's time is outside the window
    "replayed",  # a nonce already seen
    "forbidden",  # a known credential without the route's role (403)
)


def http_message(method: str, path_qs: str, time_ms: int, nonce_hex: str) -> bytes:
    return b"\x00".join(
        (
            HTTP_LABEL,
            method.upper().encode(),
            path_qs.encode(),
            str(time_ms).encode(),
            nonce_hex.encode(),
        )
    )


def http_authorization(
    name: str, client_key: bytes, method: str, path_qs: str, time_ms: int, nonce: bytes
) -> str:
    """The header a client sends (``nonce``: 16 random bytes)."""
    nonce_hex = nonce.hex()
    proof = make_proof(client_key, http_message(method, path_qs, time_ms, nonce_hex))
    return f"{SCHEME} name={name}, time={time_ms}, nonce={nonce_hex}, proof={proof.hex()}"


def cluster_authorization(
    cluster_secret: bytes, method: str, path_qs: str, time_ms: int, nonce: bytes
) -> str:
    """The header of a request the cluster itself makes (a manager member's poll or watch)."""
    client_key = cluster_client_key(cluster_secret)
    return http_authorization(CLUSTER_PRINCIPAL, client_key, method, path_qs, time_ms, nonce)


def binary_message(
    cluster_uuid: bytes, server_nonce: bytes, client_nonce: bytes, name: str
) -> bytes:
    return b"\x00".join((BINARY_LABEL, cluster_uuid, server_nonce, client_nonce, name.encode()))


@dataclass(slots=True)
class NonceWindow:
    """The nonces seen within the clock window, oldest first; past ``auth_nonces_max`` the oldest
    is forgotten and ``floor_ms`` rises to its time: a proof at or before it is stale."""

    seen: OrderedDict[str, int] = field(default_factory=OrderedDict)
    floor_ms: int = 0
    nonces_max: int = limits.auth_nonces_max

    def admit(self, nonce_hex: str, time_ms: int, now_ms: int) -> str | None:
        """None if the proof's time and nonce are new; else the refusal's reason."""
        skew = limits.auth_clock_skew_ms_max
        if abs(now_ms - time_ms) > skew or time_ms <= self.floor_ms:
            return "stale"
        while self.seen:
            oldest_nonce, oldest_time = next(iter(self.seen.items()))
            if oldest_time >= now_ms - skew and len(self.seen) < self.nonces_max:
                break
            del self.seen[oldest_nonce]
            if oldest_time >= now_ms - skew:  # forgotten while it could still be replayed
                self.floor_ms = max(self.floor_ms, oldest_time)
        if nonce_hex in self.seen:
            return "replayed"
        if time_ms <= self.floor_ms:
            return "stale"
        self.seen[nonce_hex] = time_ms
        # Kept in time order for the sweep above: a proof older than the newest is rare (clocks
        # of several clients), and moving it to its place would cost a scan; it is swept late.
        return None


Who = Credential | str  # a credential, or CLUSTER_PRINCIPAL


ClusterStored = bytes | tuple[bytes, ...] | None
"""The cluster principal's stored key, or one per secret a member accepts during a rotation of
the cluster secret (docs/security.md, "Rotating the cluster secret")."""


def _match_secret(
    table: CredentialsTable, cluster_stored: ClusterStored, name: str, message: bytes, proof: bytes
) -> tuple[Who | None, str | None]:
    if name == CLUSTER_PRINCIPAL:
        keys = (cluster_stored,) if isinstance(cluster_stored, bytes) else cluster_stored or ()
        if any(proof_matches(stored, message, proof) for stored in keys):
            return CLUSTER_PRINCIPAL, None
        return None, "bad_proof"
    credential = table.credentials.get(name)
    if credential is None:
        return None, "unknown"
    for stored in credential.secrets:  # the old and the new during a rotation
        if proof_matches(stored.stored_key, message, proof):
            return credential, None
    return None, "bad_proof"


def verify_http(
    table: CredentialsTable,
    cluster_stored: ClusterStored,
    header: str | None,
    method: str,
    path_qs: str,
    now_ms: int,
    window: NonceWindow,
) -> tuple[Who | None, str | None]:
    """Who the ``Authorization`` header proves, or None and the reason (None, None: no header)."""
    if header is None:
        return None, None
    match = _HEADER.fullmatch(header.strip())
    if match is None:
        return None, "malformed"
    name, time_text, nonce_hex, proof_hex = match.groups()
    time_ms = int(time_text)
    message = http_message(method, path_qs, time_ms, nonce_hex)
    who, reason = _match_secret(table, cluster_stored, name, message, bytes.fromhex(proof_hex))
    if who is None:
        return None, reason
    # The nonce is remembered only once the proof is good: strangers cannot fill the window.
    reason = window.admit(nonce_hex, time_ms, now_ms)
    return (None, reason) if reason else (who, None)


def verify_binary(
    table: CredentialsTable,
    cluster_stored: ClusterStored,
    cluster_uuid: bytes,
    server_nonce: bytes,
    client_nonce: bytes,
    name: str,
    proof: bytes,
) -> tuple[Who | None, str | None]:
    message = binary_message(cluster_uuid, server_nonce, client_nonce, name)
    return _match_secret(table, cluster_stored, name, message, proof)
