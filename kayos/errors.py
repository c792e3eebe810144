"""The one exception tree of Kayos.

Every error Kayos raises on purpose is a ``KayosError``. Third-party exceptions (OSError from the
disk, msgpack's, aiohttp's, lmdb's) are converted into one of these at the boundary where they
happen, so callers catch Kayos errors only. Each class carries ``code``: the stable, short name used
in wire error replies and in the HTTP API (``{"error": code, "message": ...}``).
"""

from __future__ import annotations

from typing import Literal


class KayosError(Exception):
    """Base of every error Kayos raises on purpose."""

    code = "kayos_error"


# --- input -------------------------------------------------------------------------------------


class InvalidRequest(KayosError):
    """The request is malformed or breaks a documented rule; nothing was changed."""

    code = "invalid_request"


class LimitExceeded(InvalidRequest):
    """An item, batch, key or name is larger than a bound in ``kayos.limits``."""

    code = "limit_exceeded"


class ProtocolError(KayosError):
    """Bytes from a peer do not follow the wire protocol. The connection is dead afterwards."""

    code = "protocol_error"


# --- storage -----------------------------------------------------------------------------------


class StorageError(KayosError):
    """The shard store could not do what was asked."""

    code = "storage_error"


class CorruptionError(StorageError):
    """Bytes on disk fail a check (CRC, magic, structure). ``offset`` names the first bad byte."""

    code = "corruption"

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        where = f" at offset {offset}" if offset >= 0 else ""
        super().__init__(f"{path}{where}: {message}" if path else f"{message}{where}")
        self.path = path
        self.offset = offset


class DiskFullError(StorageError):
    """The disk is full (ENOSPC). The commit failed cleanly; the store stays usable."""

    code = "disk_full"


class StoreClosedError(StorageError):
    """The store was closed, or poisoned by an earlier failed fsync, and must be reopened."""

    code = "store_closed"


class RollbackTooFarError(StorageError):
    """A rollback target lies below what compaction kept; the replica needs a full resync."""

    code = "rollback_too_far"


class SnapshotInvalidatedError(StorageError):
    """A pinned snapshot saw a rollback below its boundary; reopen a new snapshot."""

    code = "snapshot_invalidated"


class RetentionGapError(KayosError):
    """A consumer asked to read from below its queue's retention floor (docs/retention.md):
    what lies between its position and ``floor`` was given up by the queue's retention policy.
    It goes on by committing (or reading after) ``floor``."""

    code = "retention_gap"

    def __init__(self, message: str, *, floor: int = 0) -> None:
        super().__init__(message)
        self.floor = floor


# --- cluster -----------------------------------------------------------------------------------


class ReplicationError(KayosError):
    """Replication between chain members failed."""

    code = "replication_error"


class WrongRoleError(KayosError):
    """The node does not hold the role the request needs; ``redirect`` names the node that does."""

    code = "wrong_role"

    def __init__(self, message: str, *, redirect: str | None, epoch: int) -> None:
        super().__init__(message)
        self.redirect = redirect
        self.epoch = epoch


class OperationTimeoutError(KayosError):
    """An operation did not finish within its bound."""

    code = "timeout"


class UnavailableError(KayosError):
    """No node that can serve the request is reachable right now; retry later.

    ``failure`` tells a client's retry loop what happened (docs/node-api.md, "Clients"): None, a
    node said so (or none could be asked); ``"lost"``, the connection to the node failed, could
    not be opened or fell silent with the request on it; ``"abandoned"``, the client gave the
    request up because the node left the role it was sent for."""

    code = "unavailable"

    def __init__(
        self, message: str = "", *, failure: Literal["lost", "abandoned"] | None = None
    ) -> None:
        super().__init__(message)
        self.failure = failure


class StaleEpochError(KayosError):
    """An admin message names a topology epoch older than the node's (docs/node-api.md,
    "Topology changes"): it was decided on a view that has moved on; nothing was done."""

    code = "stale_epoch"


class DataLossError(KayosError):
    """A reader resumes from a seq the cluster no longer holds as committed (the cluster lost
    committed data or was re-created): the rows between can never be read (docs/spark.md)."""

    code = "data_loss"


class Unauthenticated(KayosError):
    """A replication peer could not prove the cluster secret, or this node has no identity."""

    code = "unauthenticated"


class WrongClusterError(Unauthenticated):
    """A peer, or a data directory, belongs to another cluster (another cluster id)."""

    code = "wrong_cluster"


class WrongPeerError(Unauthenticated):
    """A peer claims a node id that the topology does not place at the peer's address."""

    code = "wrong_peer"


class Forbidden(KayosError):
    """A client proved its credential, but it does not hold the role the request needs on its
    queue (docs/security.md, "Roles"): HTTP 403."""

    code = "forbidden"


class NotLeaderError(KayosError):
    """A manager member that does not lead was asked to change the view; ``redirect`` is the
    leader's HTTP URL when known (docs/manager.md, "HTTP endpoints")."""

    code = "not_leader"

    def __init__(self, message: str, *, redirect: str | None = None) -> None:
        super().__init__(message)
        self.redirect = redirect


# --- the host ------------------------------------------------------------------------------------


class DirectoryInUseError(KayosError):
    """Another process (or another open in this one) owns the directory: it holds the lock file's
    ``flock``. ``holder_pid`` is the pid that owner wrote into the file (None if unreadable)."""

    code = "directory_in_use"

    def __init__(self, message: str, *, path: str = "", holder_pid: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.holder_pid = holder_pid


class AddressInUseError(KayosError):
    """A port this process must listen on is taken; the message names it and the flag that moves
    it."""

    code = "address_in_use"

    def __init__(self, message: str, *, host: str = "", port: int = 0) -> None:
        super().__init__(message)
        self.host = host
        self.port = port


# --- the wire ------------------------------------------------------------------------------------

# Every error class by its wire code, built from this module, so a new class is mapped at once.
_CLASS_BY_CODE: dict[str, type[KayosError]] = {
    cls.code: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, KayosError)
}


def error_from_code(
    code: str,
    message: str,
    *,
    redirect: str | None = None,
    epoch: int = 0,
) -> KayosError:
    """The Kayos error for a wire ``code`` (an ``ERROR`` frame, an HTTP error body); an unknown
    code is a plain ``KayosError`` that keeps the code in its message (a newer peer may add
    codes)."""
    cls = _CLASS_BY_CODE.get(code)
    if cls is WrongRoleError:
        return WrongRoleError(message, redirect=redirect, epoch=epoch)
    if cls is NotLeaderError:
        return NotLeaderError(message, redirect=redirect)
    if cls is None or cls is CorruptionError:
        # CorruptionError takes keyword arguments a wire reply does not carry.
        return (cls or KayosError)(f"{code}: {message}" if cls is None else message)
    return cls(message)
