"""A client's credential: its name and the client key derived from its secret (the secret itself
is dropped once derived), and the proofs it makes (kayos/auth/proof.py).

A credentials file is JSON, ``{"name": "...", "secret": "kc1...."}``, as ``kayos ctl credentials
add --out FILE`` writes it (mode 0600). Every client, the command line, the Spark source and sink
and the Kestrel front take one; a client given none reads the file ``KAYOS_CREDENTIALS`` names,
if set. Without either it sends no proof, which an open cluster takes.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Final

from kayos.auth.keys import CLUSTER_PRINCIPAL, cluster_client_key, make_proof, parse_secret
from kayos.auth.proof import binary_message, http_authorization
from kayos.auth.table import check_credential_name
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import InvalidRequest
from kayos.replication.wire.frames import ClientProof

CREDENTIALS_ENV: Final = "KAYOS_CREDENTIALS"
_NONCE_BYTES: Final = 16
_FILE_BYTES_MAX: Final = 4096


@dataclass(frozen=True, slots=True)
class ClientCredential:
    """``name`` and the key its proofs are made with (never shown: ``repr`` leaves it out)."""

    name: str
    client_key: bytes = field(repr=False)
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False, compare=False)

    @classmethod
    def of_cluster(cls, cluster_secret: bytes) -> ClientCredential:
        """The cluster's own principal (the manager's polls of its nodes)."""
        return cls(CLUSTER_PRINCIPAL, cluster_client_key(cluster_secret))

    def http_authorization(self, method: str, path_qs: str) -> str:
        """The ``Authorization`` header of one request (a fresh nonce each time)."""
        now_ms = int(self.clock.now_s() * 1000)
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return http_authorization(self.name, self.client_key, method, path_qs, now_ms, nonce)

    def binary_proof(self, cluster_uuid: bytes, server_nonce: bytes) -> ClientProof:
        nonce = secrets.token_bytes(len(server_nonce))
        message = binary_message(cluster_uuid, server_nonce, nonce, self.name)
        return ClientProof(self.name, nonce, make_proof(self.client_key, message))


_LOADED: dict[tuple[str, int, int, int], ClientCredential] = {}


def load_credential(path: str) -> ClientCredential:
    """The credential in ``path`` (``InvalidRequest`` naming the file, never its secret). The
    key derivation runs once per file version in a process."""
    try:
        status = os.stat(path)
        key = (os.path.abspath(path), status.st_ino, status.st_mtime_ns, status.st_size)
        if key in _LOADED:
            return _LOADED[key]
        with open(path, "rb") as handle:
            raw = handle.read(_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise InvalidRequest(f"credentials file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw) if len(raw) <= _FILE_BYTES_MAX else None
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or set(data) != {"name", "secret"}:
        raise InvalidRequest(
            f'credentials file {path}: expected {{"name": ..., "secret": ...}} '
            "(kayos ctl credentials add --out writes one)"
        )
    name = check_credential_name(data["name"])
    try:
        secret = parse_secret(data["secret"])
    except InvalidRequest as exc:
        raise InvalidRequest(f"credentials file {path}: {exc}") from None
    credential = ClientCredential(name, secret.client_key())
    _LOADED[key] = credential
    return credential


class CredentialSource:
    """Where a client's credential comes from: one given, or a file (named, or by
    ``KAYOS_CREDENTIALS`` when none is given) read again whenever it changes, so a client
    follows a rotation when its file is rewritten (docs/security.md, "Rotating a credential")."""

    def __init__(self, given: ClientCredential | str | None) -> None:
        self.fixed = given if isinstance(given, ClientCredential) else None
        self.path: str | None = None
        if not isinstance(given, ClientCredential):
            self.path = given or os.environ.get(CREDENTIALS_ENV) or None
        if self.path is not None:
            load_credential(self.path)  # a wrong file fails now, not at the first request

    def current(self) -> ClientCredential | None:
        if self.path is None:
            return self.fixed
        return load_credential(self.path)


def credential_from(given: ClientCredential | str | None) -> ClientCredential | None:
    """A credential, a file's path, or None: then ``KAYOS_CREDENTIALS``'s file if it is set."""
    return CredentialSource(given).current()
