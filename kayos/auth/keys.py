"""A credential's secret, the key a node stores for it, and the proof that never sends the secret.

The scheme is SCRAM's (RFC 5802) without its round trip (docs/security.md, "Proving a
credential"): from the secret the client derives ``client_key = HMAC(PBKDF2(secret, salt, rounds),
"kayos client key")``; a node stores only ``stored_key = SHA256(client_key)``. A proof over a
message ``m`` is ``client_key XOR HMAC(stored_key, m)``: the node computes ``HMAC(stored_key, m)``,
XORs it off, and checks that the SHA-256 of what is left is ``stored_key``. The table a node holds
therefore lets nobody make a proof, and a proof seen on the wire is good for its one message only.

The secret's text form carries its salt and rounds, so a client needs only its name and this one
string: ``kc1.<rounds>.<salt hex>.<secret hex>``.

Pure: no I/O, no clock; randomness only where ``new_secret`` is given a ``random.Random``-like
source (``secrets`` by default).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Final

from kayos import limits
from kayos.errors import InvalidRequest

SECRET_PREFIX: Final = "kc1"  # noqa: S105 (the text form's version tag, not a secret)
CLIENT_KEY_LABEL: Final = b"kayos client key"
CLUSTER_KEY_LABEL: Final = b"kayos cluster credential"
PROOF_BYTES: Final = hashlib.sha256().digest_size
# The principal a proof under the cluster secret names: the manager and the nodes themselves.
CLUSTER_PRINCIPAL: Final = "@cluster"


@dataclass(frozen=True, slots=True)
class Secret:
    """A client's secret: what ``kayos ctl credentials add`` prints once and never stores."""

    rounds: int
    salt: bytes
    key: bytes = field(repr=False)

    def text(self) -> str:
        return f"{SECRET_PREFIX}.{self.rounds}.{self.salt.hex()}.{self.key.hex()}"

    def client_key(self) -> bytes:
        salted = hashlib.pbkdf2_hmac("sha256", self.key, self.salt, self.rounds)
        return hmac.new(salted, CLIENT_KEY_LABEL, hashlib.sha256).digest()

    def stored_key(self) -> bytes:
        return hashlib.sha256(self.client_key()).digest()


def new_secret(rounds: int = limits.credential_pbkdf2_rounds_min) -> Secret:
    """A fresh random secret."""
    return Secret(
        rounds,
        secrets.token_bytes(limits.credential_salt_bytes),
        secrets.token_bytes(limits.credential_secret_bytes),
    )


def parse_secret(text: str) -> Secret:
    """A secret from its text form; anything else is an ``InvalidRequest`` that never repeats
    the text (it may be a secret typed in the wrong place)."""
    parts = text.strip().split(".") if isinstance(text, str) else []
    problem = (
        "a secret reads kc1.<rounds>.<salt hex>.<secret hex> "
        "(as kayos ctl credentials add printed it)"
    )
    if len(parts) != 4 or parts[0] != SECRET_PREFIX or not parts[1].isdigit():
        raise InvalidRequest(problem)
    try:
        salt, key = bytes.fromhex(parts[2]), bytes.fromhex(parts[3])
    except ValueError:
        raise InvalidRequest(problem) from None
    rounds = int(parts[1])
    if (
        rounds < limits.credential_pbkdf2_rounds_min
        or rounds > 100 * limits.credential_pbkdf2_rounds_min
    ):
        raise InvalidRequest(f"a secret's rounds must be {limits.credential_pbkdf2_rounds_min}..")
    if len(salt) != limits.credential_salt_bytes or len(key) != limits.credential_secret_bytes:
        raise InvalidRequest(problem)
    return Secret(rounds, salt, key)


def cluster_client_key(cluster_secret: bytes) -> bytes:
    """The cluster principal's client key, derived from the cluster secret (already random and
    32 bytes: no stretching): every node and manager member holds it."""
    salted = hmac.new(cluster_secret, CLUSTER_KEY_LABEL, hashlib.sha256).digest()
    return hmac.new(salted, CLIENT_KEY_LABEL, hashlib.sha256).digest()


def cluster_stored_keys(cluster_secrets: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The cluster principal's stored key under each secret a member accepts (two during a
    rotation of the cluster secret, docs/security.md)."""
    return tuple(stored_key_of(cluster_client_key(secret)) for secret in cluster_secrets)


def stored_key_of(client_key: bytes) -> bytes:
    return hashlib.sha256(client_key).digest()


def make_proof(client_key: bytes, message: bytes) -> bytes:
    """The proof of ``message`` by the holder of ``client_key``."""
    signature = hmac.new(stored_key_of(client_key), message, hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def proof_matches(stored_key: bytes, message: bytes, proof: bytes) -> bool:
    """Whether ``proof`` proves ``message`` for the credential whose stored key is given."""
    if len(proof) != PROOF_BYTES or len(stored_key) != PROOF_BYTES:
        return False
    signature = hmac.new(stored_key, message, hashlib.sha256).digest()
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)
