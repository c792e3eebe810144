"""A cluster's identity: its id and the secret its members prove to each other.

Both live in the topology file (``cluster_id`` and ``secret`` at the top), which ``kayos up`` and
``kayos init`` write with file mode 0600. A node's data directory records the cluster id it first
ran with (``DIR/cluster_id``) and a node refuses to start with another: a data directory never
joins another cluster's chains. docs/replication-protocol.md ("Peer authentication") says how the
secret is proved; docs/node-api.md ("Topology file") what happens without one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from kayos import limits
from kayos.errors import InvalidRequest, WrongClusterError

DATA_DIR_FILE = "cluster_id"
# The file's keys for the second secret of a rotation (docs/security.md).
ROTATION_KEYS = ("next_secret", "previous_secret")
# Read and written by the owner only: the secret lets its holder join the cluster's chains.
TOPOLOGY_FILE_MODE = 0o600


@dataclass(slots=True)
class Keyring:
    """The secrets a member uses now: ``proving`` (what it proves and signs with) and
    ``accepted`` (what it accepts from peers and in signed messages: ``proving`` and, during a
    rotation, one other). Shared by every copy of one identity, and changed in place when the
    member re-reads its file (docs/security.md, "Rotating the cluster secret")."""

    proving: bytes
    accepted: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    """``cluster_id``: a UUID in its canonical text form; ``secret``: the raw shared key it
    started with; ``also``: a second secret accepted during a rotation (``next_secret`` or
    ``previous_secret`` in the file)."""

    cluster_id: str
    secret: bytes = field(repr=False)
    also: bytes | None = field(default=None, repr=False, compare=False)
    keyring: Keyring = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            canonical = str(uuid.UUID(self.cluster_id))
        except (ValueError, AttributeError, TypeError) as exc:
            raise InvalidRequest(f"cluster_id {self.cluster_id!r} is not a UUID") from exc
        if canonical != self.cluster_id:
            raise InvalidRequest(f"cluster_id {self.cluster_id!r}: write it as {canonical}")
        for key in (self.secret, self.also):
            if key is not None and (
                type(key) is not bytes or len(key) != limits.cluster_secret_bytes
            ):
                raise InvalidRequest(f"secret must be {limits.cluster_secret_bytes} bytes")
        accepted = (self.secret,) if self.also in (None, self.secret) else (self.secret, self.also)
        object.__setattr__(self, "keyring", Keyring(self.secret, accepted))

    @property
    def proving_secret(self) -> bytes:
        """The secret this member proves and signs with now."""
        return self.keyring.proving

    @property
    def accepted_secrets(self) -> tuple[bytes, ...]:
        """Every secret this member accepts now (the proving one first)."""
        return self.keyring.accepted

    def rekey(self, other: ClusterIdentity) -> None:
        """Takes ``other``'s secrets (the member's file read again) into this identity's keyring,
        which every copy of it shares; ``WrongClusterError`` for another cluster's file."""
        if other.cluster_id != self.cluster_id:
            raise WrongClusterError(
                f"the file now names cluster {other.cluster_id}, not {self.cluster_id}"
            )
        self.keyring.proving = other.keyring.proving
        self.keyring.accepted = other.keyring.accepted

    @classmethod
    def generate(cls) -> ClusterIdentity:
        return cls(str(uuid.uuid4()), secrets.token_bytes(limits.cluster_secret_bytes))

    @property
    def cluster_uuid(self) -> bytes:
        """The id's 16 bytes, as the handshake carries and MACs it."""
        return uuid.UUID(self.cluster_id).bytes

    @property
    def is_placeholder(self) -> bool:
        """The all-zero secret of the example files: known to everyone, so never used."""
        return not any(self.secret)

    @classmethod
    def from_data(cls, data: Any) -> ClusterIdentity | None:
        """The identity in a parsed topology file; None when it has neither key. One key without
        the other, or a malformed value, is an ``InvalidRequest``."""
        if not isinstance(data, dict):
            raise InvalidRequest("bad topology: not a table")
        cluster_id = data.get("cluster_id")
        secret = data.get("secret")
        if cluster_id is None and secret is None:
            return None
        if not isinstance(cluster_id, str) or not isinstance(secret, str):
            raise InvalidRequest(
                "bad topology: cluster_id and secret go together, both strings "
                "(run `kayos init` to write both)"
            )
        try:
            raw = bytes.fromhex(secret)
        except ValueError as exc:
            raise InvalidRequest("bad topology: secret is not hex") from exc
        return cls(cluster_id, raw, _second_secret(data))

    def toml_lines(self) -> list[str]:
        return [f'cluster_id = "{self.cluster_id}"', f'secret = "{self.secret.hex()}"']


def secret_prints(identity: ClusterIdentity) -> dict[str, Any]:
    """Short prints of the secrets a member uses (the first 8 hex digits of each one's SHA-256):
    what a rotation checks every member took, without the secrets themselves."""
    return {
        "proving": secret_print(identity.proving_secret),
        "accepted": [secret_print(key) for key in identity.accepted_secrets],
    }


def secret_print(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()[:8]


def _second_secret(data: dict[str, Any]) -> bytes | None:
    """``next_secret`` or ``previous_secret`` of a file in a rotation (at most one of them)."""
    given = [data[key] for key in ROTATION_KEYS if key in data]
    if not given:
        return None
    if len(given) > 1 or not isinstance(given[0], str):
        raise InvalidRequest("bad topology: at most one of next_secret and previous_secret, hex")
    try:
        return bytes.fromhex(given[0])
    except ValueError as exc:
        raise InvalidRequest("bad topology: next_secret/previous_secret is not hex") from exc


def check_data_dir(data_dir: str, identity: ClusterIdentity) -> None:
    """Records the cluster id in a new data directory; refuses one that belongs to another
    cluster (``WrongClusterError``). The record is written and fsynced before the node serves."""
    path = os.path.join(data_dir, DATA_DIR_FILE)
    try:
        with open(path, encoding="ascii") as handle:
            recorded = handle.read().strip()
    except FileNotFoundError:
        recorded = None
    if recorded is not None:
        if recorded != identity.cluster_id:
            raise WrongClusterError(
                f"data directory {data_dir} belongs to cluster {recorded}, but the topology file "
                f"is for cluster {identity.cluster_id}: a node never joins another cluster's "
                "chains with its data (use the right file or a fresh directory)"
            )
        return
    os.makedirs(data_dir, exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="ascii") as handle:
        handle.write(identity.cluster_id + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_private(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` readable by the owner only (mode 0600, also when replacing)."""
    temporary = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, TOPOLOGY_FILE_MODE)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, TOPOLOGY_FILE_MODE)
    os.replace(temporary, path)
