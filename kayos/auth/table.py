"""The credentials table: every client identity a cluster knows, its roles per queue pattern and
the stored keys of its secrets (never a secret itself), as docs/security.md ("The credentials
table") gives its JSON.

A table has a ``version``; every change makes the next one, and a node takes a table only at a
higher version than it holds (``POST /v1/admin/credentials``), so pushes that cross each other
settle on the newest. The edits an operator makes (``kayos ctl credentials add``, ``rotate``,
``finish``, ``remove``) are the pure functions here. A table with credentials always keeps one
that holds ``admin`` on every queue (``*``): no edit can lock the operators out.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field, replace
from typing import Any, Final

from kayos import limits
from kayos.auth.keys import Secret
from kayos.errors import InvalidRequest, LimitExceeded

ROLES: Final = ("produce", "consume", "admin")
TABLE_FORMAT: Final = 1
_NAME_CHARS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@:"
)


def check_credential_name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not 1 <= len(name) <= limits.credential_name_chars_max
        or not set(name) <= _NAME_CHARS
        or name.startswith("@")
    ):
        raise InvalidRequest(
            f"a credential name is 1..{limits.credential_name_chars_max} of a-z A-Z 0-9 - _ . @ :"
            " and does not start with @ (kept for the cluster's own)"
        )
    return name


@dataclass(frozen=True, slots=True)
class Grant:
    """Roles on the queues whose names match ``pattern`` (fnmatch: ``*``, ``?``, ``[...]``)."""

    pattern: str
    roles: frozenset[str]

    def covers(self, role: str, queue: str | None) -> bool:
        """``queue`` None: the role on every queue (only the pattern ``*`` covers that)."""
        if role not in self.roles:
            return False
        if queue is None:
            return self.pattern == "*"
        return fnmatch.fnmatchcase(queue, self.pattern)

    def to_json(self) -> dict[str, Any]:
        return {"queues": self.pattern, "roles": sorted(self.roles)}


@dataclass(frozen=True, slots=True)
class StoredSecret:
    """What a node keeps of one secret: enough to check a proof, never enough to make one."""

    rounds: int
    salt: bytes
    stored_key: bytes = field(repr=False)

    @classmethod
    def of(cls, secret: Secret) -> StoredSecret:
        return cls(secret.rounds, secret.salt, secret.stored_key())

    def to_json(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "salt": self.salt.hex(), "stored_key": self.stored_key.hex()}


@dataclass(frozen=True, slots=True)
class Credential:
    """One identity: its grants, its one or two secrets (two during a rotation, oldest first),
    and the certificate subject name that stands in for it over TLS (None: none does)."""

    name: str
    grants: tuple[Grant, ...]
    secrets: tuple[StoredSecret, ...]
    certificate: str | None = None

    def allows(self, role: str, queue: str | None, *, any_queue: bool = False) -> bool:
        if any_queue:
            return any(role in grant.roles for grant in self.grants)
        return any(grant.covers(role, queue) for grant in self.grants)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "grants": [grant.to_json() for grant in self.grants],
            "secrets": [stored.to_json() for stored in self.secrets],
        }
        if self.certificate is not None:
            document["certificate"] = self.certificate
        return document

    def summary(self) -> dict[str, Any]:
        """What status and ``kayos ctl credentials list`` show: no key material."""
        return {
            "name": self.name,
            "grants": [grant.to_json() for grant in self.grants],
            "secrets": len(self.secrets),
            "rotating": len(self.secrets) > 1,
            "certificate": self.certificate,
        }


@dataclass(frozen=True, slots=True)
class CredentialsTable:
    version: int = 0
    credentials: dict[str, Credential] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        """No credentials: the cluster runs open, every request allowed (docs/security.md)."""
        return not self.credentials

    def by_certificate(self, subject: str) -> Credential | None:
        for credential in self.credentials.values():
            if credential.certificate is not None and credential.certificate == subject:
                return credential
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "version": self.version,
            "credentials": {name: c.to_json() for name, c in sorted(self.credentials.items())},
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, indent=1).encode()

    def summary(self) -> dict[str, Any]:
        return {
            "mode": "open" if self.is_open else "credentials",
            "version": self.version,
            "credentials": [c.summary() for _, c in sorted(self.credentials.items())],
        }


def parse_grants(raw: Any) -> tuple[Grant, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= limits.credential_grants_max:
        raise InvalidRequest(f"grants: a list of 1..{limits.credential_grants_max} grants")
    grants = []
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"queues", "roles"}:
            raise InvalidRequest('a grant is {"queues": "<pattern>", "roles": [...]}')
        pattern, roles = item["queues"], item["roles"]
        if (
            not isinstance(pattern, str)
            or not 1 <= len(pattern) <= 256
            or not pattern.isprintable()
        ):
            raise InvalidRequest("a grant's queues is a pattern of 1..256 printable characters")
        if not isinstance(roles, list) or not roles or not set(roles) <= set(ROLES):
            raise InvalidRequest(f"a grant's roles are some of {', '.join(ROLES)}")
        grants.append(Grant(pattern, frozenset(roles)))
    return tuple(grants)


def parse_grant_text(text: str) -> Grant:
    """``ROLE[+ROLE...]=PATTERN`` (the command line's ``--grant produce+consume=orders.*``)."""
    roles, equals, pattern = text.partition("=")
    if not equals:
        raise InvalidRequest(
            f"a grant reads ROLE[+ROLE]=PATTERN, e.g. produce=orders.*, not {text!r}"
        )
    return parse_grants([{"queues": pattern, "roles": roles.split("+")}])[0]


def _parse_stored(raw: Any) -> StoredSecret:
    if not isinstance(raw, dict) or set(raw) != {"rounds", "salt", "stored_key"}:
        raise InvalidRequest("a stored secret is {rounds, salt, stored_key}")
    try:
        salt, key = bytes.fromhex(raw["salt"]), bytes.fromhex(raw["stored_key"])
    except (ValueError, TypeError):
        raise InvalidRequest("a stored secret's salt and stored_key are hex") from None
    rounds = raw["rounds"]
    if type(rounds) is not int or rounds < limits.credential_pbkdf2_rounds_min or len(key) != 32:
        raise InvalidRequest("a stored secret has too few rounds or a malformed key")
    return StoredSecret(rounds, salt, key)


def parse_table(data: Any) -> CredentialsTable:
    """A table from its JSON document (``InvalidRequest`` naming what is wrong)."""
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise InvalidRequest(f"a credentials table is a JSON object with format {TABLE_FORMAT}")
    version, raw = data.get("version"), data.get("credentials")
    if type(version) is not int or version < 0 or not isinstance(raw, dict):
        raise InvalidRequest("a credentials table has version >= 0 and a credentials object")
    if len(raw) > limits.credentials_max:
        raise LimitExceeded(f"at most {limits.credentials_max} credentials (credentials_max)")
    credentials = {}
    for name, item in raw.items():
        check_credential_name(name)
        if not isinstance(item, dict) or not {"grants", "secrets"} <= set(item) <= {
            "grants",
            "secrets",
            "certificate",
        }:
            raise InvalidRequest(f"credential {name}: grants, secrets and maybe certificate")
        stored = item["secrets"]
        if not isinstance(stored, list) or not 1 <= len(stored) <= limits.credential_secrets_max:
            raise InvalidRequest(f"credential {name}: 1 or 2 secrets")
        certificate = item.get("certificate")
        if certificate is not None and (not isinstance(certificate, str) or not certificate):
            raise InvalidRequest(f"credential {name}: certificate is a subject name")
        credentials[name] = Credential(
            name, parse_grants(item["grants"]), tuple(map(_parse_stored, stored)), certificate
        )
    table = CredentialsTable(version, credentials)
    _check_admin_kept(table)
    return table


def decode_table(raw: bytes) -> CredentialsTable:
    if len(raw) > limits.credentials_table_bytes_max:
        raise LimitExceeded("credentials table over credentials_table_bytes_max")
    try:
        return parse_table(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the credentials table is not JSON: {exc}") from None


def _check_admin_kept(table: CredentialsTable) -> None:
    if table.is_open:
        return
    if not any(c.allows("admin", None) for c in table.credentials.values()):
        raise InvalidRequest(
            "a table with credentials keeps at least one with admin on every queue (*): "
            "without one, no operator could change it again"
        )


def _changed(table: CredentialsTable, credentials: dict[str, Credential]) -> CredentialsTable:
    changed = CredentialsTable(table.version + 1, credentials)
    if len(credentials) > limits.credentials_max:
        raise LimitExceeded(f"at most {limits.credentials_max} credentials (credentials_max)")
    _check_admin_kept(changed)
    return changed


def add_credential(
    table: CredentialsTable,
    name: str,
    grants: tuple[Grant, ...],
    secret: Secret,
    certificate: str | None = None,
) -> CredentialsTable:
    check_credential_name(name)
    if name in table.credentials:
        raise InvalidRequest(f"credential {name} exists (rotate its secret, or remove it first)")
    if not grants:
        raise InvalidRequest("a credential needs at least one grant")
    credential = Credential(name, grants, (StoredSecret.of(secret),), certificate)
    return _changed(table, {**table.credentials, name: credential})


def _existing(table: CredentialsTable, name: str) -> Credential:
    credential = table.credentials.get(name)
    if credential is None:
        raise InvalidRequest(f"no credential {name}")
    return credential


def rotate_credential(table: CredentialsTable, name: str, secret: Secret) -> CredentialsTable:
    """Adds a second secret: both are taken until ``finish_rotation``."""
    credential = _existing(table, name)
    if len(credential.secrets) >= limits.credential_secrets_max:
        raise InvalidRequest(f"credential {name} is already rotating: finish it first")
    rotated = replace(credential, secrets=(*credential.secrets, StoredSecret.of(secret)))
    return _changed(table, {**table.credentials, name: rotated})


def finish_rotation(table: CredentialsTable, name: str) -> CredentialsTable:
    """Keeps only the newest secret: the old one is refused from now on."""
    credential = _existing(table, name)
    if len(credential.secrets) < 2:
        raise InvalidRequest(f"credential {name} is not rotating")
    finished = replace(credential, secrets=credential.secrets[-1:])
    return _changed(table, {**table.credentials, name: finished})


def remove_credential(table: CredentialsTable, name: str) -> CredentialsTable:
    _existing(table, name)
    rest = {key: value for key, value in table.credentials.items() if key != name}
    return _changed(table, rest)
