"""The Kestrel text-protocol codec: framing, every request row of spec §10, reply bytes.

Fixtures are (input bytes, expected events) pairs, fed whole, split in two at every byte position,
byte by byte, and followed by a partial request that must stay buffered (or, after a closing
event, be dropped). The table runs on a connection with small bounds (32-byte request lines,
8-byte item lines, 12 bytes of items per put) so the bound cases stay short.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kayos.errors import ProtocolError
from kestrel_compat import limits
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.wire.commands import Close, Confirm, Delete, Flush, Quit, Shutdown, Version
from kestrel_compat.wire.text_codec import (
    NO_ITEM,
    TEXT_COMMANDS,
    ZERO,
    ErrorReply,
    Get,
    Monitor,
    Peek,
    Put,
    StatusChange,
    StatusQuery,
    TextConnection,
    TextEvent,
    TextProtocolError,
    closes_connection,
    encode_count,
    encode_error,
    encode_item,
    encode_string,
    unavailable_message,
)
from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

LINE_BYTES_MAX = 32
ITEM_LINE_BYTES_MAX = 8
PUT_BYTES_MAX = 12

DOCS = REPO_ROOT / "docs" / "kestrel-compat.md"


def connection() -> TextConnection:
    return TextConnection(
        line_bytes_max=LINE_BYTES_MAX,
        item_line_bytes_max=ITEM_LINE_BYTES_MAX,
        put_bytes_max=PUT_BYTES_MAX,
    )


def feed(conn: TextConnection, chunks: Iterable[bytes]) -> list[TextEvent]:
    """Feed chunks as a server loop would: stop once a closing event came out."""
    events: list[TextEvent] = []
    for chunk in chunks:
        if conn.closed:
            break
        events.extend(conn.receive_data(chunk))
    return events


QUEUE_REQUIRED = ErrorReply("Queue name required.")

# (id naming the spec section, input bytes, expected events)
CASES: list[tuple[str, bytes, list[TextEvent]]] = [
    # §10 framing: LF ends a line, one CR before it is dropped, single-space split, case.
    ("10-lf", b"get q\n", [Get("q", None)]),
    ("10-crlf", b"get q\r\n", [Get("q", None)]),
    ("10-one-cr-stripped", b"get q\r\r\n", [Get("q\r", None)]),
    ("10-command-case", b"GET Q\n", [Get("Q", None)]),
    ("10-latin-1-name", b"get \xe9\n", [Get("\xe9", None)]),
    ("10-double-space", b"get  q\n", [ErrorReply("Error parsing timeout.")]),
    ("10-double-space-name", b"get  7\n", [Get("", 7)]),
    ("10-trailing-space", b"get q \n", [Get("q", None)]),
    ("10-extra-arguments", b"get q 5 x y\n", [Get("q", 5)]),
    ("10-empty-line", b"\n", [ErrorReply("Unknown command: ")]),
    ("10-spaces-only", b"   \n", [Close()]),
    ("10-unknown", b"set q 0 0 1\n", [ErrorReply("Unknown command: set")]),
    ("10-unknown-lowered", b"FOO bar\n", [ErrorReply("Unknown command: foo")]),
    ("10-memcache-words", b"stats\n", [ErrorReply("Unknown command: stats")]),
    ("10-line-bound", b"get " + b"q" * 28 + b"\n", [Get("q" * 28, None)]),
    ("10-line-over-bound", b"get " + b"q" * 29 + b"\n", [Close()]),
    # put <q> [exp_ms]: + items + empty line
    ("10-put", b"put q:\nab\ncd\n\n", [Put("q", None, (b"ab", b"cd"))]),
    ("10-put-crlf", b"put q:\r\nab\r\n\r\n", [Put("q", None, (b"ab",))]),
    ("10-put-expiry", b"put q 1500:\nab\n\n", [Put("q", 1500, (b"ab",))]),
    ("10-put-negative-expiry", b"put q -1:\nab\n\n", [Put("q", -1, (b"ab",))]),
    ("10-put-no-items", b"put q:\n\n", [Put("q", None, ())]),
    ("10-put-no-colon", b"put q\n", [Put("q", None, ())]),
    (
        "10-put-empty-item-ends",
        b"put q:\na\n\nb\n",
        [
            Put("q", None, (b"a",)),
            ErrorReply("Unknown command: b"),
        ],
    ),
    ("10-put-utf8", b"put q:\n\xe9\n\n", [Put("q", None, (b"\xc3\xa9",))]),
    ("10-put-inner-cr", b"put q:\na\rb\n\n", [Put("q", None, (b"a\rb",))]),
    ("10-put-colon-in-item", b"put q:\n:x:\n\n", [Put("q", None, (b":x:",))]),
    ("10-put-no-name", b"put:\nab\n\n", [QUEUE_REQUIRED]),
    ("10-put-bad-expiry", b"put q x:\nab\n\n", [ErrorReply("Error parsing expiration time.")]),
    (
        "10-put-expiry-overflow",
        b"put q 2147483648:\n\n",
        [ErrorReply("Error parsing expiration time.")],
    ),
    ("10-any-command-takes-items", b"get q:\nzz\n\n", [Get("q", None)]),
    ("10-colon-only", b":\nx\n\n", [ErrorReply("Unknown command: ")]),
    ("10-space-colon", b" :\nx\n\n", [Close()]),
    # Kayos bounds on items: a line over the bound, or past the put's bytes, is refused (None).
    ("10-item-line-bound", b"put q:\n12345678\n\n", [Put("q", None, (b"12345678",))]),
    ("10-item-line-over", b"put q:\n123456789\nab\n\n", [Put("q", None, (None, b"ab"))]),
    ("10-item-utf8-over", b"put q:\n1234567\xe9\n\n", [Put("q", None, (None,))]),
    (
        "10-put-bytes-over",
        b"put q:\n12345678\n12345\nab\n\n",
        [Put("q", None, (b"12345678", None, b"ab"))],
    ),
    # get <q> [timeout_ms]
    ("10-get", b"get q\n", [Get("q", None)]),
    ("10-get-timeout", b"get q 250\n", [Get("q", 250)]),
    ("10-get-zero", b"get q 0\n", [Get("q", 0)]),
    ("10-get-no-name", b"get\n", [QUEUE_REQUIRED]),
    ("10-get-bad-timeout", b"get q 1.5\n", [ErrorReply("Error parsing timeout.")]),
    # peek <q> [timeout_ms]
    ("10-peek", b"peek q\n", [Peek("q", None)]),
    ("10-peek-timeout", b"peek q 10\n", [Peek("q", 10)]),
    ("10-peek-no-name", b"peek\n", [QUEUE_REQUIRED]),
    ("10-peek-bad-timeout", b"peek q x\n", [ErrorReply("Error parsing timeout.")]),
    # monitor <q> <timeout_ms>
    ("10-monitor", b"monitor q 100\n", [Monitor("q", 100)]),
    ("10-monitor-missing", b"monitor q\n", [ErrorReply("Queue name & timeout required.")]),
    ("10-monitor-bad-timeout", b"monitor q x\n", [Close()]),
    # confirm <q> <n>
    ("10-confirm", b"confirm q 2\n", [Confirm("q", 2)]),
    ("10-confirm-missing", b"confirm q\n", [ErrorReply("Queue name & count required.")]),
    ("10-confirm-bad-count", b"confirm q two\n", [Close()]),
    # flush, delete, shutdown
    ("10-flush", b"flush q\n", [Flush("q")]),
    ("10-flush-no-name", b"flush\n", [QUEUE_REQUIRED]),
    ("10-delete", b"delete q\n", [Delete("q")]),
    ("10-delete-no-name", b"delete\n", [QUEUE_REQUIRED]),
    ("10-shutdown", b"shutdown\n", [Shutdown()]),
    # status, version, quit
    ("10-status", b"status\n", [StatusQuery()]),
    ("10-status-set", b"status readonly\n", [StatusChange(ServerStatus.READONLY, False)]),
    ("10-status-case", b"status WriteAvoid\n", [StatusChange(ServerStatus.WRITEAVOID, False)]),
    ("10-status-down", b"status down\n", [StatusChange(None, True)]),
    ("10-status-unknown", b"status sideways\n", [StatusChange(None, False)]),
    ("10-version", b"version\n", [Version()]),
    ("10-quit", b"quit\n", [Quit()]),
    # several requests in one read
    ("10-pipelined", b"get a\npeek b 5\nversion\n", [Get("a", None), Peek("b", 5), Version()]),
    ("10-stop-after-close", b"quit\nget q\n", [Quit()]),
]

TRAILER = b"get ta"
TRAILER_REST = b"il\n"


def _case_closes(expected: list[TextEvent]) -> bool:
    return bool(expected) and closes_connection(expected[-1])


PARAMS = [pytest.param(d, e, id=i) for i, d, e in CASES]


@pytest.mark.parametrize(("data", "expected"), PARAMS)
def test_fed_whole(data: bytes, expected: list[TextEvent]) -> None:
    """Spec §10 (row in each case id): the input fed in one piece gives these events."""
    conn = connection()
    assert conn.receive_data(data) == expected
    assert conn.closed is _case_closes(expected)


@pytest.mark.parametrize(("data", "expected"), PARAMS)
def test_fed_split_at_every_byte(data: bytes, expected: list[TextEvent]) -> None:
    """Spec §10: where TCP splits a request never changes the events."""
    whole = connection().receive_data(data)
    for position in range(len(data) + 1):
        assert feed(connection(), [data[:position], data[position:]]) == whole, position


@pytest.mark.parametrize(("data", "expected"), PARAMS)
def test_fed_byte_by_byte(data: bytes, expected: list[TextEvent]) -> None:
    """Spec §10: one byte at a time gives the same events as the whole input."""
    whole = connection().receive_data(data)
    assert feed(connection(), [data[i : i + 1] for i in range(len(data))]) == whole


@pytest.mark.parametrize(("data", "expected"), PARAMS)
def test_trailing_partial_request(data: bytes, expected: list[TextEvent]) -> None:
    """A following partial request stays buffered, unless the case closed the connection."""
    conn = connection()
    events = conn.receive_data(data + TRAILER)
    if _case_closes(expected):
        assert events == expected
        assert conn.closed
        assert conn.buffered == b""
        with pytest.raises(TextProtocolError):
            conn.receive_data(TRAILER_REST)
        return
    assert events == expected
    assert conn.buffered == TRAILER
    assert conn.receive_data(TRAILER_REST) == [Get("tail", None)]


# --- framing details the table cannot show -------------------------------------------------------


def test_put_waits_for_the_empty_line() -> None:
    """Spec §10: the items run up to an empty line; nothing is emitted before it."""
    conn = connection()
    assert conn.receive_data(b"put q:\nab\n") == []
    assert conn.receive_data(b"cd\n") == []
    assert conn.receive_data(b"\n") == [Put("q", None, (b"ab", b"cd"))]


def test_put_holds_at_most_1024_items_and_loses_the_next_line() -> None:
    """Spec §10: max 1024 items; the 1025th line ends the put and is consumed and lost."""
    conn = TextConnection()
    items = b"".join(b"%d\n" % n for n in range(1026))
    events = conn.receive_data(b"put q:\n" + items + b"\nversion\n")
    assert len(events) == 4
    put = events[0]
    assert isinstance(put, Put)
    assert put.items == tuple(b"%d" % n for n in range(1024))
    # Line 1024 was lost; line 1025 and the empty line are requests of their own.
    assert events[1:] == [
        ErrorReply("Unknown command: 1025"),
        ErrorReply("Unknown command: "),
        Version(),
    ]


def test_a_too_long_line_after_the_last_item_ends_the_put() -> None:
    """Spec §10 with a Kayos bound: the line after item 1024 is lost even when too long."""
    conn = TextConnection(item_line_bytes_max=4)
    items = b"x\n" * 1024
    events = conn.receive_data(b"put q:\n" + items + b"123456789\nversion\n")
    assert len(events) == 2
    assert isinstance(events[0], Put)
    assert len(events[0].items) == 1024
    assert events[1] == Version()


def test_a_long_item_line_is_not_buffered() -> None:
    """Kayos bound: an item line over the bound is dropped as it arrives."""
    conn = connection()
    assert conn.receive_data(b"put q:\n" + b"x" * 100) == []
    assert len(conn.buffered) <= ITEM_LINE_BYTES_MAX + 1
    assert conn.receive_data(b"x" * 100) == []
    assert conn.buffered == b""
    assert conn.receive_data(b"\nok\n\n") == [Put("q", None, (None, b"ok"))]


def test_real_bounds() -> None:
    """The defaults are the limits module's, and a connection cannot raise them."""
    conn = TextConnection()
    line = b"get " + b"q" * (limits.line_bytes_max - 4) + b"\n"
    assert conn.receive_data(line) == [Get("q" * (limits.line_bytes_max - 4), None)]
    with pytest.raises(ValueError, match="line_bytes_max"):
        TextConnection(line_bytes_max=limits.line_bytes_max + 1)
    with pytest.raises(ValueError, match="item_line_bytes_max"):
        TextConnection(item_line_bytes_max=limits.text_item_line_bytes_max + 1)
    with pytest.raises(ValueError, match="put_bytes_max"):
        TextConnection(put_bytes_max=limits.text_put_bytes_max + 1)


def test_dead_after_close() -> None:
    conn = connection()
    assert conn.receive_data(b"quit\n") == [Quit()]
    with pytest.raises(ProtocolError):
        conn.receive_data(b"get q\n")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=200))
def test_any_bytes_give_events_and_splits_agree(data: bytes, position: int) -> None:
    """Peer input never raises, and a split anywhere gives the same events."""
    whole = feed(connection(), [data])
    assert feed(connection(), [data[:position], data[position:]]) == whole


# --- the command table ---------------------------------------------------------------------------


def test_table_matches_the_docs() -> None:
    """docs/kestrel-compat.md lists every text command with its missing-argument reply."""
    text = DOCS.read_text(encoding="utf-8")
    for spec in TEXT_COMMANDS:
        assert f"| `{spec.name}" in text, spec.name
        if spec.missing is not None:
            assert f"-{spec.missing}" in text, spec.name
        if spec.status_operation is not None:
            assert spec.status_operation in text, spec.name


# --- replies (spec §10) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (encode_item(b"hello"), b":hello\n"),
        (encode_item(b""), b":\n"),
        (encode_item(b"\xc3\xa9\x00"), b":\xc3\xa9\x00\n"),
        (encode_item(None), b"*\n"),
        (NO_ITEM, b"*\n"),
        (ZERO, b"+0\n"),
        (encode_count(3), b"+3\n"),
        (encode_error("Queue name required."), b"-Queue name required.\n"),
        (encode_error("Unknown command: \xe9x"), b"-Unknown command: ?x\n"),
        (encode_string("UP"), b":UP\n"),
        (encode_string("2.4.1"), b":2.4.1\n"),
        (
            encode_error(unavailable_message("setItem")),
            b"-Server not available for operation setItem\n",
        ),
    ],
)
def test_reply_bytes(reply: bytes, expected: bytes) -> None:
    """Spec §10: `+<n>`, `-<msg>`, `:<item>`, `*`; messages are ASCII with `?` for the rest."""
    assert reply == expected
