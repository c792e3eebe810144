"""Kestrel 2.x text protocol (spec §10, default port 2222), sans-IO: bytes in, commands out.

Theory of operation. Every request is a line ended by LF; one CR before the LF is dropped and the
line is decoded as ISO-8859-1. A request line that ends in ``:`` is followed by item lines, up to
an empty line or ``text_put_items_max`` items; the line after the last item ends the request in
either case, so with a full put it is lost (Kestrel's TextCodec). Item lines are re-encoded from
ISO-8859-1 to UTF-8 as Kestrel does, so a byte >= 0x80 becomes two. Any command may carry items;
only ``put`` uses them.

The line (without its ``:``) is split with Java's ``String.split(" ")``; token 0, lower-cased, is
the command. ``TEXT_COMMANDS`` declares each command: how many arguments it needs, the error it
answers when one is missing, and the operation name the server status refuses it under. The codec
decides everything that depends only on the bytes (missing arguments, numbers, unknown commands);
the text session (``kestrel_compat.sessions.text_session``) decides the rest.

Replies are one line each: ``+<n>`` (a count), ``-<message>`` (an error; the connection stays
open), ``:<item>`` or ``:<string>``, and ``*`` (no item). Kestrel closes the connection without a
word on ``quit`` and on a non-integer ``monitor`` timeout or ``confirm`` count (an uncaught
exception); the codec reports those as ``Quit`` and ``Close``. After either it is dead: later bytes
are dropped and ``receive_data`` raises ``TextProtocolError``.

No asyncio, sockets or clock here: timeouts and expiries stay the relative milliseconds sent.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from kayos.errors import ProtocolError
from kestrel_compat import limits
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.wire.commands import Close, Confirm, Delete, Flush, Quit, Shutdown, Version
from kestrel_compat.wire.java import parse_java_int, split_line


class TextProtocolError(ProtocolError):
    """The codec was used after its connection closed. Peer input never raises; it gives events."""

    code = "kestrel_text_protocol_error"


# --- events --------------------------------------------------------------------------------------

# ``Confirm(queue, count)``, ``Flush(queue)``, ``Delete(queue)``, ``Version()``, ``Shutdown()`` and
# ``Quit()`` are the commands the text protocol shares with memcache, and ``Close`` the silent close
# it shares with thrift (``kestrel_compat.wire.commands``). Here ``shutdown`` is answered ``+0``
# and keeps the connection; ``quit`` closes it without a word, as in memcache.


@dataclass(frozen=True, slots=True)
class Put:
    """``put <q> [exp_ms]:`` and its item lines. ``expiry_ms`` is relative; None: never.

    An item is None when it was larger than Kayos stores (``text_item_line_bytes_max``, or the
    put's ``text_put_bytes_max``): it was thrown away and is refused like an item over maxItemSize.
    """

    command: ClassVar[str] = "put"
    queue: str
    expiry_ms: int | None
    items: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Get:
    """``get <q> [timeout_ms]``: confirm every open read on q, then open one."""

    command: ClassVar[str] = "get"
    queue: str
    timeout_ms: int | None


@dataclass(frozen=True, slots=True)
class Peek:
    """``peek <q> [timeout_ms]``: confirm every open read on q, then show the head."""

    command: ClassVar[str] = "peek"
    queue: str
    timeout_ms: int | None


@dataclass(frozen=True, slots=True)
class Monitor:
    """``monitor <q> <timeout_ms>``: confirm, then stream open reads until the timeout."""

    command: ClassVar[str] = "monitor"
    queue: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class StatusQuery:
    """``status``: report the server status."""

    command: ClassVar[str] = "status"


@dataclass(frozen=True, slots=True)
class StatusChange:
    """``status <s>``: ``target`` None for an unknown word; ``down`` is known but forbidden."""

    command: ClassVar[str] = "status"
    target: ServerStatus | None
    forbidden: bool


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """``-<message>``; the connection stays open."""

    message: str


TextCommand: TypeAlias = (
    Put
    | Get
    | Peek
    | Monitor
    | Confirm
    | Flush
    | Delete
    | StatusQuery
    | StatusChange
    | Version
    | Shutdown
    | Quit
)
TextEvent: TypeAlias = TextCommand | ErrorReply | Close


def closes_connection(event: TextEvent) -> bool:
    """Whether the server closes the connection once it has handled ``event``."""
    return isinstance(event, Quit | Close)


# --- the command table ---------------------------------------------------------------------------

QUEUE_NAME_REQUIRED = "Queue name required."


@dataclass(frozen=True, slots=True)
class TextCommandSpec:
    """One text command as Kestrel's TextHandler answers it (spec §10).

    ``arguments_min`` arguments must follow the word, else the reply is ``-<missing>``.
    ``status_operation`` is the name in ``-Server not available for operation <op>`` when the
    server status refuses the command (None: never refused).
    """

    name: str
    summary: str
    arguments_min: int = 0
    missing: str | None = None
    status_operation: str | None = None


TEXT_COMMANDS: tuple[TextCommandSpec, ...] = (
    TextCommandSpec("put", "add the item lines to a queue", 1, QUEUE_NAME_REQUIRED, "setItem"),
    TextCommandSpec("get", "confirm open reads, open the head", 1, QUEUE_NAME_REQUIRED, "getItem"),
    TextCommandSpec("peek", "confirm open reads, show the head", 1, QUEUE_NAME_REQUIRED, "getItem"),
    TextCommandSpec(
        "monitor",
        "confirm open reads, stream open reads until the timeout",
        2,
        "Queue name & timeout required.",
        "monitorUntil",
    ),
    TextCommandSpec(
        "confirm", "confirm the n oldest open reads", 2, "Queue name & count required."
    ),
    TextCommandSpec("flush", "remove a queue's available items", 1, QUEUE_NAME_REQUIRED, "flush"),
    TextCommandSpec("delete", "drop a queue", 1, QUEUE_NAME_REQUIRED, "delete"),
    TextCommandSpec("status", "show or set the server status"),
    TextCommandSpec("version", "server version"),
    TextCommandSpec("shutdown", "stop the server"),
    TextCommandSpec("quit", "close this connection"),
)
TEXT_COMMANDS_BY_NAME: dict[str, TextCommandSpec] = {spec.name: spec for spec in TEXT_COMMANDS}


def _timeout(arguments: list[str], message: str) -> int | ErrorReply | None:
    # An optional second argument, a Java int; present but bad is the command's parse error.
    if len(arguments) < 2:
        return None
    value = parse_java_int(arguments[1])
    return ErrorReply(message) if value is None else value


def _build_put(arguments: list[str], items: tuple[bytes | None, ...]) -> TextEvent:
    expiry_ms = _timeout(arguments, "Error parsing expiration time.")
    if isinstance(expiry_ms, ErrorReply):
        return expiry_ms
    return Put(queue=arguments[0], expiry_ms=expiry_ms, items=items)


def _build_fetch(kind: type[Get] | type[Peek]) -> Callable[[list[str]], TextEvent]:
    def build(arguments: list[str]) -> TextEvent:
        timeout_ms = _timeout(arguments, "Error parsing timeout.")
        if isinstance(timeout_ms, ErrorReply):
            return timeout_ms
        return kind(queue=arguments[0], timeout_ms=timeout_ms)

    return build


def _build_monitor(arguments: list[str]) -> TextEvent:
    timeout_ms = parse_java_int(arguments[1])
    if timeout_ms is None:
        return Close("monitor timeout is not a Java int")
    return Monitor(queue=arguments[0], timeout_ms=timeout_ms)


def _build_confirm(arguments: list[str]) -> TextEvent:
    count = parse_java_int(arguments[1])
    if count is None:
        return Close("confirm count is not a Java int")
    return Confirm(queue=arguments[0], count=count)


# Status words Kestrel knows (Java toUpperCase, then matched); DOWN is known but cannot be set.
_STATUS_WORDS: dict[str, ServerStatus] = {status.value: status for status in ServerStatus}
_FORBIDDEN_STATUS_WORD = "DOWN"


def _build_status(arguments: list[str]) -> TextEvent:
    if not arguments:
        return StatusQuery()
    word = arguments[0].upper()
    return StatusChange(target=_STATUS_WORDS.get(word), forbidden=word == _FORBIDDEN_STATUS_WORD)


# Builders receive at least arguments_min arguments, as the table guarantees.
_BUILDERS: dict[str, Callable[[list[str]], TextEvent]] = {
    "get": _build_fetch(Get),
    "peek": _build_fetch(Peek),
    "monitor": _build_monitor,
    "confirm": _build_confirm,
    "flush": lambda arguments: Flush(queue=arguments[0]),
    "delete": lambda arguments: Delete(queue=arguments[0]),
    "status": _build_status,
    "version": lambda arguments: Version(),
    "shutdown": lambda arguments: Shutdown(),
    "quit": lambda arguments: Quit(),
}
assert set(_BUILDERS) | {"put"} == set(TEXT_COMMANDS_BY_NAME), "one builder per command"


def build_request(tokens: list[str], items: tuple[bytes | None, ...]) -> TextEvent:
    """The event for one complete request: its tokens and the item lines that followed it."""
    if not tokens:
        # Kestrel indexes token 0 of an empty array (a line of spaces): an uncaught exception.
        return Close("request line has no tokens")
    name = tokens[0].lower()
    arguments = tokens[1:]
    spec = TEXT_COMMANDS_BY_NAME.get(name)
    if spec is None:
        return ErrorReply(f"Unknown command: {name}")
    if len(arguments) < spec.arguments_min:
        assert spec.missing is not None
        return ErrorReply(spec.missing)
    if name == "put":
        return _build_put(arguments, items)
    return _BUILDERS[name](arguments)


# --- the connection ------------------------------------------------------------------------------


class _State(enum.Enum):
    LINE = "line"  # a request line
    ITEMS = "items"  # the item lines after a line ending in ':'
    DISCARD = "discard"  # the rest of an item line too long to keep
    CLOSED = "closed"


class TextConnection:
    """The server side of one Kestrel text connection, without I/O.

    Feed it what the socket delivers; handle the events it returns in order; write the replies.
    Bounds may be lowered below ``kestrel_compat.limits`` (tests do), never raised.
    """

    def __init__(
        self,
        *,
        line_bytes_max: int = limits.line_bytes_max,
        item_line_bytes_max: int = limits.text_item_line_bytes_max,
        put_bytes_max: int = limits.text_put_bytes_max,
    ) -> None:
        if not 0 < line_bytes_max <= limits.line_bytes_max:
            raise ValueError(f"line_bytes_max must be in 1..{limits.line_bytes_max}")
        if not 0 < item_line_bytes_max <= limits.text_item_line_bytes_max:
            raise ValueError(f"item_line_bytes_max must be in 1..{limits.text_item_line_bytes_max}")
        if not 0 <= put_bytes_max <= limits.text_put_bytes_max:
            raise ValueError(f"put_bytes_max must be in 0..{limits.text_put_bytes_max}")
        self._line_bytes_max = line_bytes_max
        self._item_line_bytes_max = item_line_bytes_max
        self._put_bytes_max = put_bytes_max
        self._state = _State.LINE
        self._buffer = bytearray()
        self._scan_from = 0  # Bytes before this hold no LF of the current line.
        self._tokens: list[str] = []
        self._items: list[bytes | None] = []
        self._item_bytes = 0

    @property
    def closed(self) -> bool:
        """Whether a closing event has been returned; the server must close the socket."""
        return self._state is _State.CLOSED

    @property
    def buffered(self) -> bytes:
        """Bytes received but not yet part of an event or a kept item."""
        return bytes(self._buffer)

    def receive_data(self, data: bytes) -> list[TextEvent]:
        """Add bytes from the peer; return every event they complete, in order.

        Never raises for any input. Raises ``TextProtocolError`` if called after a closing event.
        """
        if self._state is _State.CLOSED:
            raise TextProtocolError("receive_data after the connection closed")
        self._buffer += data
        events: list[TextEvent] = []
        while True:
            event, progressed = self._step()
            if event is not None:
                events.append(event)
                if closes_connection(event):
                    self._close()
                    break
            if not progressed:
                break
        return events

    # --- one step: at most one line ---

    def _step(self) -> tuple[TextEvent | None, bool]:
        if self._state is _State.DISCARD:
            return self._discard()
        bound = self._line_bytes_max if self._state is _State.LINE else self._item_line_bytes_max
        end = self._buffer.find(b"\n", self._scan_from, bound + 1)
        if end == -1:
            if len(self._buffer) <= bound:
                self._scan_from = len(self._buffer)
                return None, False
            if self._state is _State.LINE:
                return Close(f"request line longer than {bound} bytes"), False
            self._state = _State.DISCARD  # An item line too long to keep: drop it as it comes.
            return None, True
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._scan_from = 0
        if line.endswith(b"\r"):
            line = line[:-1]
        text = line.decode("latin-1")
        if self._state is _State.LINE:
            return self._request_line(text), True
        return self._item_line(text), True

    def _request_line(self, text: str) -> TextEvent | None:
        if text.endswith(":"):
            self._tokens = split_line(text[:-1])
            self._state = _State.ITEMS
            return None
        return build_request(split_line(text), ())

    def _item_line(self, text: str) -> TextEvent | None:
        if text == "" or len(self._items) >= limits.text_put_items_max:
            return self._finish_items()
        data = text.encode("utf-8")  # Kestrel's ISO-8859-1 to UTF-8 re-encoding.
        too_large = len(data) > self._item_line_bytes_max
        if too_large or self._item_bytes + len(data) > self._put_bytes_max:
            self._items.append(None)
        else:
            self._items.append(data)
            self._item_bytes += len(data)
        return None

    def _discard(self) -> tuple[TextEvent | None, bool]:
        end = self._buffer.find(b"\n")
        if end == -1:
            self._buffer.clear()
            return None, False
        del self._buffer[: end + 1]
        self._scan_from = 0
        self._state = _State.ITEMS
        if len(self._items) >= limits.text_put_items_max:
            return self._finish_items(), True
        self._items.append(None)
        return None, True

    def _finish_items(self) -> TextEvent:
        event = build_request(self._tokens, tuple(self._items))
        self._state = _State.LINE
        self._tokens = []
        self._items = []
        self._item_bytes = 0
        return event

    def _close(self) -> None:
        self._state = _State.CLOSED
        self._buffer.clear()
        self._tokens = []
        self._items = []


# --- replies (spec §10) --------------------------------------------------------------------------

NO_ITEM = b"*\n"
ZERO = b"+0\n"


def _ascii(text: str) -> bytes:
    # Java's getBytes("ascii"): a character outside ASCII becomes '?'.
    return text.encode("ascii", errors="replace")


def encode_item(data: bytes | None) -> bytes:
    """``:<item>`` (the data as stored), or ``*`` when there is none."""
    if data is None:
        return NO_ITEM
    return b":" + data + b"\n"


def encode_count(count: int) -> bytes:
    """``+<n>``."""
    return b"+%d\n" % count


def encode_error(message: str) -> bytes:
    """``-<message>``."""
    return b"-" + _ascii(message) + b"\n"


def encode_string(text: str) -> bytes:
    """``:<text>`` (status words, the version)."""
    return b":" + _ascii(text) + b"\n"


def unavailable_message(operation: str) -> str:
    """Kestrel's AvailabilityException text: the server status refused ``operation``."""
    return f"Server not available for operation {operation}"
