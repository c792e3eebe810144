"""Kestrel 2.x thrift API (spec §11, default port 2229), sans-IO: frames in, calls out.

Kestrel serves ``service Kestrel`` of ``kestrel.thrift`` with Finagle: the framed transport (each
message is a 4-byte big-endian length, then that many bytes) and TBinaryProtocol (big-endian; the
server reads both the strict header ``0x8001 0000 | type`` and the old unversioned one, and writes
the strict one). ``METHODS`` declares the service as data, each method with its argument fields
(id, name, type, default) and its result type; decoding and the docs derive from it, so no thrift
compiler is needed.

``ThriftConnection.receive_data`` returns one event per complete frame: a decoded call (``Put``,
``Get`` … one dataclass per method, with its ``seqid``), a ``BadCall`` the server answers with a
``TApplicationException`` (unknown method, arguments that do not decode), or ``Close`` when the
frame itself cannot be trusted (a length out of bounds, a header that does not decode): there is
then nothing to answer, and the connection closes, as Apache Thrift's servers do. After ``Close``
the codec is dead: later bytes are dropped and ``receive_data`` raises ``ThriftProtocolError``.

Decoding follows generated Thrift code: fields are matched by id, a field of an unexpected id or
type is skipped, a missing primitive takes its default (the IDL's, else 0), and a missing string,
list or set is a protocol error. Strings are UTF-8 with replacement, as Java's decoder reads them.
The ``encode_*`` functions build whole reply frames.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from kayos.errors import ProtocolError
from kestrel_compat import limits
from kestrel_compat.wire.commands import Close


class ThriftProtocolError(ProtocolError):
    """The codec was used after its connection closed. Peer input never raises; it gives events."""

    code = "kestrel_thrift_protocol_error"


class _DecodeError(Exception):
    """Bytes inside a frame do not follow TBinaryProtocol (internal; becomes an event)."""


class TType(enum.IntEnum):
    STOP = 0
    BOOL = 2
    BYTE = 3
    DOUBLE = 4
    I16 = 6
    I32 = 8
    I64 = 10
    STRING = 11
    STRUCT = 12
    MAP = 13
    SET = 14
    LIST = 15


class MessageType(enum.IntEnum):
    CALL = 1
    REPLY = 2
    EXCEPTION = 3
    ONEWAY = 4


class ApplicationError(enum.IntEnum):
    """TApplicationException types (Apache Thrift)."""

    UNKNOWN = 0
    UNKNOWN_METHOD = 1
    INTERNAL_ERROR = 6
    PROTOCOL_ERROR = 7


class ThriftStatus(enum.IntEnum):
    """``enum Status`` of kestrel.thrift."""

    NOT_CONFIGURED = 0
    QUIESCENT = 1
    READ_ONLY = 2
    UP = 3


VERSION_1 = 0x80010000
VERSION_MASK = 0xFFFF0000
FRAME_HEADER_BYTES = 4

# --- calls ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Put:
    method: ClassVar[str] = "put"
    seqid: int
    queue_name: str
    items: tuple[bytes, ...]
    expiration_msec: int


@dataclass(frozen=True, slots=True)
class Get:
    method: ClassVar[str] = "get"
    seqid: int
    queue_name: str
    max_items: int
    timeout_msec: int
    auto_abort_msec: int


@dataclass(frozen=True, slots=True)
class Confirm:
    method: ClassVar[str] = "confirm"
    seqid: int
    queue_name: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Abort:
    method: ClassVar[str] = "abort"
    seqid: int
    queue_name: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Peek:
    method: ClassVar[str] = "peek"
    seqid: int
    queue_name: str


@dataclass(frozen=True, slots=True)
class FlushQueue:
    method: ClassVar[str] = "flush_queue"
    seqid: int
    queue_name: str


@dataclass(frozen=True, slots=True)
class FlushAllQueues:
    method: ClassVar[str] = "flush_all_queues"
    seqid: int


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    method: ClassVar[str] = "delete_queue"
    seqid: int
    queue_name: str


@dataclass(frozen=True, slots=True)
class CurrentStatus:
    method: ClassVar[str] = "current_status"
    seqid: int


@dataclass(frozen=True, slots=True)
class SetStatus:
    """``status`` is the enum's number as sent; the session decides what it means."""

    method: ClassVar[str] = "set_status"
    seqid: int
    status: int


@dataclass(frozen=True, slots=True)
class GetVersion:
    method: ClassVar[str] = "get_version"
    seqid: int


@dataclass(frozen=True, slots=True)
class BadCall:
    """A call answered with a TApplicationException and no work done."""

    method: str
    seqid: int
    error: ApplicationError
    message: str


ThriftCall: TypeAlias = (
    Put
    | Get
    | Confirm
    | Abort
    | Peek
    | FlushQueue
    | FlushAllQueues
    | DeleteQueue
    | CurrentStatus
    | SetStatus
    | GetVersion
)
ThriftEvent: TypeAlias = ThriftCall | BadCall | Close

# --- the service, declared -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One argument: ``element`` is the element type of a list or set."""

    id: int
    name: str
    type: TType
    element: TType | None = None
    default: int | None = None  # For i32 arguments; generated code's default is 0.


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One method of ``service Kestrel``: argument fields, result type (None: void), event."""

    name: str
    arguments: tuple[FieldSpec, ...]
    result: str
    build: Callable[..., ThriftCall]


_QUEUE = FieldSpec(1, "queue_name", TType.STRING)
_IDS = FieldSpec(2, "ids", TType.SET, TType.I64)

METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(
        "put",
        (
            _QUEUE,
            FieldSpec(2, "items", TType.LIST, TType.STRING),
            FieldSpec(3, "expiration_msec", TType.I32, default=0),
        ),
        "i32",
        Put,
    ),
    MethodSpec(
        "get",
        (
            _QUEUE,
            FieldSpec(2, "max_items", TType.I32),
            FieldSpec(3, "timeout_msec", TType.I32, default=0),
            FieldSpec(4, "auto_abort_msec", TType.I32, default=0),
        ),
        "list<Item>",
        Get,
    ),
    MethodSpec("confirm", (_QUEUE, _IDS), "i32", Confirm),
    MethodSpec("abort", (_QUEUE, _IDS), "i32", Abort),
    MethodSpec("peek", (_QUEUE,), "QueueInfo", Peek),
    MethodSpec("flush_queue", (_QUEUE,), "void", FlushQueue),
    MethodSpec("flush_all_queues", (), "void", FlushAllQueues),
    MethodSpec("delete_queue", (_QUEUE,), "void", DeleteQueue),
    MethodSpec("current_status", (), "Status", CurrentStatus),
    MethodSpec("set_status", (FieldSpec(1, "status", TType.I32),), "void", SetStatus),
    MethodSpec("get_version", (), "string", GetVersion),
)
METHODS_BY_NAME: dict[str, MethodSpec] = {spec.name: spec for spec in METHODS}
assert len(METHODS_BY_NAME) == len(METHODS)

# --- decoding ------------------------------------------------------------------------------------

_FIXED_BYTES = {TType.BOOL: 1, TType.BYTE: 1, TType.DOUBLE: 8, TType.I16: 2, TType.I32: 4,
                TType.I64: 8}  # fmt: skip


class _Reader:
    """TBinaryProtocol reads over one frame; every overrun is a ``_DecodeError``."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0

    def _take(self, count: int) -> bytes:
        if count < 0 or self._position + count > len(self._data):
            raise _DecodeError("value runs past the end of the frame")
        chunk = self._data[self._position : self._position + count]
        self._position += count
        return chunk

    def byte(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

    def i16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def i32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def i64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def binary(self) -> bytes:
        return self._take(self.i32())

    def string(self) -> str:
        return self.binary().decode("utf-8", errors="replace")

    def ttype(self) -> TType:
        value = self.byte()
        try:
            return TType(value)
        except ValueError:
            raise _DecodeError(f"unknown type {value}") from None

    def skip(self, ttype: TType, depth: int = 0) -> None:
        if depth > limits.thrift_nesting_max:
            raise _DecodeError("value nested too deeply")
        if ttype in _FIXED_BYTES:
            self._take(_FIXED_BYTES[ttype])
        elif ttype is TType.STRING:
            self.binary()
        elif ttype is TType.STRUCT:
            while (field_type := self.ttype()) is not TType.STOP:
                self.i16()
                self.skip(field_type, depth + 1)
        elif ttype is TType.MAP:
            key_type, value_type, count = self.ttype(), self.ttype(), self._count()
            for _ in range(count):
                self.skip(key_type, depth + 1)
                self.skip(value_type, depth + 1)
        elif ttype in (TType.SET, TType.LIST):
            element_type, count = self.ttype(), self._count()
            for _ in range(count):
                self.skip(element_type, depth + 1)
        else:
            raise _DecodeError(f"cannot skip type {ttype}")

    def _count(self) -> int:
        count = self.i32()
        if count < 0:
            raise _DecodeError("negative container size")
        return count

    def container(self, element: TType) -> tuple[bytes | int, ...]:
        """A list or set header then its elements, which must be of type ``element``."""
        element_type, count = self.ttype(), self._count()
        if element_type is not element:
            raise _DecodeError(f"container of {element_type.name}, expected {element.name}")
        read: Callable[[], bytes | int] = self.binary if element is TType.STRING else self.i64
        assert element in (TType.STRING, TType.I64)
        return tuple(read() for _ in range(count))

    def message_header(self) -> tuple[str, int, int]:
        """(name, type, seqid), strict or old-style."""
        first = self.i32()
        if first < 0:
            if first & VERSION_MASK != VERSION_1:
                raise _DecodeError("bad protocol version")
            message_type = first & 0xFF
            name = self.string()
        else:
            name = self._take(first).decode("utf-8", errors="replace")
            message_type = self.byte()
        return name, message_type, self.i32()


def _read_arguments(reader: _Reader, spec: MethodSpec) -> dict[str, object]:
    by_id = {argument.id: argument for argument in spec.arguments}
    values: dict[str, object] = {}
    while (field_type := reader.ttype()) is not TType.STOP:
        field_id = reader.i16()
        argument = by_id.get(field_id)
        if argument is None or argument.type is not field_type:
            reader.skip(field_type)  # Generated code skips what it does not know.
        elif field_type is TType.I32:
            values[argument.name] = reader.i32()
        elif field_type is TType.STRING:
            values[argument.name] = reader.string()
        else:
            assert argument.element is not None
            elements = reader.container(argument.element)
            if field_type is TType.SET:
                elements = tuple(dict.fromkeys(elements))  # A set holds each id once.
            values[argument.name] = elements
    for argument in spec.arguments:
        if argument.name in values:
            continue
        if argument.type is not TType.I32:
            raise _DecodeError(f"Required field '{argument.name}' is unset!")
        values[argument.name] = argument.default if argument.default is not None else 0
    return values


def decode_frame(frame: bytes) -> ThriftEvent:
    """One frame's message as an event."""
    reader = _Reader(frame)
    try:
        name, _message_type, seqid = reader.message_header()
    except _DecodeError as error:
        return Close(f"message header: {error}")
    spec = METHODS_BY_NAME.get(name)
    if spec is None:
        return BadCall(
            name, seqid, ApplicationError.UNKNOWN_METHOD, f"Invalid method name: '{name}'"
        )
    try:
        values = _read_arguments(reader, spec)
    except _DecodeError as error:
        return BadCall(name, seqid, ApplicationError.PROTOCOL_ERROR, str(error))
    return spec.build(seqid=seqid, **values)


# --- the connection ------------------------------------------------------------------------------


class ThriftConnection:
    """The server side of one framed TBinaryProtocol connection, without I/O."""

    def __init__(self, *, frame_bytes_max: int = limits.thrift_frame_bytes_max) -> None:
        if not 0 < frame_bytes_max <= limits.thrift_frame_bytes_max:
            raise ValueError(f"frame_bytes_max must be in 1..{limits.thrift_frame_bytes_max}")
        self._frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffered(self) -> bytes:
        return bytes(self._buffer)

    def receive_data(self, data: bytes) -> list[ThriftEvent]:
        """Add bytes from the peer; return an event per complete frame, in order."""
        if self._closed:
            raise ThriftProtocolError("receive_data after the connection closed")
        self._buffer += data
        events: list[ThriftEvent] = []
        while len(self._buffer) >= FRAME_HEADER_BYTES:
            length = struct.unpack(">i", self._buffer[:FRAME_HEADER_BYTES])[0]
            if not 0 <= length <= self._frame_bytes_max:
                events.append(Close(f"frame length {length} out of bounds"))
                break
            end = FRAME_HEADER_BYTES + length
            if len(self._buffer) < end:
                break
            frame = bytes(self._buffer[FRAME_HEADER_BYTES:end])
            del self._buffer[:end]
            event = decode_frame(frame)
            events.append(event)
            if isinstance(event, Close):
                break
        if events and isinstance(events[-1], Close):
            self._closed = True
            self._buffer.clear()
        return events


# --- replies -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """``struct Item { 1: binary data, 2: i64 id }``."""

    data: bytes
    id: int


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """``struct QueueInfo``; ``head_item`` is optional and left out when None."""

    head_item: bytes | None
    items: int
    bytes: int
    journal_bytes: int
    age: int
    waiters: int
    open_transactions: int


ResultValue: TypeAlias = int | str | list[Item] | QueueInfo | None


def _field(ttype: TType, field_id: int) -> bytes:
    return struct.pack(">bh", ttype, field_id)


def _binary(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _i32(value: int) -> bytes:
    return struct.pack(">i", value)


def _i64(value: int) -> bytes:
    return struct.pack(">q", value)


def _stop() -> bytes:
    return bytes([TType.STOP])


def _item(item: Item) -> bytes:
    return (
        _field(TType.STRING, 1)
        + _binary(item.data)
        + _field(TType.I64, 2)
        + _i64(item.id)
        + (_stop())
    )


def _queue_info(info: QueueInfo) -> bytes:
    out = b""
    if info.head_item is not None:
        out += _field(TType.STRING, 1) + _binary(info.head_item)
    out += _field(TType.I64, 2) + _i64(info.items)
    out += _field(TType.I64, 3) + _i64(info.bytes)
    out += _field(TType.I64, 4) + _i64(info.journal_bytes)
    out += _field(TType.I64, 5) + _i64(info.age)
    out += _field(TType.I32, 6) + _i32(info.waiters)
    out += _field(TType.I32, 7) + _i32(info.open_transactions)
    return out + _stop()


def _success(result: str, value: ResultValue) -> bytes:
    # The result struct's field 0, "success"; a void method's result struct is empty.
    if result == "void":
        assert value is None
        return b""
    if result in ("i32", "Status"):
        assert isinstance(value, int)
        return _field(TType.I32, 0) + _i32(value)
    if result == "string":
        assert isinstance(value, str)
        return _field(TType.STRING, 0) + _binary(value.encode("utf-8"))
    if result == "QueueInfo":
        assert isinstance(value, QueueInfo)
        return _field(TType.STRUCT, 0) + _queue_info(value)
    assert result == "list<Item>"
    assert isinstance(value, list)
    header = _field(TType.LIST, 0) + struct.pack(">bi", TType.STRUCT, len(value))
    return header + b"".join(_item(item) for item in value)


def _frame(method: str, message_type: MessageType, seqid: int, body: bytes) -> bytes:
    message = _i32(VERSION_1 - (1 << 32) | message_type) + _binary(method.encode("utf-8"))
    message += _i32(seqid) + body
    return struct.pack(">i", len(message)) + message


def encode_reply(call: ThriftCall, value: ResultValue) -> bytes:
    """The REPLY frame for ``call`` with its result."""
    result = METHODS_BY_NAME[call.method].result
    return _frame(call.method, MessageType.REPLY, call.seqid, _success(result, value) + _stop())


def encode_exception(method: str, seqid: int, error: ApplicationError, message: str) -> bytes:
    """An EXCEPTION frame holding a TApplicationException {1: message, 2: type}."""
    body = _field(TType.STRING, 1) + _binary(message.encode("utf-8"))
    body += _field(TType.I32, 2) + _i32(error) + _stop()
    return _frame(method, MessageType.EXCEPTION, seqid, body)
