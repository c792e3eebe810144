"""The frames and the declared frame table: one frozen dataclass per kind, and its row.

``docs/replication-protocol.md`` is the normative description; ``FRAME_TABLE`` is its executable
form: each row numbers a kind and lists its fields, in wire order, with their types
(``frame_fields``) and the protocol version that added them. The codec (``frames``) encodes and
decodes by the table; nothing here touches bytes.

Every frame validates its fields against the table when built, so an instance is well-formed
whether it was decoded or built locally: a bad local frame raises ``InvalidRequest``, and the
decoder turns the same failure into ``ProtocolError``. Apart from ``frames`` so that the
protocol's vocabulary (what frames exist, what they hold, since when) reads in one place, and the
codec in another.

Why it is long: every frame and the table row that declares it are read side by side, and the
table checks itself against the frames on import.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Final, Self, TypeAlias

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.replication.wire.frame_fields import (
    ACKS,
    BOOL,
    BYTES_COLUMN,
    HEADERS_COLUMN,
    MAC,
    META,
    NONCE,
    ROLE,
    SNAPSHOT_DATA,
    STR,
    TAKEOVER,
    U16,
    U32,
    U64,
    U64_COLUMN,
    UUID,
    VALUES_COLUMN,
    WireType,
    describe,
    optional,
)

# The highest protocol version this build speaks, and the lowest it still accepts in a handshake.
PROTOCOL_VERSION: Final = 9
PROTOCOL_VERSION_MIN: Final = 1
# Replication links need both sides at this version or later: version 2 forwards before it
# persists and carries the commit point down the chain, version 3 authenticates both sides of a
# link, version 4 confirms a snapshot below the head up to a head holding a lease (CONFIRM,
# docs/replication-protocol.md "Confirming a snapshot"), version 5's SUBSCRIBE names the
# downstream's commit point (a head that lost committed entries repairs instead of ordering a
# rollback: "An upstream that lacks committed entries").
LINK_PROTOCOL_VERSION_MIN: Final = 5
# Version 6 adds METADATA: an upstream sends it only to a connector at this version or later, and
# a version 5 peer keeps the version 5 behaviour (docs/replication-protocol.md, "Compatibility").
METADATA_PROTOCOL_VERSION_MIN: Final = 6
# Version 7 appends producer_id and producer_seq to PRODUCE: a client connection decodes and
# encodes at the version its handshake picked (docs/replication-protocol.md, "Handshake"), so a
# version 6 client's PRODUCE (8 fields) still decodes, meaning "no producer".
# Version 8 adds SNAPSHOT_RESUME: a learner sends it only to an upstream whose HELLO_OK named this
# version or later (docs/replication-protocol.md, "Store snapshots").
SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN: Final = 8
# Version 9 adds CLIENT_PROOF: a node holding client credentials challenges a client whose HELLO
# named version 9 or later (AUTH_CHALLENGE) and refuses an older one (docs/security.md).
CLIENT_PROOF_PROTOCOL_VERSION_MIN: Final = 9

TakeoverEntry: TypeAlias = tuple[bytes, int]
Headers: TypeAlias = dict[str, bytes]
MetaValue: TypeAlias = int | bytes | None


# --- the frames ----------------------------------------------------------------------------------


class _FrameBase:
    """Validation shared by every frame: each field against the table, then cross-field rules."""

    __slots__ = ()

    def __post_init__(self) -> None:
        spec = SPEC_BY_TYPE[type(self)]
        for field in spec.fields:
            value = getattr(self, field.name)
            if not field.wire.check(value):
                raise InvalidRequest(
                    f"{spec.name}.{field.name}: expected {field.wire.name}, got {describe(value)}"
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
        for name, value in zip(FIELD_NAMES_BY_TYPE[cls], values, strict=True):
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
class Metadata(_FrameBase):
    """An idle upstream's whole replicated metadata as of ``seq``, the last seq it sent on the
    link (docs/replication-protocol.md, "The metadata on an idle link")."""

    shard: int
    seq: int
    meta: dict[str, MetaValue]

    def _relation_problem(self) -> str | None:
        if any(value is None for value in self.meta.values()):
            return "a whole map deletes no key"
        return None


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
class SnapshotResume(_FrameBase):
    """A learner holding a verified prefix of a copy, up to ``offset`` (the end of a header chunk
    whose prefix CRC is ``header_crc``), asks for the rest of the upstream's store file."""

    shard: int
    offset: int
    store_uuid: bytes
    generation: int
    header_crc: int


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
    """A client appends items to a queue at the shard's head; with a ``producer_id`` the head
    writes each ``(producer_id, producer_seq)`` once (docs/node-api.md, "Idempotent
    producers")."""

    request_id: int
    queue: str
    keys: tuple[bytes, ...]
    values: tuple[bytes | None, ...]
    expiries_ms: tuple[int, ...] | None
    headers: tuple[Headers | None, ...] | None
    acks: int
    txn: bool
    producer_id: bytes | None = None
    producer_seq: int = 0

    def _relation_problem(self) -> str | None:
        if self.producer_id is None and self.producer_seq:
            return "producer_seq without a producer_id"
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


@dataclasses.dataclass(frozen=True, slots=True)
class ClientProof(_FrameBase):
    """A client's answer to AUTH_CHALLENGE: its credential's name, its nonce and its proof
    (kayos/auth/proof.py)."""

    name: str
    nonce: bytes
    proof: bytes


Frame: TypeAlias = (
    Hello
    | HelloOk
    | ErrorFrame
    | Ping
    | Pong
    | Confirm
    | Confirmed
    | Metadata
    | AuthChallenge
    | AuthProof
    | AuthOk
    | Subscribe
    | Subscribed
    | SnapshotRequest
    | SnapshotChunk
    | SnapshotEnd
    | SnapshotResume
    | Batch
    | Ack
    | Committed
    | CommitPoint
    | Produce
    | Produced
    | WaitCommitted
    | CommittedReply
    | ClientProof
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


_OPT_U32: Final = optional(U32)
_OPT_U64: Final = optional(U64)
_OPT_STR: Final = optional(STR)
_OPT_UUID: Final = optional(UUID)

# The declared table. Released rows are frozen: fields are only ever appended, with a new
# since_version and a default (docs/replication-protocol.md, "Compatibility").
# fmt: off
FRAME_TABLE: Final[tuple[FrameSpec, ...]] = (
    FrameSpec(1, "HELLO", Hello, "connector -> acceptor", 1, (
        _f("protocol_version", U16),
        _f("node_id", STR),
        _f("shard", _OPT_U32),
        _f("epoch", U64),
        _f("role", ROLE),
    )),
    FrameSpec(2, "HELLO_OK", HelloOk, "acceptor -> connector", 1, (
        _f("protocol_version", U16),
        _f("node_id", STR),
        _f("epoch", U64),
    )),
    FrameSpec(3, "ERROR", ErrorFrame, "any", 1, (
        _f("request_id", _OPT_U64),
        _f("code", STR),
        _f("message", STR),
        _f("redirect", _OPT_STR),
        _f("epoch", U64),
    )),
    FrameSpec(4, "PING", Ping, "any", 1, (_f("nonce", U64),)),
    FrameSpec(5, "PONG", Pong, "any", 1, (_f("nonce", U64),)),
    FrameSpec(6, "AUTH_CHALLENGE", AuthChallenge, "acceptor -> connector", 3, (
        FieldSpec("cluster_id", UUID, 3),
        FieldSpec("nonce", NONCE, 3),
    )),
    FrameSpec(7, "AUTH_PROOF", AuthProof, "connector -> acceptor", 3, (
        FieldSpec("cluster_id", UUID, 3),
        FieldSpec("nonce", NONCE, 3),
        FieldSpec("mac", MAC, 3),
    )),
    FrameSpec(8, "AUTH_OK", AuthOk, "acceptor -> connector", 3, (FieldSpec("mac", MAC, 3),)),
    FrameSpec(16, "SUBSCRIBE", Subscribe, "downstream -> upstream", 1, (
        _f("shard", U32),
        _f("from_seq", U64),
        _f("takeover_table", TAKEOVER),
        FieldSpec("commit_point", U64, 5),
    )),
    FrameSpec(17, "SUBSCRIBED", Subscribed, "upstream -> downstream", 1, (
        _f("shard", U32),
        _f("rollback_to", _OPT_U64),
        _f("takeover_table", TAKEOVER),
        _f("last_seq", U64),
    )),
    FrameSpec(18, "BATCH", Batch, "upstream -> downstream", 1, (
        _f("shard", U32),
        _f("first_seq", U64),
        _f("last_seq", U64),
        _f("txn", BOOL),
        _f("seqs", U64_COLUMN),
        _f("keys", BYTES_COLUMN),
        _f("values", VALUES_COLUMN),
        _f("expiries_ms", optional(U64_COLUMN)),
        _f("headers", optional(HEADERS_COLUMN)),
        _f("meta", optional(META)),
    )),
    FrameSpec(19, "ACK", Ack, "downstream -> upstream", 1, (
        _f("shard", U32),
        _f("durable_seq", U64),
    )),
    FrameSpec(20, "COMMITTED", Committed, "downstream -> upstream", 1, (
        _f("shard", U32),
        _f("committed_seq", U64),
    )),
    FrameSpec(21, "COMMIT_POINT", CommitPoint, "upstream -> downstream", 2, (
        FieldSpec("shard", U32, 2),
        FieldSpec("committed_seq", U64, 2),
    )),
    FrameSpec(22, "SNAPSHOT_REQUEST", SnapshotRequest, "downstream -> upstream", 3, (
        FieldSpec("shard", U32, 3),
    )),
    FrameSpec(23, "SNAPSHOT_CHUNK", SnapshotChunk, "upstream -> downstream", 3, (
        FieldSpec("shard", U32, 3),
        FieldSpec("offset", U64, 3),
        FieldSpec("data", SNAPSHOT_DATA, 3),
    )),
    FrameSpec(24, "SNAPSHOT_END", SnapshotEnd, "upstream -> downstream", 3, (
        FieldSpec("shard", U32, 3),
        FieldSpec("total_bytes", U64, 3),
        FieldSpec("prefix_crc", U32, 3),
        FieldSpec("generation", U64, 3),
        FieldSpec("last_seq", U64, 3),
    )),
    FrameSpec(28, "SNAPSHOT_RESUME", SnapshotResume, "downstream -> upstream", 8, (
        FieldSpec("shard", U32, 8),
        FieldSpec("offset", U64, 8),
        FieldSpec("store_uuid", UUID, 8),
        FieldSpec("generation", U64, 8),
        FieldSpec("header_crc", U32, 8),
    )),
    FrameSpec(25, "CONFIRM", Confirm, "downstream -> upstream", 4, (FieldSpec("nonce", U64, 4),)),
    FrameSpec(26, "CONFIRMED", Confirmed, "upstream -> downstream", 4, (
        FieldSpec("nonce", U64, 4),
        FieldSpec("held", BOOL, 4),
    )),
    FrameSpec(27, "METADATA", Metadata, "upstream -> downstream", 6, (
        FieldSpec("shard", U32, 6),
        FieldSpec("seq", U64, 6),
        FieldSpec("meta", META, 6),
    )),
    FrameSpec(32, "PRODUCE", Produce, "client -> head", 1, (
        _f("request_id", U64),
        _f("queue", STR),
        _f("keys", BYTES_COLUMN),
        _f("values", VALUES_COLUMN),
        _f("expiries_ms", optional(U64_COLUMN)),
        _f("headers", optional(HEADERS_COLUMN)),
        _f("acks", ACKS),
        _f("txn", BOOL),
        FieldSpec("producer_id", _OPT_UUID, 7),
        FieldSpec("producer_seq", U64, 7),
    )),
    FrameSpec(33, "PRODUCED", Produced, "head -> client", 1, (
        _f("request_id", U64),
        _f("first_seq", U64),
        _f("last_seq", U64),
    )),
    FrameSpec(34, "WAIT_COMMITTED", WaitCommitted, "client -> member", 1, (
        _f("request_id", U64),
        _f("shard", U32),
        _f("seq", U64),
        _f("timeout_ms", U32),
    )),
    FrameSpec(35, "COMMITTED_REPLY", CommittedReply, "member -> client", 1, (
        _f("request_id", U64),
        _f("shard", U32),
        _f("committed_seq", U64),
    )),
    FrameSpec(36, "CLIENT_PROOF", ClientProof, "client -> acceptor", 9, (
        FieldSpec("name", STR, 9),
        FieldSpec("nonce", NONCE, 9),
        FieldSpec("proof", MAC, 9),
    )),
)
# fmt: on

SPEC_BY_KIND: Final[dict[int, FrameSpec]] = {spec.kind: spec for spec in FRAME_TABLE}
SPEC_BY_TYPE: Final[dict[type, FrameSpec]] = {spec.frame_type: spec for spec in FRAME_TABLE}
# Fixed per kind, so the decoder looks them up instead of recomputing them per frame.
FIELD_NAMES_BY_TYPE: Final[dict[type, tuple[str, ...]]] = {
    spec.frame_type: spec.field_names for spec in FRAME_TABLE
}
BUDGET_BY_KIND: Final = {spec.kind: (spec.arrays_max, spec.maps_max) for spec in FRAME_TABLE}


def _field_counts(spec: FrameSpec) -> tuple[int, ...]:
    """The fields ``spec``'s frame has at each protocol version 0..PROTOCOL_VERSION (0: the kind
    does not exist yet)."""
    return tuple(
        sum(1 for field in spec.fields if field.since_version <= version)
        if version >= spec.since_version
        else 0
        for version in range(PROTOCOL_VERSION + 1)
    )


# Indexed by protocol version: what a frame holds on a connection at that version.
FIELD_COUNTS_BY_KIND: Final[dict[int, tuple[int, ...]]] = {
    spec.kind: _field_counts(spec) for spec in FRAME_TABLE
}
# Each field's fixed default (dataclasses.MISSING for a field every version has): what a frame
# decoded at an older version holds in the fields appended since.
DEFAULTS_BY_KIND: Final[dict[int, tuple[object, ...]]] = {
    spec.kind: tuple(field.default for field in dataclasses.fields(spec.frame_type))
    for spec in FRAME_TABLE
}


# Kinds 32-47 are client frames (docs/replication-protocol.md, "Frame table").
_CLIENT_KINDS_MIN: Final = 32


def _check_table() -> None:
    """State the table's invariants once at import, so a bad edit fails before any frame moves."""
    assert len(SPEC_BY_KIND) == len(FRAME_TABLE), "kind numbers are unique"
    assert len({spec.name for spec in FRAME_TABLE}) == len(FRAME_TABLE), "names are unique"
    assert len(SPEC_BY_TYPE) == len(FRAME_TABLE), "one dataclass per kind"
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
        defaults = DEFAULTS_BY_KIND[spec.kind]
        for field, default in zip(spec.fields, defaults, strict=True):
            if field.since_version > spec.since_version:
                assert default is not dataclasses.MISSING, f"{spec.name}.{field.name}: a default"
                # Link frames are decoded in their newest form (only client connections decode
                # at an older version): a field appended to one must predate every link.
                assert spec.kind >= _CLIENT_KINDS_MIN or (
                    field.since_version <= LINK_PROTOCOL_VERSION_MIN
                ), f"{spec.name}.{field.name}: links would meet two field counts"


_check_table()
