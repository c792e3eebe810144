"""Wire frames of the replication links and the client hot path: a declared table and a codec.

``docs/replication-protocol.md`` is the normative description; this module is its executable form.
A frame on the wire is ``u32 big-endian length`` (of what follows) + ``u8 kind`` + one msgpack
array holding the frame's fields in table order.

The codec is sans-IO: ``encode`` turns a frame into bytes and ``FrameDecoder.feed`` turns bytes into
frames. It imports no asyncio, socket or clock; which frame is legal when is the business of the
stream and chain logic.

Every frame is a frozen dataclass that validates its fields against ``FRAME_TABLE`` when built, so
an instance is well-formed whether it was decoded or built locally: a bad local frame raises
``InvalidRequest``, and the decoder turns the same failure into ``ProtocolError``.

Column fields (``BATCH`` and ``PRODUCE`` entries) pass through msgpack untouched as tuples, and
their checks run in C (``frozenset.issuperset(map(type, column))``, ``min``, ``max``): no Python
bytecode runs per entry, except for the per-entry headers maps msgpack itself builds.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import struct
from collections.abc import Callable
from typing import Final, Self, TypeAlias

import msgpack

from kayos import limits
from kayos.errors import InvalidRequest, LimitExceeded, ProtocolError

__all__ = [
    "ACKS_ALL",
    "ACKS_HEAD",
    "ACKS_NONE",
    "FRAME_TABLE",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_MIN",
    "ROLES",
    "Ack",
    "AuthChallenge",
    "AuthOk",
    "AuthProof",
    "Batch",
    "CommitPoint",
    "Committed",
    "CommittedReply",
    "Confirm",
    "Confirmed",
    "ErrorFrame",
    "FieldSpec",
    "Frame",
    "FrameDecoder",
    "FrameSpec",
    "Hello",
    "HelloOk",
    "Ping",
    "Pong",
    "Produce",
    "Produced",
    "Subscribe",
    "Subscribed",
    "WaitCommitted",
    "WireType",
    "decode",
    "encode",
]

# The highest protocol version this build speaks, and the lowest it still accepts in a handshake.
PROTOCOL_VERSION: Final = 5
PROTOCOL_VERSION_MIN: Final = 1
# Replication links need both sides at this version or later: version 2 forwards before it
# persists and carries the commit point down the chain, version 3 authenticates both sides of a
# link, version 4 confirms a snapshot below the head up to a head holding a lease (CONFIRM,
# docs/replication-protocol.md "Confirming a snapshot"), version 5's SUBSCRIBE names the
# downstream's commit point (a head that lost committed entries repairs instead of ordering a
# rollback: "An upstream that lacks committed entries").
LINK_PROTOCOL_VERSION_MIN: Final = 5

# HELLO's role field: a client, the connector's role in the shard's chain, or a copy that counts
# in no commit: a learner (a node outside the chain catching up) or a member repairing its store.
CHAIN_ROLES: Final = frozenset({"head", "middle", "tail"})
COPY_ROLES: Final = frozenset({"learner", "repair"})
ROLES: Final = frozenset({"client"}) | CHAIN_ROLES | COPY_ROLES

# PRODUCE's acks field, Kafka's numbering: answer when accepted, durable on the head, or committed.
ACKS_NONE: Final = 0
ACKS_HEAD: Final = 1
ACKS_ALL: Final = -1

# The prefix before every body: the length of what follows it (kind byte + body), then the kind.
_PREFIX: Final = struct.Struct(">IB")
_LENGTH: Final = struct.Struct(">I")
_LENGTH_BYTES: Final = _LENGTH.size
# The smallest frame is a kind byte and a one-byte msgpack array.
_FRAME_BYTES_MIN: Final = 2

_U64_END: Final = 1 << 64
_UUID_BYTES: Final = 16
# An HMAC-SHA256 digest.
MAC_BYTES: Final = 32

TakeoverEntry: TypeAlias = tuple[bytes, int]
Headers: TypeAlias = dict[str, bytes]
MetaValue: TypeAlias = int | bytes | None


# --- field types ---------------------------------------------------------------------------------

_INT_TYPES: Final[frozenset[type]] = frozenset({int})
_BYTES_TYPES: Final[frozenset[type]] = frozenset({bytes})
_BYTES_OR_NONE_TYPES: Final[frozenset[type]] = frozenset({bytes, type(None)})
_DICT_OR_NONE_TYPES: Final[frozenset[type]] = frozenset({dict, type(None)})
_STR_TYPES: Final[frozenset[type]] = frozenset({str})
_META_VALUE_TYPES: Final[frozenset[type]] = frozenset({int, bytes, type(None)})


@dataclasses.dataclass(frozen=True, slots=True)
class WireType:
    """One field type of the table: its name in the protocol document and its check.

    ``arrays_max`` and ``maps_max`` say how many msgpack arrays and maps a value of this type may
    decode into; the decoder refuses a body that builds more containers than its frame's fields
    allow, so a small frame cannot make msgpack allocate an unbounded number of objects.
    """

    name: str
    check: Callable[[object], bool]
    arrays_max: int = 0
    maps_max: int = 0


def _unsigned(bits: int) -> Callable[[object], bool]:
    end = 1 << bits

    def check(value: object) -> bool:
        return type(value) is int and 0 <= value < end

    return check


def _optional(wire: WireType) -> WireType:
    def check(value: object) -> bool:
        return value is None or wire.check(value)

    return WireType(f"{wire.name} | nil", check, wire.arrays_max, wire.maps_max)


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_role(value: object) -> bool:
    return type(value) is str and value in ROLES


def _is_acks(value: object) -> bool:
    return type(value) is int and value in (ACKS_NONE, ACKS_HEAD, ACKS_ALL)


def _is_column(value: object, element_types: frozenset[type]) -> bool:
    # issuperset over map(type, ...) runs in C and stops at the first stray type.
    return (
        type(value) is tuple
        and len(value) <= limits.batch_entries_max
        and element_types.issuperset(map(type, value))
    )


def _is_u64_column(value: object) -> bool:
    if not _is_column(value, _INT_TYPES):
        return False
    assert isinstance(value, tuple)
    return not value or (min(value) >= 0 and max(value) < _U64_END)


def _is_bytes_column(value: object) -> bool:
    return _is_column(value, _BYTES_TYPES)


def _is_optional_bytes_column(value: object) -> bool:
    return _is_column(value, _BYTES_OR_NONE_TYPES)


def _is_headers_column(value: object) -> bool:
    if not _is_column(value, _DICT_OR_NONE_TYPES):
        return False
    assert isinstance(value, tuple)
    # filter(None, ...) skips nil and empty maps; iterating a map yields its keys.
    maps = tuple(filter(None, value))
    header_names = itertools.chain.from_iterable(maps)
    if not _STR_TYPES.issuperset(map(type, header_names)):
        return False
    header_values = itertools.chain.from_iterable(map(dict.values, maps))
    return _BYTES_TYPES.issuperset(map(type, header_values))


def _is_takeover_table(value: object) -> bool:
    if type(value) is not tuple or len(value) > limits.takeover_table_entries_max:
        return False
    previous_seq = 0
    for entry in value:
        if type(entry) is not tuple or len(entry) != 2:
            return False
        master_uuid, seq = entry
        if type(master_uuid) is not bytes or len(master_uuid) != _UUID_BYTES:
            return False
        if type(seq) is not int or not previous_seq <= seq < _U64_END:
            return False
        previous_seq = seq
    # The divergence rule looks masters up by uuid, so each may appear once.
    return len({master_uuid for master_uuid, _ in value}) == len(value)


def _is_meta(value: object) -> bool:
    if type(value) is not dict or len(value) > limits.frame_meta_entries_max:
        return False
    if not _STR_TYPES.issuperset(map(type, value)):
        return False
    if not _META_VALUE_TYPES.issuperset(map(type, value.values())):
        return False
    return all(0 <= item < _U64_END for item in value.values() if type(item) is int)


def _exact_bytes(size: int) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        return type(value) is bytes and len(value) == size

    return check


_U16: Final = WireType("u16", _unsigned(16))
_UUID: Final = WireType("uuid", _exact_bytes(_UUID_BYTES))
_NONCE: Final = WireType("nonce", _exact_bytes(limits.auth_nonce_bytes))
_MAC: Final = WireType("mac", _exact_bytes(MAC_BYTES))
_U32: Final = WireType("u32", _unsigned(32))
_U64: Final = WireType("u64", _unsigned(64))
_BOOL: Final = WireType("bool", _is_bool)
_STR: Final = WireType("str", _is_str)
_ROLE: Final = WireType("role", _is_role)
_ACKS: Final = WireType("acks (0, 1 or -1)", _is_acks)
_U64_COLUMN: Final = WireType("[u64]", _is_u64_column, arrays_max=1)
_BYTES_COLUMN: Final = WireType("[bin]", _is_bytes_column, arrays_max=1)
_VALUES_COLUMN: Final = WireType("[bin | nil]", _is_optional_bytes_column, arrays_max=1)
_HEADERS_COLUMN: Final = WireType(
    "[headers | nil]", _is_headers_column, arrays_max=1, maps_max=limits.batch_entries_max
)
_TAKEOVER: Final = WireType(
    "takeover", _is_takeover_table, arrays_max=1 + limits.takeover_table_entries_max
)
_META: Final = WireType("meta", _is_meta, maps_max=1)


def _is_snapshot_data(value: object) -> bool:
    return type(value) is bytes and 0 < len(value) <= limits.snapshot_chunk_bytes_max


_SNAPSHOT_DATA: Final = WireType("bin (1 .. snapshot_chunk_bytes_max)", _is_snapshot_data)


# --- the frames ----------------------------------------------------------------------------------


class _FrameBase:
    """Validation shared by every frame: each field against the table, then cross-field rules."""

    __slots__ = ()

    def __post_init__(self) -> None:
        spec = _SPEC_BY_TYPE[type(self)]
        for field in spec.fields:
            value = getattr(self, field.name)
            if not field.wire.check(value):
                raise InvalidRequest(
                    f"{spec.name}.{field.name}: expected {field.wire.name}, got {_describe(value)}"
                )
        problem = self._relation_problem()
        if problem is not None:
            raise InvalidRequest(f"{spec.name}: {problem}")

    def _relation_problem(self) -> str | None:
        """Name the first broken rule between fields, or None; frames with such rules override."""
        return None

    @classmethod
    def unchecked(cls, *values: object) -> Self:
        """A frame built from parts already checked (a head's batch from columns the store's
        checks passed, a merge of such batches), without running the checks again: they cost
        as much per entry as the rest of the hot path. Every peer still checks what it decodes.
        Never for anything that came from outside the process."""
        frame = object.__new__(cls)
        for name, value in zip(_FIELD_NAMES_BY_TYPE[cls], values, strict=True):
            object.__setattr__(frame, name, value)
        return frame


@dataclasses.dataclass(frozen=True, slots=True)
class Hello(_FrameBase):
    """First frame of every connection: who the connector is and what it acts on."""

    protocol_version: int
    node_id: str
    shard: int | None
    epoch: int
    role: str

    def _relation_problem(self) -> str | None:
        return "protocol_version 0 does not exist" if self.protocol_version == 0 else None


@dataclasses.dataclass(frozen=True, slots=True)
class HelloOk(_FrameBase):
    """The acceptor takes the connection; both sides use ``protocol_version`` from now on."""

    protocol_version: int
    node_id: str
    epoch: int

    def _relation_problem(self) -> str | None:
        return "protocol_version 0 does not exist" if self.protocol_version == 0 else None


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorFrame(_FrameBase):
    """A request (or, with ``request_id`` None, the whole connection) failed."""

    request_id: int | None
    code: str
    message: str
    redirect: str | None
    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ping(_FrameBase):
    """Liveness probe; ``nonce`` grows strictly per connection and sender."""

    nonce: int


@dataclasses.dataclass(frozen=True, slots=True)
class Pong(_FrameBase):
    """Answers the ``Ping`` with the same nonce."""

    nonce: int


@dataclasses.dataclass(frozen=True, slots=True)
class Confirm(_FrameBase):
    """A downstream asks whether the chain above it is whole up to a head holding its lease;
    ``nonce`` grows strictly per link and sender."""

    nonce: int


@dataclasses.dataclass(frozen=True, slots=True)
class Confirmed(_FrameBase):
    """Answers the ``Confirm`` with the same nonce: ``held`` or not."""

    nonce: int
    held: bool


@dataclasses.dataclass(frozen=True, slots=True)
class AuthChallenge(_FrameBase):
    """The acceptor of a replication link asks the connector to prove the cluster secret."""

    cluster_id: bytes
    nonce: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class AuthProof(_FrameBase):
    """The connector's cluster id, its nonce and its HMAC over both nonces and the link."""

    cluster_id: bytes
    nonce: bytes
    mac: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class AuthOk(_FrameBase):
    """The acceptor's HMAC: it knows the secret too."""

    mac: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Subscribe(_FrameBase):
    """A downstream asks its upstream for the shard's log from ``from_seq`` on."""

    shard: int
    from_seq: int
    takeover_table: tuple[TakeoverEntry, ...]
    commit_point: int = 0

    def _relation_problem(self) -> str | None:
        return "from_seq must be at least 1" if self.from_seq == 0 else None


@dataclasses.dataclass(frozen=True, slots=True)
class Subscribed(_FrameBase):
    """The upstream's divergence verdict, its takeover table and its last seq."""

    shard: int
    rollback_to: int | None
    takeover_table: tuple[TakeoverEntry, ...]
    last_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Batch(_FrameBase):
    """A run of log entries covering ``first_seq..last_seq``, applied as one store commit."""

    shard: int
    first_seq: int
    last_seq: int
    txn: bool
    seqs: tuple[int, ...]
    keys: tuple[bytes, ...]
    values: tuple[bytes | None, ...]
    expiries_ms: tuple[int, ...] | None
    headers: tuple[Headers | None, ...] | None
    meta: dict[str, MetaValue] | None

    def _relation_problem(self) -> str | None:
        if not 1 <= self.first_seq <= self.last_seq:
            return f"range {self.first_seq}..{self.last_seq} is empty or starts at 0"
        problem = _columns_problem(
            seqs=self.seqs,
            keys=self.keys,
            values=self.values,
            expiries_ms=self.expiries_ms,
            headers=self.headers,
        )
        if problem is not None or not self.seqs:
            return problem
        if not self.first_seq <= self.seqs[0] <= self.seqs[-1] <= self.last_seq:
            return f"seqs {self.seqs[0]}..{self.seqs[-1]} leave {self.first_seq}..{self.last_seq}"
        # Pairwise comparison in C: map(lt) over the column and the column shifted by one.
        if not all(map(operator.lt, self.seqs, itertools.islice(self.seqs, 1, None))):
            return "seqs are not strictly increasing"
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Ack(_FrameBase):
    """The downstream has persisted every batch through ``durable_seq``."""

    shard: int
    durable_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Committed(_FrameBase):
    """Every member from the sender down is durable through ``committed_seq``."""

    shard: int
    committed_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class CommitPoint(_FrameBase):
    """The shard's committed seq as the sender knows it: every member is durable through it."""

    shard: int
    committed_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotRequest(_FrameBase):
    """A learner holding nothing asks for a copy of the upstream's store file."""

    shard: int


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotChunk(_FrameBase):
    """Raw store file bytes at ``offset`` (the bytes sent before them)."""

    shard: int
    offset: int
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotEnd(_FrameBase):
    """The copy is complete: ``total_bytes`` ending at a header naming ``last_seq``."""

    shard: int
    total_bytes: int
    prefix_crc: int
    generation: int
    last_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Produce(_FrameBase):
    """A client appends items to a queue at the shard's head."""

    request_id: int
    queue: str
    keys: tuple[bytes, ...]
    values: tuple[bytes | None, ...]
    expiries_ms: tuple[int, ...] | None
    headers: tuple[Headers | None, ...] | None
    acks: int
    txn: bool

    def _relation_problem(self) -> str | None:
        return _columns_problem(
            keys=self.keys, values=self.values, expiries_ms=self.expiries_ms, headers=self.headers
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Produced(_FrameBase):
    """The seqs a ``Produce`` got (both 0 under ``acks=0``)."""

    request_id: int
    first_seq: int
    last_seq: int

    def _relation_problem(self) -> str | None:
        if self.first_seq == 0 and self.last_seq == 0:
            return None
        if not 1 <= self.first_seq <= self.last_seq:
            return f"range {self.first_seq}..{self.last_seq} is empty or starts at 0"
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class WaitCommitted(_FrameBase):
    """A client waits, at most ``timeout_ms``, until the shard is committed through ``seq``."""

    request_id: int
    shard: int
    seq: int
    timeout_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class CommittedReply(_FrameBase):
    """The shard's committed seq when the wait ended; below ``seq`` means it timed out."""

    request_id: int
    shard: int
    committed_seq: int


Frame: TypeAlias = (
    Hello
    | HelloOk
    | ErrorFrame
    | Ping
    | Pong
    | Confirm
    | Confirmed
    | AuthChallenge
    | AuthProof
    | AuthOk
    | Subscribe
    | Subscribed
    | SnapshotRequest
    | SnapshotChunk
    | SnapshotEnd
    | Batch
    | Ack
    | Committed
    | CommitPoint
    | Produce
    | Produced
    | WaitCommitted
    | CommittedReply
)


def _columns_problem(**columns: tuple[object, ...] | None) -> str | None:
    lengths = {name: len(column) for name, column in columns.items() if column is not None}
    if len(set(lengths.values())) > 1:
        return "columns differ in length: " + ", ".join(f"{k}={v}" for k, v in lengths.items())
    return None


# --- the table -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a frame: its name (also the dataclass attribute), type and first version."""

    name: str
    wire: WireType
    since_version: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class FrameSpec:
    """One row of the frame table: a kind number and everything the codec and docs need about it."""

    kind: int
    name: str
    frame_type: type[Frame]
    direction: str
    since_version: int
    fields: tuple[FieldSpec, ...]

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)

    @property
    def arrays_max(self) -> int:
        """Arrays a body may decode into: the body itself plus what its fields allow."""
        return 1 + sum(field.wire.arrays_max for field in self.fields)

    @property
    def maps_max(self) -> int:
        return sum(field.wire.maps_max for field in self.fields)


def _f(name: str, wire: WireType) -> FieldSpec:
    return FieldSpec(name, wire)


_OPT_U32: Final = _optional(_U32)
_OPT_U64: Final = _optional(_U64)
_OPT_STR: Final = _optional(_STR)

# The declared table. Released rows are frozen: fields are only ever appended, with a new
# since_version and a default (docs/replication-protocol.md, "Compatibility").
# fmt: off
FRAME_TABLE: Final[tuple[FrameSpec, ...]] = (
    FrameSpec(1, "HELLO", Hello, "connector -> acceptor", 1, (
        _f("protocol_version", _U16),
        _f("node_id", _STR),
        _f("shard", _OPT_U32),
        _f("epoch", _U64),
        _f("role", _ROLE),
    )),
    FrameSpec(2, "HELLO_OK", HelloOk, "acceptor -> connector", 1, (
        _f("protocol_version", _U16),
        _f("node_id", _STR),
        _f("epoch", _U64),
    )),
    FrameSpec(3, "ERROR", ErrorFrame, "any", 1, (
        _f("request_id", _OPT_U64),
        _f("code", _STR),
        _f("message", _STR),
        _f("redirect", _OPT_STR),
        _f("epoch", _U64),
    )),
    FrameSpec(4, "PING", Ping, "any", 1, (_f("nonce", _U64),)),
    FrameSpec(5, "PONG", Pong, "any", 1, (_f("nonce", _U64),)),
    FrameSpec(6, "AUTH_CHALLENGE", AuthChallenge, "acceptor -> connector", 3, (
        FieldSpec("cluster_id", _UUID, 3),
        FieldSpec("nonce", _NONCE, 3),
    )),
    FrameSpec(7, "AUTH_PROOF", AuthProof, "connector -> acceptor", 3, (
        FieldSpec("cluster_id", _UUID, 3),
        FieldSpec("nonce", _NONCE, 3),
        FieldSpec("mac", _MAC, 3),
    )),
    FrameSpec(8, "AUTH_OK", AuthOk, "acceptor -> connector", 3, (FieldSpec("mac", _MAC, 3),)),
    FrameSpec(16, "SUBSCRIBE", Subscribe, "downstream -> upstream", 1, (
        _f("shard", _U32),
        _f("from_seq", _U64),
        _f("takeover_table", _TAKEOVER),
        FieldSpec("commit_point", _U64, 5),
    )),
    FrameSpec(17, "SUBSCRIBED", Subscribed, "upstream -> downstream", 1, (
        _f("shard", _U32),
        _f("rollback_to", _OPT_U64),
        _f("takeover_table", _TAKEOVER),
        _f("last_seq", _U64),
    )),
    FrameSpec(18, "BATCH", Batch, "upstream -> downstream", 1, (
        _f("shard", _U32),
        _f("first_seq", _U64),
        _f("last_seq", _U64),
        _f("txn", _BOOL),
        _f("seqs", _U64_COLUMN),
        _f("keys", _BYTES_COLUMN),
        _f("values", _VALUES_COLUMN),
        _f("expiries_ms", _optional(_U64_COLUMN)),
        _f("headers", _optional(_HEADERS_COLUMN)),
        _f("meta", _optional(_META)),
    )),
    FrameSpec(19, "ACK", Ack, "downstream -> upstream", 1, (
        _f("shard", _U32),
        _f("durable_seq", _U64),
    )),
    FrameSpec(20, "COMMITTED", Committed, "downstream -> upstream", 1, (
        _f("shard", _U32),
        _f("committed_seq", _U64),
    )),
    FrameSpec(21, "COMMIT_POINT", CommitPoint, "upstream -> downstream", 2, (
        FieldSpec("shard", _U32, 2),
        FieldSpec("committed_seq", _U64, 2),
    )),
    FrameSpec(22, "SNAPSHOT_REQUEST", SnapshotRequest, "downstream -> upstream", 3, (
        FieldSpec("shard", _U32, 3),
    )),
    FrameSpec(23, "SNAPSHOT_CHUNK", SnapshotChunk, "upstream -> downstream", 3, (
        FieldSpec("shard", _U32, 3),
        FieldSpec("offset", _U64, 3),
        FieldSpec("data", _SNAPSHOT_DATA, 3),
    )),
    FrameSpec(24, "SNAPSHOT_END", SnapshotEnd, "upstream -> downstream", 3, (
        FieldSpec("shard", _U32, 3),
        FieldSpec("total_bytes", _U64, 3),
        FieldSpec("prefix_crc", _U32, 3),
        FieldSpec("generation", _U64, 3),
        FieldSpec("last_seq", _U64, 3),
    )),
    FrameSpec(25, "CONFIRM", Confirm, "downstream -> upstream", 4, (FieldSpec("nonce", _U64, 4),)),
    FrameSpec(26, "CONFIRMED", Confirmed, "upstream -> downstream", 4, (
        FieldSpec("nonce", _U64, 4),
        FieldSpec("held", _BOOL, 4),
    )),
    FrameSpec(32, "PRODUCE", Produce, "client -> head", 1, (
        _f("request_id", _U64),
        _f("queue", _STR),
        _f("keys", _BYTES_COLUMN),
        _f("values", _VALUES_COLUMN),
        _f("expiries_ms", _optional(_U64_COLUMN)),
        _f("headers", _optional(_HEADERS_COLUMN)),
        _f("acks", _ACKS),
        _f("txn", _BOOL),
    )),
    FrameSpec(33, "PRODUCED", Produced, "head -> client", 1, (
        _f("request_id", _U64),
        _f("first_seq", _U64),
        _f("last_seq", _U64),
    )),
    FrameSpec(34, "WAIT_COMMITTED", WaitCommitted, "client -> member", 1, (
        _f("request_id", _U64),
        _f("shard", _U32),
        _f("seq", _U64),
        _f("timeout_ms", _U32),
    )),
    FrameSpec(35, "COMMITTED_REPLY", CommittedReply, "member -> client", 1, (
        _f("request_id", _U64),
        _f("shard", _U32),
        _f("committed_seq", _U64),
    )),
)
# fmt: on

_SPEC_BY_KIND: Final[dict[int, FrameSpec]] = {spec.kind: spec for spec in FRAME_TABLE}
_SPEC_BY_TYPE: Final[dict[type, FrameSpec]] = {spec.frame_type: spec for spec in FRAME_TABLE}
# Fixed per kind, so the decoder looks them up instead of recomputing them per frame.
_FIELD_NAMES_BY_TYPE: Final[dict[type, tuple[str, ...]]] = {
    spec.frame_type: spec.field_names for spec in FRAME_TABLE
}
_BUDGET_BY_KIND: Final = {spec.kind: (spec.arrays_max, spec.maps_max) for spec in FRAME_TABLE}


def _check_table() -> None:
    """State the table's invariants once at import, so a bad edit fails before any frame moves."""
    assert len(_SPEC_BY_KIND) == len(FRAME_TABLE), "kind numbers are unique"
    assert len({spec.name for spec in FRAME_TABLE}) == len(FRAME_TABLE), "names are unique"
    assert len(_SPEC_BY_TYPE) == len(FRAME_TABLE), "one dataclass per kind"
    for spec in FRAME_TABLE:
        assert 1 <= spec.kind <= 255, "kind 0 is never valid and kinds are one byte"
        assert PROTOCOL_VERSION_MIN <= spec.since_version <= PROTOCOL_VERSION
        attributes = tuple(field.name for field in dataclasses.fields(spec.frame_type))
        assert attributes == spec.field_names, f"{spec.name}: dataclass and table agree"
        versions = [field.since_version for field in spec.fields]
        assert versions == sorted(versions), f"{spec.name}: fields are only appended"
        assert spec.since_version <= versions[0]
        assert versions[-1] <= PROTOCOL_VERSION
        assert spec.arrays_max <= limits.batch_entries_max


_check_table()


# --- encoding ------------------------------------------------------------------------------------


def encode(frame: Frame) -> bytes:
    """The bytes of one frame: length prefix, kind and msgpack body.

    Raises ``LimitExceeded`` when the frame is larger than ``limits.frame_bytes_max``: the peer
    would refuse it, so the caller must send less (split the batch) instead.
    """
    spec = _SPEC_BY_TYPE[type(frame)]
    names = _FIELD_NAMES_BY_TYPE[type(frame)]
    body = msgpack.packb([getattr(frame, name) for name in names], use_bin_type=True)
    length = len(body) + 1
    if length > limits.frame_bytes_max:
        raise LimitExceeded(
            f"{spec.name}: frame of {length} bytes is over frame_bytes_max={limits.frame_bytes_max}"
        )
    return _PREFIX.pack(length, spec.kind) + body


# --- decoding ------------------------------------------------------------------------------------


class _ContainerBudget:
    """msgpack hooks that count the arrays and maps a body builds, and stop it past its share.

    An empty map is one byte on the wire and ~70 bytes in memory; without a count a peer could make
    one maximal frame cost gigabytes. The hooks run once per container, and only per-entry headers
    maps are numerous in a well-formed frame.
    """

    __slots__ = ("_arrays_left", "_maps_left", "_name")

    def __init__(self, name: str, arrays_max: int, maps_max: int) -> None:
        self._name = name
        self._arrays_left = arrays_max
        self._maps_left = maps_max

    def array(self, value: object) -> object:
        self._arrays_left -= 1
        if self._arrays_left < 0:
            raise ProtocolError(f"{self._name}: body holds more arrays than its fields allow")
        return value

    def map(self, value: object) -> object:
        self._maps_left -= 1
        if self._maps_left < 0:
            raise ProtocolError(f"{self._name}: body holds more maps than its fields allow")
        return value


def _decode_body(kind: int, body: memoryview) -> Frame:
    spec = _SPEC_BY_KIND.get(kind)
    if spec is None:
        raise ProtocolError(f"unknown frame kind {kind}")
    arrays_max, maps_max = _BUDGET_BY_KIND[kind]
    budget = _ContainerBudget(spec.name, arrays_max, maps_max)
    try:
        fields = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,
            use_list=False,
            list_hook=budget.array,
            object_hook=budget.map,
            max_array_len=limits.batch_entries_max,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        # msgpack reports truncation, trailing bytes, bad UTF-8, unhashable map keys and depth
        # with these; all of them mean the peer's body is not one valid msgpack value.
        detail = str(error) or type(error).__name__
        raise ProtocolError(f"{spec.name}: body is not one msgpack value: {detail}") from error
    if type(fields) is not tuple:
        raise ProtocolError(f"{spec.name}: body is {_describe(fields)}, not an array")
    if len(fields) != len(spec.fields):
        raise ProtocolError(f"{spec.name}: {len(fields)} fields, expected {len(spec.fields)}")
    try:
        return spec.frame_type(*fields)
    except InvalidRequest as error:
        raise ProtocolError(str(error)) from error


class FrameDecoder:
    """Turns a byte stream into frames, whatever way the stream is cut into ``feed`` calls.

    Incomplete input is kept until the rest arrives. A length prefix over ``frame_bytes_max`` is
    refused as soon as its 4 bytes are in, before any of the body is buffered. After the first
    ``ProtocolError`` the decoder is dead: every later ``feed`` raises, because nothing after bad
    bytes can be trusted to start on a frame boundary. Frames decoded earlier in the same ``feed``
    call as the error are dropped with the connection. ``feed`` raises only ``ProtocolError``.
    """

    __slots__ = ("_buffer", "_failure", "_frame_bytes_max")

    def __init__(self, *, frame_bytes_max: int = limits.frame_bytes_max) -> None:
        assert _FRAME_BYTES_MIN <= frame_bytes_max <= limits.frame_bytes_max
        self._buffer = bytearray()
        self._failure: str | None = None
        self._frame_bytes_max = frame_bytes_max

    @property
    def frame_bytes_max(self) -> int:
        return self._frame_bytes_max

    @frame_bytes_max.setter
    def frame_bytes_max(self, value: int) -> None:
        """Changes the bound for frames not yet begun (a connection past its handshake)."""
        assert _FRAME_BYTES_MIN <= value <= limits.frame_bytes_max
        self._frame_bytes_max = value

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buffer)

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data`` to the stream and return every frame it completes, in order."""
        if self._failure is not None:
            raise ProtocolError(f"decoder failed earlier: {self._failure}")
        self._buffer += data
        try:
            return self._drain()
        except ProtocolError as error:
            self._failure = str(error)
            # Drop the buffer rather than keep up to a frame of bytes for a dead connection.
            self._buffer = bytearray()
            raise

    def _drain(self) -> list[Frame]:
        frames: list[Frame] = []
        buffer = self._buffer
        end = len(buffer)
        position = 0
        # Bodies are handed to msgpack as views of the buffer, so no body is copied before parsing.
        with memoryview(buffer) as view:
            while end - position >= _LENGTH_BYTES:
                (length,) = _LENGTH.unpack_from(buffer, position)
                if not _FRAME_BYTES_MIN <= length <= self._frame_bytes_max:
                    raise ProtocolError(
                        f"frame length {length} outside {_FRAME_BYTES_MIN}..{self._frame_bytes_max}"
                    )
                frame_end = position + _LENGTH_BYTES + length
                if frame_end > end:
                    break
                kind = buffer[position + _LENGTH_BYTES]
                frames.append(_decode_body(kind, view[position + _LENGTH_BYTES + 1 : frame_end]))
                position = frame_end
        if position:
            del buffer[:position]
        return frames


def decode(data: bytes) -> list[Frame]:
    """Decode bytes that hold whole frames only; a trailing partial frame is a ``ProtocolError``."""
    decoder = FrameDecoder()
    frames = decoder.feed(data)
    if decoder.buffered_bytes:
        raise ProtocolError(f"{decoder.buffered_bytes} bytes of an incomplete frame at the end")
    return frames


def _describe(value: object) -> str:
    """Describe a rejected value for an error message: its type, and the value if small."""
    if value is None or type(value) in (bool, int, float):
        return f"{type(value).__name__} {value!r}"
    if type(value) in (str, bytes):
        text = repr(value)
        return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, (tuple, list, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
