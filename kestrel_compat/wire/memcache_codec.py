"""Kestrel 2.x memcache protocol, sans-IO: bytes in, commands out.

Theory of operation. ``MemcacheConnection.receive_data`` appends bytes to a buffer and runs the
reader for the current state until a reader needs more bytes. There are three live states (see
``_READERS``): reading a request line, reading a storage payload, and throwing away a payload larger
than ``value_bytes_max``. Each reader returns an event, returns nothing when it needs more bytes, or
reports progress without an event (a storage line moves the connection to a payload state). Which
words are commands, their arities, what a missing argument costs and whether a payload follows all
come from ``memcache_commands.COMMANDS``; this module only holds the per-command builders.

Events are the frozen command dataclasses below, the commands memcache shares with the text
protocol (``kestrel_compat.wire.commands``), and ``ErrorReply``, which carries the exact bytes
Kestrel would send (spec §1.3) and whether the connection closes after them. After any closing event
(an ``ErrorReply`` with ``close_after``, ``Quit`` or ``Shutdown``) the connection is dead: bytes
that came after it are dropped and ``receive_data`` raises ``MemcacheProtocolError``. Errors Kestrel
can only decide with queue state (``ERROR`` for a second open read, ``SERVER_ERROR`` for the server
status, a silent close for an illegal queue name) belong to the session, which sends the constants
and encoders of ``kestrel_compat.wire.memcache_replies``.

No asyncio, sockets or clock here: timeouts and expiry times stay the relative numbers the client
sent, and the session turns them into deadlines.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from kayos.errors import ProtocolError
from kestrel_compat import limits
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.wire.commands import Confirm, Delete, Flush, Quit, Shutdown, Version
from kestrel_compat.wire.get_options import GetOptions, GetOptionsError, parse_get_key
from kestrel_compat.wire.java import parse_java_int, split_line
from kestrel_compat.wire.memcache_commands import (
    CLIENT_ERROR_CLOSE,
    CLIENT_ERROR_KEEP,
    COMMANDS,
    COMMANDS_BY_NAME,
    SILENT_CLOSE,
    CommandSpec,
    ErrorClass,
)

# --- errors --------------------------------------------------------------------------------------


class MemcacheProtocolError(ProtocolError):
    """The codec was used after its connection closed. Peer input never raises; it gives events."""

    code = "kestrel_protocol_error"


# --- events --------------------------------------------------------------------------------------


# `status <word>` is matched case-insensitively; `down` is not settable and answers like any
# unknown word (spec §7).
_STATUS_BY_WORD: dict[str, ServerStatus] = {status.value.lower(): status for status in ServerStatus}

# Queue names are the latin-1 decoding of the wire bytes, so every byte is one character and
# `name.encode("latin-1")` gives the bytes back. Each command names its row of the command table.
# Confirm, Delete, Flush, Version, Shutdown and Quit are the shared commands of
# `kestrel_compat.wire.commands`.


@dataclass(frozen=True, slots=True)
class Get:
    """``get``/``gets <key>`` (spec §3): only the first key is read."""

    command: ClassVar[str] = "get"
    queue: str
    options: GetOptions


@dataclass(frozen=True, slots=True)
class Set:
    """``set <q> <flags> <exptime> <n>`` and its payload (spec §2, §4).

    ``flags`` is parsed (a bad one is an error) but never stored: VALUE always says 0. ``expiry`` is
    the exptime as sent: 0 never, below 1,000,000 relative seconds, else absolute Unix seconds.
    """

    command: ClassVar[str] = "set"
    queue: str
    flags: int
    expiry: int
    data: bytes


@dataclass(frozen=True, slots=True)
class SetTooLarge:
    """A ``set`` whose payload exceeded ``value_bytes_max`` and was thrown away unread.

    The session answers it as Kestrel answers an item above maxItemSize: the queue is created and
    the reply is ``NOT_STORED`` (spec §2, §4), after the same status and name checks as ``Set``.
    """

    command: ClassVar[str] = "set"
    queue: str
    flags: int
    expiry: int
    length_bytes: int


@dataclass(frozen=True, slots=True)
class FlushAll:
    command: ClassVar[str] = "flush_all"


@dataclass(frozen=True, slots=True)
class FlushExpired:
    command: ClassVar[str] = "flush_expired"
    queue: str


@dataclass(frozen=True, slots=True)
class FlushAllExpired:
    command: ClassVar[str] = "flush_all_expired"


@dataclass(frozen=True, slots=True)
class Stats:
    command: ClassVar[str] = "stats"


@dataclass(frozen=True, slots=True)
class DumpStats:
    """``dump_stats [q …]``: ``queues`` empty means every queue."""

    command: ClassVar[str] = "dump_stats"
    queues: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Monitor:
    """``monitor <q> <secs> [max]`` (spec §5). ``items_max`` None: maxOpenTransactions."""

    command: ClassVar[str] = "monitor"
    queue: str
    timeout_s: int
    items_max: int | None


@dataclass(frozen=True, slots=True)
class Status:
    """``status`` (``target`` None: report) or ``status <s>`` (spec §7)."""

    command: ClassVar[str] = "status"
    target: ServerStatus | None


@dataclass(frozen=True, slots=True)
class Reload:
    command: ClassVar[str] = "reload"


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """What Kestrel sends for a request it refuses, and whether it then closes (spec §1.3).

    ``reply`` is empty when Kestrel closes without a word. ``reason`` is for logs only; it is never
    sent and plays no part in equality.
    """

    reply: bytes
    close_after: bool
    reason: str = field(default="", compare=False)

    @classmethod
    def of(cls, error_class: ErrorClass, reason: str) -> ErrorReply:
        return cls(reply=error_class.reply, close_after=error_class.close_after, reason=reason)


Command: TypeAlias = (
    Get
    | Set
    | SetTooLarge
    | Delete
    | Flush
    | FlushAll
    | FlushExpired
    | FlushAllExpired
    | Version
    | Stats
    | DumpStats
    | Monitor
    | Confirm
    | Status
    | Reload
    | Shutdown
    | Quit
)
Event: TypeAlias = Command | ErrorReply


def closes_connection(event: Event) -> bool:
    """Whether the server closes the connection once it has handled ``event``."""
    if isinstance(event, ErrorReply):
        return event.close_after
    return COMMANDS_BY_NAME[event.command].closes_connection


# --- request line parsing ------------------------------------------------------------------------


def _build_get(arguments: list[str]) -> Event:
    return _get_event(arguments[0])


@functools.lru_cache(maxsize=limits.get_key_cache_entries_max)
def _get_event(key: str) -> Event:
    # Clients repeat a handful of keys (`q/open`, `q/close`), and the event of a key depends on
    # nothing else and never changes, so the parsed events are kept.
    try:
        parsed = parse_get_key(key)
    except GetOptionsError as error:
        return ErrorReply.of(error.error_class, f"get {key!r}: {error}")
    return Get(queue=parsed.queue, options=parsed.options)


def _build_monitor(arguments: list[str]) -> Event:
    timeout_s = parse_java_int(arguments[1])
    if timeout_s is None:
        return ErrorReply.of(SILENT_CLOSE, "monitor seconds is not a Java int")
    items_max: int | None = None
    if len(arguments) > 2:
        items_max = parse_java_int(arguments[2])
        if items_max is None:
            return ErrorReply.of(SILENT_CLOSE, "monitor max is not a Java int")
    return Monitor(queue=arguments[0], timeout_s=timeout_s, items_max=items_max)


def _build_confirm(arguments: list[str]) -> Event:
    count = parse_java_int(arguments[1])
    if count is None:
        return ErrorReply.of(SILENT_CLOSE, "confirm count is not a Java int")
    return Confirm(queue=arguments[0], count=count)


def _build_status(arguments: list[str]) -> Event:
    if not arguments:
        return Status(target=None)
    target = _STATUS_BY_WORD.get(arguments[0].lower())
    if target is None:
        return ErrorReply.of(CLIENT_ERROR_CLOSE, f"unknown status {arguments[0]!r}")
    return Status(target=target)


# Builders for commands without a payload. They receive the arguments after the command word, at
# least arguments_min and at most arguments_max of them, as the table guarantees.
_LINE_BUILDERS: dict[str, Callable[[list[str]], Event]] = {
    "get": _build_get,
    "gets": _build_get,
    "delete": lambda arguments: Delete(queue=arguments[0]),
    "flush": lambda arguments: Flush(queue=arguments[0]),
    "flush_all": lambda arguments: FlushAll(),
    "flush_expired": lambda arguments: FlushExpired(queue=arguments[0]),
    "flush_all_expired": lambda arguments: FlushAllExpired(),
    "version": lambda arguments: Version(),
    "stats": lambda arguments: Stats(),
    "dump_stats": lambda arguments: DumpStats(queues=tuple(arguments)),
    "monitor": _build_monitor,
    "confirm": _build_confirm,
    "status": _build_status,
    "reload": lambda arguments: Reload(),
    "shutdown": lambda arguments: Shutdown(),
    "quit": lambda arguments: Quit(),
}

assert set(_LINE_BUILDERS) == {
    spec.name for spec in COMMANDS if spec.supported and not spec.payload
}, "every supported line command has a builder, and only those"
assert {spec.name for spec in COMMANDS if spec.supported and spec.payload} == {"set"}


@dataclass(frozen=True, slots=True)
class _StorageLine:
    """A storage request line whose payload is still being read."""

    spec: CommandSpec
    arguments: tuple[str, ...]
    length_bytes: int


def _finish_storage(line: _StorageLine, data: bytes | None) -> Event:
    # Runs once the payload is consumed, as Kestrel decides only after framing the whole request.
    # `data` is None when the payload was too large and thrown away.
    if not line.spec.supported:
        return ErrorReply.of(CLIENT_ERROR_CLOSE, f"{line.spec.name} is not a Kestrel command")
    queue, flags_token, expiry_token = line.arguments[0], line.arguments[1], line.arguments[2]
    # The exptime is read before the flags: a line with both bad closes silently.
    expiry = parse_java_int(expiry_token)
    if expiry is None:
        return ErrorReply.of(SILENT_CLOSE, "set exptime is not a Java int")
    flags = parse_java_int(flags_token)
    if flags is None:
        return ErrorReply.of(CLIENT_ERROR_KEEP, "set flags is not a Java int")
    if data is None:
        return SetTooLarge(queue=queue, flags=flags, expiry=expiry, length_bytes=line.length_bytes)
    assert len(data) == line.length_bytes
    return Set(queue=queue, flags=flags, expiry=expiry, data=data)


# --- the connection ------------------------------------------------------------------------------


_CR = 0x0D


class _State(enum.Enum):
    LINE = "line"
    PAYLOAD = "payload"
    DISCARD = "discard"
    CLOSED = "closed"


class _Progress(enum.Enum):
    """A reader consumed input and changed state without producing an event."""

    MADE = "made"


_Step: TypeAlias = Event | _Progress | None


class MemcacheConnection:
    """The server side of one Kestrel memcache connection, without I/O.

    Feed it what the socket delivers; handle the events it returns in order; write the replies.
    Bounds may be lowered below ``kestrel_compat.limits`` (tests do), never raised.
    """

    def __init__(
        self,
        *,
        line_bytes_max: int = limits.line_bytes_max,
        value_bytes_max: int = limits.value_bytes_max,
    ) -> None:
        if not 0 < line_bytes_max <= limits.line_bytes_max:
            raise ValueError(f"line_bytes_max must be in 1..{limits.line_bytes_max}")
        if not 0 <= value_bytes_max <= limits.value_bytes_max:
            raise ValueError(f"value_bytes_max must be in 0..{limits.value_bytes_max}")
        self._line_bytes_max = line_bytes_max
        self._value_bytes_max = value_bytes_max
        self._state = _State.LINE
        self._buffer = bytearray()
        self._start = 0  # First byte not yet consumed.
        self._scan_from = 0  # Bytes before this hold no LF of the current line.
        self._storage_line: _StorageLine | None = None
        self._discard_remaining_bytes = 0

    @property
    def closed(self) -> bool:
        """Whether a closing event has been returned; the server must close the socket."""
        return self._state is _State.CLOSED

    @property
    def buffered(self) -> bytes:
        """Bytes received but not yet part of an event: a partial line, or a partial payload."""
        return bytes(self._buffer[self._start :])

    def receive_data(self, data: bytes) -> list[Event]:
        """Add bytes from the peer; return every event they complete, in order.

        Never raises for any input. Raises ``MemcacheProtocolError`` if called after a closing
        event, since the server should have closed the connection then.
        """
        if self._state is _State.CLOSED:
            raise MemcacheProtocolError("receive_data after the connection closed")
        self._buffer += data
        events: list[Event] = []
        while True:
            step = _READERS[self._state](self)
            if step is None:
                break
            if step is _Progress.MADE:
                continue
            events.append(step)
            if closes_connection(step):
                self._close()
                break
        self._compact()
        return events

    # --- readers, one per state (see _READERS) ---

    def _read_line(self) -> _Step:
        window_end = self._start + self._line_bytes_max + 1  # The LF may sit right after max bytes.
        end = self._buffer.find(b"\n", self._scan_from, window_end)
        if end == -1:
            if len(self._buffer) - self._start > self._line_bytes_max:
                return ErrorReply.of(
                    CLIENT_ERROR_CLOSE, f"request line longer than {self._line_bytes_max} bytes"
                )
            self._scan_from = len(self._buffer)
            return None
        buffer, start = self._buffer, self._start
        line_end = end - 1 if end > start and buffer[end - 1] == _CR else end
        line = buffer[start:line_end].decode("latin-1")
        self._consume(end + 1 - start)
        return self._dispatch(line)

    def _read_payload(self) -> _Step:
        storage_line = self._storage_line
        assert storage_line is not None
        needed = storage_line.length_bytes + limits.payload_terminator_bytes
        if len(self._buffer) - self._start < needed:
            return None
        data = bytes(self._buffer[self._start : self._start + storage_line.length_bytes])
        self._consume(needed)  # The two bytes after the payload are skipped unchecked.
        self._storage_line = None
        self._state = _State.LINE
        return _finish_storage(storage_line, data)

    def _read_discard(self) -> _Step:
        storage_line = self._storage_line
        assert storage_line is not None
        assert self._discard_remaining_bytes > 0
        taken = min(len(self._buffer) - self._start, self._discard_remaining_bytes)
        self._consume(taken)
        self._discard_remaining_bytes -= taken
        if self._discard_remaining_bytes > 0:
            return None
        self._storage_line = None
        self._state = _State.LINE
        return _finish_storage(storage_line, None)

    def _read_closed(self) -> _Step:
        raise AssertionError("receive_data never runs a reader once closed")

    # --- helpers ---

    def _dispatch(self, line: str) -> _Step:
        tokens = split_line(line)
        if not tokens:
            return ErrorReply.of(SILENT_CLOSE, "request line has no tokens")
        name = tokens[0].lower()
        spec = COMMANDS_BY_NAME.get(name)
        if spec is None:
            return ErrorReply.of(CLIENT_ERROR_CLOSE, f"unknown command {name!r}")
        arguments = tokens[1:]
        if len(arguments) < spec.arguments_min:
            assert spec.missing_argument is not None
            return ErrorReply.of(spec.missing_argument, f"{name}: missing argument")
        if spec.arguments_max is not None:
            arguments = arguments[: spec.arguments_max]
        if spec.payload_length_argument is not None:
            return self._begin_payload(spec, arguments, spec.payload_length_argument)
        if not spec.supported:
            return ErrorReply.of(CLIENT_ERROR_CLOSE, f"{name} is not a Kestrel command")
        return _LINE_BUILDERS[name](arguments)

    def _begin_payload(self, spec: CommandSpec, arguments: list[str], index: int) -> _Step:
        length_bytes = parse_java_int(arguments[index])
        if length_bytes is None or length_bytes < 0:
            return ErrorReply.of(SILENT_CLOSE, f"{spec.name}: bad byte count {arguments[index]!r}")
        self._storage_line = _StorageLine(spec, tuple(arguments), length_bytes)
        if length_bytes <= self._value_bytes_max:
            self._state = _State.PAYLOAD
        else:
            self._state = _State.DISCARD
            self._discard_remaining_bytes = length_bytes + limits.payload_terminator_bytes
        return _Progress.MADE

    def _consume(self, count: int) -> None:
        assert 0 <= count <= len(self._buffer) - self._start
        self._start += count
        self._scan_from = self._start

    def _compact(self) -> None:
        # Drop consumed bytes once per receive_data: a burst of pipelined requests costs one copy.
        if self._start > 0:
            del self._buffer[: self._start]
            self._scan_from -= self._start
            self._start = 0
        assert 0 <= self._scan_from <= len(self._buffer)

    def _close(self) -> None:
        self._state = _State.CLOSED
        self._buffer.clear()
        self._start = 0
        self._scan_from = 0
        self._storage_line = None


_READERS: dict[_State, Callable[[MemcacheConnection], _Step]] = {
    _State.LINE: MemcacheConnection._read_line,
    _State.PAYLOAD: MemcacheConnection._read_payload,
    _State.DISCARD: MemcacheConnection._read_discard,
    _State.CLOSED: MemcacheConnection._read_closed,
}
assert set(_READERS) == set(_State)
