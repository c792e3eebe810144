"""What the Kestrel front asks of persistence: a narrow, async backend interface shaped like Kayos.

The mapping (docs/kestrel-compat.md, "Persistence"):

- Every Kestrel master queue ``m`` is one *log*: an append-only sequence of entries with increasing
  seqs (Kayos: one queue; seqs may have gaps, since a Kayos shard numbers many queues together).
- ``m`` itself and every fanout child ``m+c`` is one *group* on log ``m`` (Kayos: a consumer
  group). An entry names the groups it was added for (``groups``), so a child never sees entries
  from before it existed, a ``set`` straight to a child reaches only that child, and a full child
  simply is not named.
- A group's durable state is a high-water mark (every seq <= hwm is gone for this group) plus a
  small opaque blob, which the front uses for seqs above the hwm removed out of order (while an
  earlier read was still open). Open reads are not durable: after a crash they are live again,
  which is Kestrel's at-least-once.

The front reads a log at start-up (recovery) and to page in the items of a queue in read-behind
(docs/kestrel-compat.md section 10); everything else is served from memory.
Implementations (``kestrel_compat.backends``) must keep appends to one log in call order. A
backend whose calls never wait (they finish without suspending, as ``MemoryBackend``'s do) may say
so with a class attribute ``completes_at_once = True``: the front then makes its calls in the
caller, outside any task (``kestrel_compat.backends.persister``), which saves a task and a turn of
the event loop per ``set``.

The core declares this surface because its queues describe their changes in its records
(``NewEntry``, ``GroupState`` and the group blob below); the backends implement it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from kayos.errors import StorageError
from kestrel_compat import limits


class BackendError(StorageError):
    """The backend failed an operation; the front answers the client as a server failure."""

    code = "kestrel_backend"


@dataclass(frozen=True, slots=True)
class NewEntry:
    """One item to append. ``expiry_ms``: absolute Unix ms as the client asked (None: never);
    ``groups``: the groups (Kestrel queues) that hold the item."""

    value: bytes
    add_ms: int
    expiry_ms: int | None
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """An appended entry as read back."""

    seq: int
    value: bytes
    add_ms: int
    expiry_ms: int | None
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupState:
    hwm: int
    blob: bytes


class Backend(Protocol):
    """The whole persistence surface of the Kestrel front."""

    async def append(self, log: str, entries: list[NewEntry]) -> list[int]:
        """Append durably, in order; return the seqs assigned (increasing)."""

    async def read(self, log: str, after_seq: int, limit: int) -> list[Entry]:
        """Up to ``limit`` entries with seq > ``after_seq``, in seq order."""

    async def commit_group(self, log: str, group: str, state: GroupState) -> None:
        """Store a group's state, creating the group if needed."""

    async def load_group(self, log: str, group: str) -> GroupState | None:
        """A group's last committed state; None if the group does not exist."""

    async def list_logs(self) -> list[str]: ...

    async def list_groups(self, log: str) -> list[str]: ...

    async def delete_group(self, log: str, group: str) -> None:
        """Forget a group; a missing group is not an error."""

    async def delete_log(self, log: str) -> None:
        """Drop a log, its entries and its groups; a missing log is not an error."""

    async def last_seq(self, log: str) -> int:
        """The highest seq ever assigned in ``log`` (0 if none)."""

    async def close(self) -> None: ...


# --- the group blob: removed seqs above the hwm --------------------------------------------------

_BLOB_VERSION = 1
_HEADER = struct.Struct("<BI")  # version, count of seqs


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_removed(hwm: int, removed: list[int]) -> bytes:
    """Blob for the seqs above ``hwm`` removed out of order: sorted deltas as varints.

    At most ``limits.group_blob_bytes_max`` bytes. When more seqs are removed than fit, the
    highest are left out: after a crash those items come back once more (at-least-once), which
    is the same promise an open read gets, and far better than an unbounded write per commit.
    """
    if not removed:
        return _EMPTY_BLOB
    seqs = sorted(seq for seq in removed if seq > hwm)
    body = bytearray()
    previous = hwm
    count = 0
    for seq in seqs:
        chunk = _varint(seq - previous)
        if _HEADER.size + len(body) + len(chunk) > limits.group_blob_bytes_max:
            break
        body += chunk
        previous = seq
        count += 1
    return _HEADER.pack(_BLOB_VERSION, count) + bytes(body)


_EMPTY_BLOB = _HEADER.pack(_BLOB_VERSION, 0)


def decode_removed(hwm: int, blob: bytes) -> set[int]:
    """The removed seqs an ``encode_removed`` blob holds; an empty blob holds none."""
    if not blob:
        return set()
    if len(blob) < _HEADER.size:
        raise BackendError("group blob is shorter than its header")
    version, count = _HEADER.unpack_from(blob)
    if version != _BLOB_VERSION:
        raise BackendError(f"group blob version {version} is not {_BLOB_VERSION}")
    seqs: set[int] = set()
    position = _HEADER.size
    previous = hwm
    for _ in range(count):
        delta = 0
        shift = 0
        while True:
            if position >= len(blob):
                raise BackendError("group blob ends inside a varint")
            byte = blob[position]
            position += 1
            delta |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        previous += delta
        seqs.add(previous)
    return seqs
