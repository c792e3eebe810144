"""The Kestrel memcache codec: framing, commands, error classes and reply bytes (spec §1-§7).

Fixtures are (input bytes, expected events) pairs, checked the way h11 checks its own: fed whole,
split in two at every byte position, byte by byte, and followed by a partial request that must stay
in the buffer (or, after a closing event, be dropped). The table runs on a connection with small
bounds (64-byte lines, 16-byte items) so the bound cases stay short; the real bounds are tested
separately.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kayos.errors import ProtocolError
from kestrel_compat import limits
from kestrel_compat.core.collection import queue_name_is_legal
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.wire.commands import Confirm, Delete, Flush, Quit, Shutdown, Version
from kestrel_compat.wire.get_options import GetOptions
from kestrel_compat.wire.java import parse_java_int
from kestrel_compat.wire.memcache_codec import (
    Command,
    DumpStats,
    ErrorReply,
    Event,
    FlushAll,
    FlushAllExpired,
    FlushExpired,
    Get,
    MemcacheConnection,
    MemcacheProtocolError,
    Monitor,
    Reload,
    Set,
    SetTooLarge,
    Stats,
    Status,
    closes_connection,
)
from kestrel_compat.wire.memcache_commands import (
    CLIENT_ERROR_CLOSE,
    CLIENT_ERROR_KEEP,
    COMMANDS,
    COMMANDS_BY_NAME,
    ERROR_CLASSES,
    ERROR_CLOSE,
    ERROR_KEEP,
    SERVER_ERROR_CLOSE,
    SILENT_CLOSE,
    CommandSpec,
    ErrorClass,
)
from kestrel_compat.wire.memcache_replies import (
    CLIENT_ERROR,
    DELETED,
    END,
    ERROR,
    FLUSHED_ALL,
    NOT_STORED,
    RELOADED,
    SERVER_ERROR,
    STORED,
    encode_count,
    encode_dump_stats,
    encode_stats,
    encode_status,
    encode_value,
    encode_version,
)
from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

LINE_BYTES_MAX = 64
VALUE_BYTES_MAX = 16

KEEP = ErrorReply.of(CLIENT_ERROR_KEEP, "")
CLOSE = ErrorReply.of(CLIENT_ERROR_CLOSE, "")
SILENT = ErrorReply.of(SILENT_CLOSE, "")

DOCS = REPO_ROOT / "docs" / "kestrel-compat.md"


def get(
    queue: str,
    *,
    timeout_ms: int | None = None,
    open: bool = False,
    close: bool = False,
    peek: bool = False,
) -> Get:
    options = GetOptions(timeout_ms=timeout_ms, open=open, close=close, peek=peek)
    return Get(queue=queue, options=options)


def connection() -> MemcacheConnection:
    return MemcacheConnection(line_bytes_max=LINE_BYTES_MAX, value_bytes_max=VALUE_BYTES_MAX)


def feed(conn: MemcacheConnection, chunks: Iterable[bytes]) -> list[Event]:
    """Feed chunks as a server loop would: stop once a closing event came out."""
    events: list[Event] = []
    for chunk in chunks:
        if conn.closed:
            break
        events.extend(conn.receive_data(chunk))
    return events


# --- the fixture table ----------------------------------------------------------------------------

FILLER = b"0123456789abcdefXYZ"  # 16 bytes fit VALUE_BYTES_MAX; 17 do not.

# (id naming the spec section, input bytes, expected events)
CASES: list[tuple[str, bytes, list[Event]]] = [
    # §1.1 lines, case, tokens
    ("1.1-crlf", b"get q\r\n", [get("q")]),
    ("1.1-lf-only", b"get q\n", [get("q")]),
    ("1.1-command-case", b"GET q\r\n", [get("q")]),
    ("1.1-mixed-case", b"gEt Q\r\n", [get("Q")]),
    ("1.1-one-cr-stripped", b"get q\r\r\n", [get("q\r")]),
    ("1.1-inner-cr-kept", b"get q\rx\r\n", [get("q\rx")]),
    ("1.1-latin-1", b"get \xe9t\xe9\r\n", [get("\xe9t\xe9")]),
    ("1.1-trailing-space", b"get q \r\n", [get("q")]),
    ("1.1-pipelined", b"get a\r\nget b\nget c\r\n", [get("a"), get("b"), get("c")]),
    ("1.1-empty-line", b"\r\n", [CLOSE]),
    ("1.1-empty-line-lf", b"\n", [CLOSE]),
    ("1.1-leading-space", b" get q\r\n", [CLOSE]),
    ("1.1-spaces-only", b"   \r\n", [SILENT]),
    ("1.1-close-drops-rest", b"bogus\r\nget q\r\n", [CLOSE]),
    # §2 get/gets: only the first key; missing key keeps the connection
    ("2-get-first-key-only", b"get a b\r\n", [get("a")]),
    ("2-gets", b"gets q\r\n", [get("q")]),
    ("2-get-missing", b"get\r\n", [KEEP]),
    ("2-get-missing-trailing-space", b"get \r\n", [KEEP]),
    ("2-get-missing-then-more", b"get\r\nget q\r\n", [KEEP, get("q")]),
    ("2-get-empty-key", b"get  q\r\n", [CLOSE]),
    # §3.2 GET options through the codec
    ("3.2-options", b"get q/t=500/open\r\n", [get("q", timeout_ms=500, open=True)]),
    ("3.2-close-open", b"get q/close/open\r\n", [get("q", close=True, open=True)]),
    ("3.2-ignored", b"get q/xyz\r\n", [get("q")]),
    ("3.2-only-slashes", b"get /\r\n", [KEEP]),
    ("3.2-only-slashes-then-more", b"get //\r\nget q\r\n", [KEEP, get("q")]),
    ("3.2-empty-queue", b"get /open\r\n", [CLOSE]),
    ("3.2-conflict", b"get q/peek/open\r\nget q\r\n", [CLOSE]),
    ("3.2-bad-timeout", b"get q/t=x\r\n", [SILENT]),
    ("3.2-second-key-not-parsed", b"get q/t=5 x/t=y\r\n", [get("q", timeout_ms=5)]),
    # §1.1/§2/§4 set
    ("2-set", b"set q 0 0 5\r\nhello\r\n", [Set("q", 0, 0, b"hello")]),
    ("2-set-upper", b"SET q 0 0 5\r\nhello\r\n", [Set("q", 0, 0, b"hello")]),
    ("1.1-set-noreply-ignored", b"set q 0 0 5 noreply\r\nhello\r\n", [Set("q", 0, 0, b"hello")]),
    ("4-set-flags-expiry", b"set q 7 60 5\r\nhello\r\n", [Set("q", 7, 60, b"hello")]),
    ("4-set-negative", b"set q -1 -5 1\r\nx\r\n", [Set("q", -1, -5, b"x")]),
    ("4-set-plus-signs", b"set q +1 +2 +1\r\nx\r\n", [Set("q", 1, 2, b"x")]),
    ("4-set-leading-zeros", b"set q 007 0 01\r\nx\r\n", [Set("q", 7, 0, b"x")]),
    ("4-set-absolute", b"set q 0 1000000 1\r\nx\r\n", [Set("q", 0, 1000000, b"x")]),
    ("4-set-empty-item", b"set q 0 0 0\r\n\r\n", [Set("q", 0, 0, b"")]),
    ("4-set-crlf-inside", b"set q 0 0 4\r\n\r\n\r\n\r\n", [Set("q", 0, 0, b"\r\n\r\n")]),
    ("4-set-nul-inside", b"set q 0 0 3\r\na\x00b\r\n", [Set("q", 0, 0, b"a\x00b")]),
    ("1.1-terminator-unchecked", b"set q 0 0 2\r\nhiXY", [Set("q", 0, 0, b"hi")]),
    (
        "1.1-terminator-any-two-bytes",
        b"set q 0 0 2\r\nhi\nXget r\r\n",
        [Set("q", 0, 0, b"hi"), get("r")],
    ),
    ("1.1-set-then-get", b"set q 0 0 2\r\nhi\r\nget q\r\n", [Set("q", 0, 0, b"hi"), get("q")]),
    ("1.3-flags-max", b"set q 2147483647 0 2\r\nhi\r\n", [Set("q", 2147483647, 0, b"hi")]),
    ("1.3-flags-min", b"set q -2147483648 0 2\r\nhi\r\n", [Set("q", -(2**31), 0, b"hi")]),
    ("1.3-flags-too-big", b"set q 2147483648 0 2\r\nhi\r\n", [KEEP]),
    ("1.3-flags-word", b"set q x 0 2\r\nhi\r\nget r\r\n", [KEEP, get("r")]),
    ("1.3-flags-underscore", b"set q 1_0 0 2\r\nhi\r\n", [KEEP]),
    ("1.3-exptime-word", b"set q 0 x 2\r\nhi\r\nget r\r\n", [SILENT]),
    ("1.3-exptime-too-big", b"set q 0 2147483648 2\r\nhi\r\n", [SILENT]),
    ("1.3-exptime-before-flags", b"set q x x 2\r\nhi\r\n", [SILENT]),
    ("1.3-set-3-args", b"set q 0 0\r\n", [SILENT]),
    ("1.3-set-1-arg", b"set q\r\n", [SILENT]),
    ("1.3-set-bare", b"set\r\n", [SILENT]),
    ("1.3-set-trailing-space", b"set q 0 0 \r\n", [SILENT]),
    ("1.3-set-count-word", b"set q 0 0 x\r\nhi\r\n", [SILENT]),
    ("1.3-set-count-empty", b"set q 0 0  2\r\nhi\r\n", [SILENT]),
    ("1.3-set-count-negative", b"set q 0 0 -1\r\nhi\r\n", [SILENT]),
    ("1.3-set-count-too-big", b"set q 0 0 2147483648\r\n", [SILENT]),
    ("8.1-set-name-not-checked", b"set a.b 0 0 1\r\nx\r\n", [Set("a.b", 0, 0, b"x")]),
    # Kayos bounds: items above value_bytes_max are thrown away and reported as SetTooLarge
    (
        "kayos-value-at-bound",
        b"set q 0 0 16\r\n" + FILLER[:16] + b"\r\n",
        [Set("q", 0, 0, FILLER[:16])],
    ),
    ("kayos-value-over", b"set q 0 0 17\r\n" + FILLER[:17] + b"\r\n", [SetTooLarge("q", 0, 0, 17)]),
    (
        "kayos-value-over-then-more",
        b"set q 3 9 17\r\n" + FILLER[:17] + b"\r\nget r\r\n",
        [SetTooLarge("q", 3, 9, 17), get("r")],
    ),
    ("kayos-value-over-bad-expiry", b"set q 0 x 17\r\n" + FILLER[:17] + b"\r\n", [SILENT]),
    ("kayos-value-over-bad-flags", b"set q x 0 17\r\n" + FILLER[:17] + b"\r\n", [KEEP]),
    ("kayos-line-at-bound", b"get " + b"a" * 59 + b"\r\n", [get("a" * 59)]),
    ("kayos-line-at-bound-lf", b"get " + b"a" * 60 + b"\n", [get("a" * 60)]),
    ("kayos-line-over", b"get " + b"a" * 60 + b"\r\n", [CLOSE]),
    ("kayos-line-over-no-lf", b"x" * 65, [CLOSE]),
    # §1.3 storage words Kestrel frames but refuses, after their payload
    ("1.3-add", b"add q 0 0 2\r\nhi\r\n", [CLOSE]),
    ("1.3-add-upper", b"ADD q 0 0 2\r\nhi\r\n", [CLOSE]),
    ("1.3-replace", b"replace q 0 0 2\r\nhi\r\n", [CLOSE]),
    ("1.3-append", b"append q 0 0 2\r\nhi\r\n", [CLOSE]),
    ("1.3-prepend", b"prepend q 0 0 2\r\nhi\r\n", [CLOSE]),
    ("1.3-cas", b"cas q 0 0 2 99\r\nhi\r\n", [CLOSE]),
    ("1.3-add-short", b"add q 0 0\r\n", [SILENT]),
    ("1.3-add-bad-count", b"add q 0 0 x\r\n", [SILENT]),
    ("1.3-add-oversize", b"add q 0 0 17\r\n" + FILLER[:17] + b"\r\n", [CLOSE]),
    ("1.3-add-bad-flags", b"add q x x 2\r\nhi\r\n", [CLOSE]),
    # §1.3 other unknown commands
    ("1.3-incr", b"incr q 1\r\n", [CLOSE]),
    ("1.3-decr", b"decr q 1\r\n", [CLOSE]),
    ("1.3-touch", b"touch q 0\r\n", [CLOSE]),
    ("2-dump-config", b"dump_config\r\n", [CLOSE]),
    ("2-dump-config-upper", b"DUMP_CONFIG\r\n", [CLOSE]),
    ("1.3-bogus", b"bogus\r\n", [CLOSE]),
    # §2 delete, flush and the others
    ("2-delete", b"delete q\r\n", [Delete("q")]),
    ("2-delete-extra", b"DELETE q extra\r\n", [Delete("q")]),
    ("2-delete-empty-name", b"delete  q\r\n", [Delete("")]),
    ("2-delete-missing", b"delete\r\nget q\r\n", [KEEP, get("q")]),
    ("2-flush", b"flush q\r\n", [Flush("q")]),
    ("2-flush-missing", b"flush\r\n", [KEEP]),
    ("2-flush-all", b"flush_all\r\n", [FlushAll()]),
    ("2-flush-all-ignored", b"flush_all 30\r\n", [FlushAll()]),
    ("2-flush-expired", b"flush_expired q\r\n", [FlushExpired("q")]),
    ("2-flush-expired-missing", b"flush_expired\r\nget q\r\n", [SILENT]),
    ("2-flush-all-expired", b"flush_all_expired\r\n", [FlushAllExpired()]),
    ("2-version", b"version\r\n", [Version()]),
    ("2-version-upper", b"VERSION\r\n", [Version()]),
    ("2-stats", b"stats\r\n", [Stats()]),
    ("2-stats-ignored", b"stats detail\r\n", [Stats()]),
    ("2-dump-stats", b"dump_stats\r\n", [DumpStats(())]),
    ("2-dump-stats-names", b"dump_stats a b\r\n", [DumpStats(("a", "b"))]),
    ("2-reload", b"reload\r\n", [Reload()]),
    ("2-shutdown", b"shutdown\r\nget q\r\n", [Shutdown()]),
    ("2-quit", b"quit\r\nget q\r\n", [Quit()]),
    ("2-quit-extra", b"QUIT now\r\n", [Quit()]),
    # §5 monitor and confirm
    ("5-monitor", b"monitor q 5\r\n", [Monitor("q", 5, None)]),
    ("5-monitor-max", b"monitor q 5 3\r\n", [Monitor("q", 5, 3)]),
    ("5-monitor-zero", b"monitor q 0\r\n", [Monitor("q", 0, None)]),
    ("5-monitor-extra", b"monitor q 5 3 9\r\n", [Monitor("q", 5, 3)]),
    ("5-monitor-missing-secs", b"monitor q\r\n", [SILENT]),
    ("5-monitor-bare", b"monitor\r\n", [SILENT]),
    ("5-monitor-bad-secs", b"monitor q x\r\n", [SILENT]),
    ("5-monitor-bad-max", b"monitor q 5 x\r\n", [SILENT]),
    ("5-monitor-secs-too-big", b"monitor q 5000000000\r\n", [SILENT]),
    ("5-confirm", b"confirm q 2\r\n", [Confirm("q", 2)]),
    ("5-confirm-zero", b"confirm q 0\r\n", [Confirm("q", 0)]),
    ("5-confirm-missing-count", b"confirm q\r\nconfirm q 1\r\n", [KEEP, Confirm("q", 1)]),
    ("5-confirm-bare", b"confirm\r\n", [KEEP]),
    ("5-confirm-bad-count", b"confirm q x\r\n", [SILENT]),
    # §7 status
    ("7-status", b"status\r\n", [Status(None)]),
    ("7-status-up", b"status up\r\n", [Status(ServerStatus.UP)]),
    ("7-status-readonly", b"STATUS ReadOnly\r\n", [Status(ServerStatus.READONLY)]),
    ("7-status-quiescent", b"status quiescent\r\n", [Status(ServerStatus.QUIESCENT)]),
    ("7-status-writeavoid", b"status WRITEAVOID\r\n", [Status(ServerStatus.WRITEAVOID)]),
    ("7-status-extra", b"status up now\r\n", [Status(ServerStatus.UP)]),
    ("7-status-down", b"status down\r\n", [CLOSE]),
    ("7-status-bogus", b"status bogus\r\n", [CLOSE]),
    ("7-status-empty-word", b"status  up\r\n", [CLOSE]),
]

# A partial request left after each case; it must stay buffered and complete to `get tail`.
TRAILER = b"get tai"
TRAILER_REST = b"l\r\n"


def _case_closes(expected: list[Event]) -> bool:
    return bool(expected) and closes_connection(expected[-1])


@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=i) for i, d, e in CASES])
def test_fed_whole(data: bytes, expected: list[Event]) -> None:
    """Spec §1-§7 (section in each case id): the input fed in one piece gives these events."""
    conn = connection()
    assert conn.receive_data(data) == expected
    assert conn.closed is _case_closes(expected)


@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=i) for i, d, e in CASES])
def test_fed_split_at_every_byte(data: bytes, expected: list[Event]) -> None:
    """Spec §1.1: where TCP splits a request never changes the events."""
    for position in range(len(data) + 1):
        conn = connection()
        assert feed(conn, [data[:position], data[position:]]) == expected, position


@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=i) for i, d, e in CASES])
def test_fed_byte_by_byte(data: bytes, expected: list[Event]) -> None:
    """Spec §1.1: one byte at a time gives the same events as the whole input."""
    conn = connection()
    assert feed(conn, [data[i : i + 1] for i in range(len(data))]) == expected


@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=i) for i, d, e in CASES])
def test_trailing_partial_request(data: bytes, expected: list[Event]) -> None:
    """Spec §1.1 and §1.3: a following partial request stays buffered, unless the case closed."""
    conn = connection()
    assert conn.receive_data(data + TRAILER) == expected
    if _case_closes(expected):
        assert conn.closed
        assert conn.buffered == b""
        with pytest.raises(MemcacheProtocolError):
            conn.receive_data(TRAILER_REST)
        return
    assert conn.buffered == TRAILER
    assert conn.receive_data(TRAILER_REST) == [get("tail")]
    assert conn.buffered == b""


# --- framing details that the table cannot show ---------------------------------------------------


def test_partial_payload_waits_for_its_last_byte() -> None:
    """Spec §1.1: a storage line waits for n bytes plus two, and only then yields the item."""
    conn = connection()
    assert conn.receive_data(b"set q 0 0 5\r\nhel") == []
    assert conn.buffered == b"hel"
    assert conn.receive_data(b"lo\r") == []
    assert conn.receive_data(b"\n") == [Set("q", 0, 0, b"hello")]
    assert conn.buffered == b""


def test_unsupported_storage_word_answers_after_its_payload() -> None:
    """Spec §1.3: `add` is refused only once its payload is in, as Kestrel frames it first."""
    conn = connection()
    assert conn.receive_data(b"add q 0 0 5\r\nhel") == []
    assert not conn.closed
    assert conn.receive_data(b"lo\r\n") == [CLOSE]
    assert conn.closed


def test_oversize_payload_is_not_buffered() -> None:
    """Spec §2/§4 (maxItemSize) with Kayos's value bound: skipped bytes are never held."""
    conn = connection()
    assert conn.receive_data(b"set q 0 0 1000\r\n" + b"x" * 600) == []
    assert conn.buffered == b""
    assert conn.receive_data(b"x" * 400 + b"\r\nget q\r\n") == [
        SetTooLarge("q", 0, 0, 1000),
        get("q"),
    ]


def test_overlong_line_is_refused_before_its_end() -> None:
    """Kayos bound on spec §1.1 lines: the refusal comes as soon as the bound is passed."""
    conn = connection()
    assert conn.receive_data(b"get " + b"a" * 60) == []
    assert conn.receive_data(b"a") == [CLOSE]


def test_real_line_bound() -> None:
    """Kayos bound on spec §1.1 lines, at the default size: the bound is inclusive."""
    name_bytes = limits.line_bytes_max - len(b"get \r")
    assert MemcacheConnection().receive_data(b"get " + b"a" * name_bytes + b"\r\n") == [
        get("a" * name_bytes)
    ]
    too_long = b"get " + b"a" * (name_bytes + 1) + b"\r\n"
    assert MemcacheConnection().receive_data(too_long) == [CLOSE]


def test_real_value_bound() -> None:
    """Spec §4 with Kayos's value bound at the default size: equal is kept, one more is dropped."""
    at_bound = limits.value_bytes_max
    conn = MemcacheConnection()
    events = conn.receive_data(b"set q 0 0 %d\r\n" % at_bound + bytes(at_bound) + b"\r\n")
    assert events == [Set("q", 0, 0, bytes(at_bound))]
    chunk = bytes(1 << 20)
    chunks = [b"set q 0 0 %d\r\n" % (at_bound + 1)]
    chunks += [chunk] * (at_bound // len(chunk)) + [b"x\r\n"]
    assert feed(conn, chunks) == [SetTooLarge("q", 0, 0, at_bound + 1)]


def test_bounds_can_only_be_lowered() -> None:
    """Kayos bounds on spec §1.1 (kestrel_compat/limits.py): a connection may only lower them."""
    with pytest.raises(ValueError, match="line_bytes_max"):
        MemcacheConnection(line_bytes_max=limits.line_bytes_max + 1)
    with pytest.raises(ValueError, match="line_bytes_max"):
        MemcacheConnection(line_bytes_max=0)
    with pytest.raises(ValueError, match="value_bytes_max"):
        MemcacheConnection(value_bytes_max=limits.value_bytes_max + 1)


def test_connection_is_dead_after_a_close() -> None:
    """Spec §1.3: after a closing reply nothing more is read; feeding again is a ProtocolError."""
    conn = connection()
    assert conn.receive_data(b"quit\r\n") == [Quit()]
    assert conn.closed
    with pytest.raises(ProtocolError):
        conn.receive_data(b"get q\r\n")


def test_empty_data_is_a_no_op() -> None:
    """Spec §1.1: no bytes, no events, nothing buffered."""
    conn = connection()
    assert conn.receive_data(b"") == []
    assert conn.buffered == b""
    assert not conn.closed


def test_error_reason_is_not_part_of_equality() -> None:
    """Spec §1.3: only the reply bytes and the close decision define an error event."""
    assert ErrorReply(b"CLIENT_ERROR\r\n", True, "a") == ErrorReply(b"CLIENT_ERROR\r\n", True, "b")
    assert KEEP != CLOSE


@pytest.mark.parametrize(
    ("event", "closes"),
    [
        (Quit(), True),
        (Shutdown(), True),
        (KEEP, False),
        (CLOSE, True),
        (SILENT, True),
        (get("q"), False),
        (Set("q", 0, 0, b""), False),
        (SetTooLarge("q", 0, 0, 99), False),
    ],
)
def test_closes_connection(event: Event, closes: bool) -> None:
    """Spec §1.3 and §2 (quit, shutdown): which events end the connection."""
    assert closes_connection(event) is closes


# --- replies --------------------------------------------------------------------------------------


def test_status_reply_constants() -> None:
    """Spec §1.2, §1.3 and §2: the fixed replies, byte for byte."""
    assert STORED == b"STORED\r\n"
    assert NOT_STORED == b"NOT_STORED\r\n"
    assert END == b"END\r\n"
    assert DELETED == b"DELETED\r\n"
    assert FLUSHED_ALL == b"Flushed all queues.\r\n"
    assert RELOADED == b"Reloaded config.\r\n"
    assert ERROR == b"ERROR\r\n"
    assert CLIENT_ERROR == b"CLIENT_ERROR\r\n"
    assert SERVER_ERROR == b"SERVER_ERROR\r\n"


@pytest.mark.parametrize(
    ("error_class", "reply", "close_after"),
    [
        (CLIENT_ERROR_KEEP, b"CLIENT_ERROR\r\n", False),
        (CLIENT_ERROR_CLOSE, b"CLIENT_ERROR\r\n", True),
        (ERROR_KEEP, b"ERROR\r\n", False),
        (ERROR_CLOSE, b"ERROR\r\n", True),
        (SERVER_ERROR_CLOSE, b"SERVER_ERROR\r\n", True),
        (SILENT_CLOSE, b"", True),
    ],
)
def test_error_classes(error_class: ErrorClass, reply: bytes, close_after: bool) -> None:
    """Spec §1.3: each error class's exact bytes and what happens to the connection."""
    assert error_class in ERROR_CLASSES
    event = ErrorReply.of(error_class, "why")
    assert (event.reply, event.close_after) == (reply, close_after)


@pytest.mark.parametrize(
    ("queue", "data", "reply"),
    [
        ("q", b"hello", b"VALUE q 0 5\r\nhello\r\nEND\r\n"),
        ("q", b"", b"VALUE q 0 0\r\n\r\nEND\r\n"),
        ("q", b"a\r\nb\x00", b"VALUE q 0 5\r\na\r\nb\x00\r\nEND\r\n"),
        ("\xe9t\xe9", b"x", b"VALUE \xe9t\xe9 0 1\r\nx\r\nEND\r\n"),
        ("orders+audit", b"x", b"VALUE orders+audit 0 1\r\nx\r\nEND\r\n"),
    ],
)
def test_encode_value(queue: str, data: bytes, reply: bytes) -> None:
    """Spec §1.2 and §4: an item is VALUE with flags 0, the bare queue name and opaque data."""
    assert encode_value(queue, data) == reply


def test_monitor_stream_of_one_item() -> None:
    """Spec §5: a MONITOR item is a full item reply, and the stream ends with its own END."""
    assert encode_value("q", b"x") + END == b"VALUE q 0 1\r\nx\r\nEND\r\nEND\r\n"


def test_get_reply_round_trips_set_data() -> None:
    """Spec §1.2: the item a SET stored comes back byte for byte under its bare queue name."""
    data = bytes(range(256))
    conn = connection()
    conn_big = MemcacheConnection()
    (stored,) = conn_big.receive_data(b"set q 0 0 256\r\n" + data + b"\r\n")
    assert isinstance(stored, Set)
    (fetch,) = conn.receive_data(b"get q/t=1/open\r\n")
    assert isinstance(fetch, Get)
    expected = b"VALUE q 0 256\r\n" + data + b"\r\nEND\r\n"
    assert encode_value(fetch.queue, stored.data) == expected


def test_encode_count_version_status() -> None:
    """Spec §2 and §7: flush_expired's count, VERSION, and the bare status words."""
    assert encode_count(0) == b"0\r\n"
    assert encode_count(12) == b"12\r\n"
    assert encode_version("2.4.1") == b"VERSION 2.4.1\r\n"
    assert encode_status(ServerStatus.UP) == b"UP\r\n"
    assert encode_status(ServerStatus.READONLY) == b"READONLY\r\n"
    assert encode_status(ServerStatus.QUIESCENT) == b"QUIESCENT\r\n"
    assert encode_status(ServerStatus.WRITEAVOID) == b"WRITEAVOID\r\n"


def test_encode_stats() -> None:
    """Spec §6: STAT lines in the order given, then END; an empty value keeps its space."""
    stats: list[tuple[str, str | int]] = [
        ("uptime", 5),
        ("version", "2.4.1"),
        ("reserved_memory_ratio", "0.125"),
        ("queue_m_items", 0),
        ("queue_m_children", ""),
    ]
    assert encode_stats(stats) == (
        b"STAT uptime 5\r\n"
        b"STAT version 2.4.1\r\n"
        b"STAT reserved_memory_ratio 0.125\r\n"
        b"STAT queue_m_items 0\r\n"
        b"STAT queue_m_children \r\n"
        b"END\r\n"
    )
    assert encode_stats([]) == b"END\r\n"


def test_encode_dump_stats() -> None:
    """Spec §6: dump_stats blocks, the unknown-name block, and the reply for no queues."""
    assert encode_dump_stats([]) == b"\r\nEND\r\n"
    one = [("q", [("items", 0), ("bytes", 0), ("journal_rotations", 0)])]
    assert encode_dump_stats(one) == (
        b"queue 'q' {\r\n  items=0\r\n  bytes=0\r\n  journal_rotations=0\r\n}\r\nEND\r\n"
    )
    assert encode_dump_stats([("x", [])]) == b"queue 'x' {\r\n  \r\n}\r\nEND\r\n"
    two = [("a", [("items", 1)]), ("b", [("items", 2)])]
    assert encode_dump_stats(two) == (
        b"queue 'a' {\r\n  items=1\r\n}\r\nqueue 'b' {\r\n  items=2\r\n}\r\nEND\r\n"
    )


@pytest.mark.parametrize(
    ("name", "legal"),
    [
        ("q", True),
        ("orders+audit", True),
        ("a-b_C9", True),
        ("a.b", False),
        ("a~b", False),
        ("a/b", False),
        ("", False),
    ],
)
def test_queue_name_is_legal(name: str, legal: bool) -> None:
    """Spec §8.1: `.`, `/` and `~` cannot be created; Kayos also refuses the empty name."""
    assert queue_name_is_legal(name) is legal


# --- the command table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("0", 0),
        ("+5", 5),
        ("-5", -5),
        ("007", 7),
        ("2147483647", 2147483647),
        ("-2147483648", -2147483648),
        ("2147483648", None),
        ("-2147483649", None),
        ("", None),
        ("+", None),
        ("-", None),
        (" 1", None),
        ("1 ", None),
        ("1_0", None),
        ("\u0663", None),
        ("0x10", None),
        ("1.0", None),
        ("1e3", None),
        ("--1", None),
    ],
)
def test_parse_java_int(token: str, value: int | None) -> None:
    """Spec §1.3: numbers are Java ints (Integer.parseInt), nothing more lenient."""
    assert parse_java_int(token) == value


def _events_by_command() -> dict[str, type[Command]]:
    classes: list[type[Command]] = [
        Get,
        Set,
        SetTooLarge,
        Delete,
        Flush,
        FlushAll,
        FlushExpired,
        FlushAllExpired,
        Version,
        Stats,
        DumpStats,
        Monitor,
        Confirm,
        Status,
        Reload,
        Shutdown,
        Quit,
    ]
    return {cls.__name__: cls for cls in classes}


def test_every_event_names_a_supported_command() -> None:
    """Spec §2: each command event belongs to a supported row of the command table."""
    for cls in _events_by_command().values():
        spec = COMMANDS_BY_NAME[cls.command]
        assert spec.supported, cls


def test_closing_commands_are_quit_and_shutdown() -> None:
    """Spec §2: only quit and shutdown close the connection without an error."""
    assert {spec.name for spec in COMMANDS if spec.closes_connection} == {"quit", "shutdown"}


def _arguments_column(spec: CommandSpec) -> str:
    if spec.arguments_max is None:
        return f"{spec.arguments_min}+"
    if spec.arguments_max == spec.arguments_min:
        return str(spec.arguments_min)
    return f"{spec.arguments_min}..{spec.arguments_max}"


def _doc_rows() -> dict[str, list[str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## 4 Command table") : text.index("## 5 ")]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = re.match(r"\| `([a-z_]+)` \|", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in line.strip("|").split("|")]
    return rows


def test_docs_table_matches_commands() -> None:
    """Spec §2 via docs/kestrel-compat.md: the documented command table is the declared one."""
    rows = _doc_rows()
    assert list(rows) == [spec.name for spec in COMMANDS]
    for spec in COMMANDS:
        row = rows[spec.name]
        missing = spec.missing_argument.name if spec.missing_argument else "—"
        refusal = spec.status_refusal.name if spec.status_refusal else "never"
        assert row[1:7] == [
            _arguments_column(spec),
            missing,
            "yes" if spec.payload else "no",
            spec.access.value,
            refusal,
            "yes" if spec.creates_queue else "no",
        ], spec.name
        if not spec.supported:
            assert "CLIENT_ERROR" in row[7], spec.name


# --- properties -----------------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [
        b"get ",
        b"gets ",
        b"set ",
        b"add ",
        b"monitor ",
        b"confirm ",
        b"status ",
        b"delete ",
        b"flush_expired ",
        b"dump_stats ",
        b"quit",
        b"q",
        b"/",
        b"open",
        b"close",
        b"abort",
        b"peek",
        b"t=",
        b" ",
        b"  ",
        b"0",
        b"1",
        b"5",
        b"17",
        b"-1",
        b"2147483648",
        b"x",
        b"\r",
        b"\n",
        b"\r\n",
    ]
)
_INPUTS = st.lists(_PIECES | st.binary(max_size=6), max_size=40).map(b"".join)


@settings(deadline=None)
@given(data=_INPUTS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_any_input_gives_events_and_never_raises(data: bytes, cuts: list[int]) -> None:
    """Spec §1.3 (the fuzz contract): any bytes, in any chunks, give events; nothing raises.

    The events do not depend on where the input is cut.
    """
    whole = connection()
    expected = whole.receive_data(data)
    assert all(
        isinstance(event, (*_events_by_command().values(), ErrorReply)) for event in expected
    )
    assert all(not closes_connection(event) for event in expected[:-1])
    positions = sorted({min(cut, len(data)) for cut in cuts})
    chunks = [data[a:b] for a, b in zip([0, *positions], [*positions, len(data)], strict=True)]
    conn = connection()
    assert feed(conn, chunks) == expected
    assert conn.closed is whole.closed
    if not conn.closed:
        assert conn.buffered == whole.buffered


@settings(deadline=None)
@given(data=st.binary(max_size=200), more=st.binary(max_size=20))
def test_feeding_after_close_raises_only_protocol_error(data: bytes, more: bytes) -> None:
    """Spec §1.3: once a connection closed, the only failure left is MemcacheProtocolError."""
    conn = connection()
    conn.receive_data(data)
    if conn.closed:
        with pytest.raises(MemcacheProtocolError):
            conn.receive_data(more)
    else:
        conn.receive_data(more)


_NAMES = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="/"),
    min_size=1,
    max_size=20,
)
_JAVA_INTS = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@settings(deadline=None)
@given(
    queue=_NAMES,
    flags=_JAVA_INTS,
    expiry=_JAVA_INTS,
    data=st.binary(max_size=VALUE_BYTES_MAX),
)
def test_any_set_round_trips(queue: str, flags: int, expiry: int, data: bytes) -> None:
    """Spec §1.1 and §4: any name, any Java-int flags and exptime, any bytes: one Set, exactly."""
    line = b"set %s %d %d %d\r\n" % (queue.encode("latin-1"), flags, expiry, len(data))
    conn = MemcacheConnection(value_bytes_max=VALUE_BYTES_MAX)
    assert conn.receive_data(line + data + b"\r\n") == [Set(queue, flags, expiry, data)]
