"""Wire frames of the replication links and the client hot path: the codec, and every name.

``docs/replication-protocol.md`` is the normative description. A frame on the wire is
``u32 big-endian length`` (of what follows) + ``u8 kind`` + one msgpack array holding the frame's
fields in table order.

The codec is sans-IO: ``encode`` turns a frame into bytes and ``FrameDecoder.feed`` turns bytes into
frames. It imports no asyncio, socket or clock; which frame is legal when is the business of the
stream and chain logic.

The frames themselves (frozen dataclasses that check their fields when built) and the declared
table ``FRAME_TABLE`` are in ``kayos.replication.wire.frame_table``, the field types and their
checks in ``kayos.replication.wire.frame_fields``. Every public name of both is importable from
here, and the rest of Kayos imports frames from here.

Column fields (``BATCH`` and ``PRODUCE`` entries) pass through msgpack untouched as tuples, and
their checks run in C: no Python bytecode runs per entry, except for the per-entry headers maps
msgpack itself builds.
"""

from __future__ import annotations

import struct
from typing import Final

import msgpack

from kayos import limits
from kayos.errors import InvalidRequest, LimitExceeded, ProtocolError
from kayos.replication.wire.frame_fields import (
    ACKS_ALL,
    ACKS_HEAD,
    ACKS_NONE,
    CHAIN_ROLES,
    COPY_ROLES,
    MAC_BYTES,
    ROLES,
    WireType,
    describe,
)
from kayos.replication.wire.frame_table import (
    BUDGET_BY_KIND,
    CLIENT_PROOF_PROTOCOL_VERSION_MIN,
    DEFAULTS_BY_KIND,
    FIELD_COUNTS_BY_KIND,
    FIELD_NAMES_BY_TYPE,
    FRAME_TABLE,
    LINK_PROTOCOL_VERSION_MIN,
    METADATA_PROTOCOL_VERSION_MIN,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
    SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN,
    SPEC_BY_KIND,
    SPEC_BY_TYPE,
    Ack,
    AuthChallenge,
    AuthOk,
    AuthProof,
    Batch,
    ClientProof,
    CommitPoint,
    Committed,
    CommittedReply,
    Confirm,
    Confirmed,
    ErrorFrame,
    FieldSpec,
    Frame,
    FrameSpec,
    Headers,
    Hello,
    HelloOk,
    Metadata,
    MetaValue,
    Ping,
    Pong,
    Produce,
    Produced,
    SnapshotChunk,
    SnapshotEnd,
    SnapshotRequest,
    SnapshotResume,
    Subscribe,
    Subscribed,
    TakeoverEntry,
    WaitCommitted,
)

__all__ = [
    "ACKS_ALL",
    "ACKS_HEAD",
    "ACKS_NONE",
    "CHAIN_ROLES",
    "CLIENT_PROOF_PROTOCOL_VERSION_MIN",
    "COPY_ROLES",
    "FRAME_TABLE",
    "LINK_PROTOCOL_VERSION_MIN",
    "MAC_BYTES",
    "METADATA_PROTOCOL_VERSION_MIN",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_MIN",
    "ROLES",
    "SNAPSHOT_RESUME_PROTOCOL_VERSION_MIN",
    "Ack",
    "AuthChallenge",
    "AuthOk",
    "AuthProof",
    "Batch",
    "ClientProof",
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
    "Headers",
    "Hello",
    "HelloOk",
    "MetaValue",
    "Metadata",
    "Ping",
    "Pong",
    "Produce",
    "Produced",
    "SnapshotChunk",
    "SnapshotEnd",
    "SnapshotRequest",
    "SnapshotResume",
    "Subscribe",
    "Subscribed",
    "TakeoverEntry",
    "WaitCommitted",
    "WireType",
    "decode",
    "encode",
]

# The prefix before every body: the length of what follows it (kind byte + body), then the kind.
_PREFIX: Final = struct.Struct(">IB")
_LENGTH: Final = struct.Struct(">I")
_LENGTH_BYTES: Final = _LENGTH.size
# The smallest frame is a kind byte and a one-byte msgpack array.
_FRAME_BYTES_MIN: Final = 2


# --- encoding ------------------------------------------------------------------------------------


def encode(frame: Frame, version: int = PROTOCOL_VERSION) -> bytes:
    """The bytes of one frame at protocol ``version`` (the connection's): length prefix, kind and
    msgpack body of the fields that version has. Fields appended after ``version`` are left out:
    an older peer knows nothing of them (a ``PRODUCE``'s producer id, to a version 6 node).

    Raises ``LimitExceeded`` when the frame is larger than ``limits.frame_bytes_max``: the peer
    would refuse it, so the caller must send less (split the batch) instead; ``InvalidRequest``
    for a frame kind ``version`` does not have.
    """
    spec = SPEC_BY_TYPE[type(frame)]
    names = FIELD_NAMES_BY_TYPE[type(frame)]
    if version != PROTOCOL_VERSION:
        names = names[: _field_count(spec, version, InvalidRequest)]
    body = msgpack.packb([getattr(frame, name) for name in names], use_bin_type=True)
    length = len(body) + 1
    if length > limits.frame_bytes_max:
        raise LimitExceeded(
            f"{spec.name}: frame of {length} bytes is over frame_bytes_max={limits.frame_bytes_max}"
        )
    return _PREFIX.pack(length, spec.kind) + body


def _field_count(spec: FrameSpec, version: int, error: type[Exception]) -> int:
    """How many fields ``spec``'s frame has at ``version``; ``error`` if it has none."""
    if not PROTOCOL_VERSION_MIN <= version <= PROTOCOL_VERSION:
        raise error(
            f"protocol version {version} outside {PROTOCOL_VERSION_MIN}..{PROTOCOL_VERSION}"
        )
    count = FIELD_COUNTS_BY_KIND[spec.kind][version]
    if not count:
        raise error(f"{spec.name} does not exist in protocol version {version}")
    return count


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


def _decode_body(kind: int, body: memoryview, version: int) -> Frame:
    spec = SPEC_BY_KIND.get(kind)
    if spec is None:
        raise ProtocolError(f"unknown frame kind {kind}")
    expected = FIELD_COUNTS_BY_KIND[kind][version]
    if not expected:
        raise ProtocolError(f"{spec.name} does not exist in protocol version {version}")
    arrays_max, maps_max = BUDGET_BY_KIND[kind]
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
        raise ProtocolError(f"{spec.name}: body is {describe(fields)}, not an array")
    if len(fields) != expected:
        raise ProtocolError(
            f"{spec.name}: {len(fields)} fields, expected {expected} at protocol version {version}"
        )
    if expected < len(spec.fields):
        # An older version's frame: the fields appended since hold their fixed defaults.
        fields += DEFAULTS_BY_KIND[kind][expected:]
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

    Frames are decoded at ``protocol_version``, the newest unless the connection's handshake
    picked an older one: a frame then has exactly that version's fields, and those appended
    since hold their defaults.
    """

    __slots__ = ("_buffer", "_failure", "_frame_bytes_max", "_version")

    def __init__(
        self,
        *,
        frame_bytes_max: int = limits.frame_bytes_max,
        protocol_version: int = PROTOCOL_VERSION,
    ) -> None:
        assert _FRAME_BYTES_MIN <= frame_bytes_max <= limits.frame_bytes_max
        assert PROTOCOL_VERSION_MIN <= protocol_version <= PROTOCOL_VERSION
        self._buffer = bytearray()
        self._failure: str | None = None
        self._frame_bytes_max = frame_bytes_max
        self._version = protocol_version

    @property
    def protocol_version(self) -> int:
        return self._version

    @protocol_version.setter
    def protocol_version(self, value: int) -> None:
        """Decodes frames not yet begun at ``value`` (the version a handshake picked)."""
        assert PROTOCOL_VERSION_MIN <= value <= PROTOCOL_VERSION
        self._version = value

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
                # The body's view is never named: a view left alive would pin the buffer.
                frames.append(
                    _decode_body(
                        kind, view[position + _LENGTH_BYTES + 1 : frame_end], self._version
                    )
                )
                position = frame_end
        if position:
            del buffer[:position]
        return frames


def decode(data: bytes, version: int = PROTOCOL_VERSION) -> list[Frame]:
    """Decode bytes that hold whole frames only, at protocol ``version``; a trailing partial frame
    is a ``ProtocolError``."""
    decoder = FrameDecoder(protocol_version=version)
    frames = decoder.feed(data)
    if decoder.buffered_bytes:
        raise ProtocolError(f"{decoder.buffered_bytes} bytes of an incomplete frame at the end")
    return frames
