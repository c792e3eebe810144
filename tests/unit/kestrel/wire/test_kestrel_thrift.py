"""Kestrel's thrift API (spec §11): the framed TBinaryProtocol codec with golden frames, and every
method of ``service Kestrel`` through the real codec and ThriftSession on the shared engine.

Requests are built with Apache Thrift's own TBinaryProtocol (the ``thrift`` package) over a memory
buffer, so the codec is checked against an independent encoder; a few frames are also pinned as
golden bytes both ways. Time is a ManualClock for items; auto-abort timers and blocked fetches run
on the event loop with bounds of a few hundred milliseconds.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport.TTransport import TMemoryBuffer

from kestrel_compat import limits
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.sessions.thrift_session import ThriftReads, ThriftSession
from kestrel_compat.wire import thrift_codec as th
from kestrel_compat.wire.commands import Close
from tests.support.kestrel import Harness, make_config, read_value, set_request, stats_dict, value

pytestmark = pytest.mark.unit

# --- building calls and reading replies with the thrift package ---------------------------------

Field = tuple[int, int, Any]  # (id, TType, value); lists as (element TType, [values])


def _write_value(proto: TBinaryProtocol, ttype: int, value: Any) -> None:
    if ttype == TType.STRING:
        proto.writeBinary(value if isinstance(value, bytes) else value.encode())
    elif ttype == TType.I32:
        proto.writeI32(value)
    elif ttype == TType.I64:
        proto.writeI64(value)
    elif ttype in (TType.LIST, TType.SET):
        element, values = value
        (proto.writeListBegin if ttype == TType.LIST else proto.writeSetBegin)(element, len(values))
        for item in values:
            _write_value(proto, element, item)
    else:
        raise AssertionError(ttype)


def call_frame(method: str, fields: list[Field], *, seqid: int = 1, strict: bool = True) -> bytes:
    """One framed CALL, encoded by Apache Thrift's TBinaryProtocol."""
    buffer = TMemoryBuffer()
    proto = TBinaryProtocol(buffer, strictWrite=strict)
    proto.writeMessageBegin(method, TMessageType.CALL, seqid)
    proto.writeStructBegin(f"{method}_args")
    for field_id, ttype, field_value in fields:
        proto.writeFieldBegin("f", ttype, field_id)
        _write_value(proto, ttype, field_value)
        proto.writeFieldEnd()
    proto.writeFieldStop()
    proto.writeStructEnd()
    proto.writeMessageEnd()
    message = buffer.getvalue()
    return struct.pack(">i", len(message)) + message


def read_reply(frame: bytes) -> tuple[str, int, Any]:
    """(method, seqid, success value or the TApplicationException) from one reply frame."""
    (length,) = struct.unpack(">i", frame[:4])
    assert length == len(frame) - 4
    proto = TBinaryProtocol(TMemoryBuffer(frame[4:]))
    name, message_type, seqid = proto.readMessageBegin()
    if message_type == TMessageType.EXCEPTION:
        error = TApplicationException()
        error.read(proto)
        return name, seqid, error
    assert message_type == TMessageType.REPLY
    result = read_value(proto, TType.STRUCT)
    return name, seqid, result.get(0)


def put(queue: str, items: list[bytes], expiration_msec: int | None = None) -> bytes:
    fields: list[Field] = [(1, TType.STRING, queue), (2, TType.LIST, (TType.STRING, items))]
    if expiration_msec is not None:
        fields.append((3, TType.I32, expiration_msec))
    return call_frame("put", fields)


def get(queue: str, max_items: int, timeout_msec: int = 0, auto_abort_msec: int = 0) -> bytes:
    return call_frame(
        "get",
        [
            (1, TType.STRING, queue),
            (2, TType.I32, max_items),
            (3, TType.I32, timeout_msec),
            (4, TType.I32, auto_abort_msec),
        ],
    )


def ids_call(method: str, queue: str, ids: list[int]) -> bytes:
    return call_frame(method, [(1, TType.STRING, queue), (2, TType.SET, (TType.I64, ids))])


def queue_call(method: str, queue: str) -> bytes:
    return call_frame(method, [(1, TType.STRING, queue)])


# --- golden frames -------------------------------------------------------------------------------

# put("q", [b"hi"]) as any Thrift client frames it: length, strict header CALL, name, seqid 1,
# field 1 string "q", field 2 list<string> [b"hi"], stop.
PUT_FRAME = bytes.fromhex(
    "00000026" "80010001" "00000003" "707574" "00000001"
    "0b0001" "00000001" "71"
    "0f0002" "0b" "00000001" "00000002" "6869"
    "00"
)  # fmt: skip
# The reply: strict header REPLY, "put", seqid 1, field 0 i32 = 1, stop.
PUT_REPLY = bytes.fromhex(
    "00000017" "80010002" "00000003" "707574" "00000001" "080000" "00000001" "00"
)  # fmt: skip
# get_version's reply "2.4.1".
VERSION_REPLY = bytes.fromhex(
    "00000024" "80010002" "0000000b" "6765745f76657273696f6e" "00000007"
    "0b0000" "00000005" "322e342e31" "00"
)  # fmt: skip
# get("q", 1, auto_abort 1000) answered with one open read: list<Item> [{data b"x", id 1}].
GET_REPLY = bytes.fromhex(
    "0000002c" "80010002" "00000003" "676574" "00000001"
    "0f0000" "0c" "00000001"
    "0b0001" "00000001" "78" "0a0002" "0000000000000001" "00"
    "00"
)  # fmt: skip
# An unknown method "nope": EXCEPTION, TApplicationException {1: message, 2: type 1}.
UNKNOWN_REPLY = bytes.fromhex(
    "0000003a" "80010003" "00000004" "6e6f7065" "00000001"
    "0b0001" "0000001b" + b"Invalid method name: 'nope'".hex() + "080002" "00000001" "00"
)  # fmt: skip


def test_golden_put_frame_is_what_thrift_sends() -> None:
    """§11: the framed TBinaryProtocol bytes of put, from Apache Thrift and pinned."""
    assert put("q", [b"hi"]) == PUT_FRAME
    assert th.ThriftConnection().receive_data(PUT_FRAME) == [
        th.Put(seqid=1, queue_name="q", items=(b"hi",), expiration_msec=0)
    ]


def test_golden_replies() -> None:
    """§11: reply frames byte for byte, and as Apache Thrift reads them."""
    put_call = th.Put(seqid=1, queue_name="q", items=(b"hi",), expiration_msec=0)
    assert th.encode_reply(put_call, 1) == PUT_REPLY
    assert read_reply(PUT_REPLY) == ("put", 1, 1)
    assert th.encode_reply(th.GetVersion(seqid=7), "2.4.1") == VERSION_REPLY
    assert read_reply(VERSION_REPLY) == ("get_version", 7, b"2.4.1")
    get_call = th.Get(seqid=1, queue_name="q", max_items=1, timeout_msec=0, auto_abort_msec=1000)
    assert th.encode_reply(get_call, [th.Item(b"x", 1)]) == GET_REPLY
    assert read_reply(GET_REPLY) == ("get", 1, [{1: b"x", 2: 1}])
    unknown = th.encode_exception(
        "nope", 1, th.ApplicationError.UNKNOWN_METHOD, "Invalid method name: 'nope'"
    )
    assert unknown == UNKNOWN_REPLY
    _, _, error = read_reply(UNKNOWN_REPLY)
    assert isinstance(error, TApplicationException)
    assert (error.type, error.message) == (
        TApplicationException.UNKNOWN_METHOD,
        "Invalid method name: 'nope'",
    )


def test_void_and_struct_replies_read_back() -> None:
    """§11: void results are empty structs; QueueInfo leaves head_item out when there is none."""
    assert read_reply(th.encode_reply(th.FlushAllQueues(seqid=3), None)) == (
        "flush_all_queues",
        3,
        None,
    )
    info = th.QueueInfo(None, 2, 10, 64, 5, 1, 0)
    _, _, fields = read_reply(th.encode_reply(th.Peek(seqid=1, queue_name="q"), info))
    assert fields == {2: 2, 3: 10, 4: 64, 5: 5, 6: 1, 7: 0}
    info = th.QueueInfo(b"head", 1, 4, 0, 0, 0, 0)
    _, _, fields = read_reply(th.encode_reply(th.Peek(seqid=1, queue_name="q"), info))
    assert fields[1] == b"head"
    status = th.encode_reply(th.CurrentStatus(seqid=1), th.ThriftStatus.UP)
    assert read_reply(status) == ("current_status", 1, 3)


# --- decoding every method -----------------------------------------------------------------------

DECODE_CASES: list[tuple[str, bytes, th.ThriftEvent]] = [
    ("put", put("q", [b"a", b""], 500), th.Put(1, "q", (b"a", b""), 500)),
    ("put-default-expiry", put("q", []), th.Put(1, "q", (), 0)),
    ("get", get("q", 5, 100, 2000), th.Get(1, "q", 5, 100, 2000)),
    (
        "get-defaults",
        call_frame("get", [(1, TType.STRING, "q"), (2, TType.I32, 3)]),
        th.Get(1, "q", 3, 0, 0),
    ),
    ("confirm", ids_call("confirm", "q", [1, 2, 2]), th.Confirm(1, "q", (1, 2))),
    ("abort", ids_call("abort", "q", [9]), th.Abort(1, "q", (9,))),
    ("peek", queue_call("peek", "q"), th.Peek(1, "q")),
    ("flush_queue", queue_call("flush_queue", "q"), th.FlushQueue(1, "q")),
    ("flush_all_queues", call_frame("flush_all_queues", []), th.FlushAllQueues(1)),
    ("delete_queue", queue_call("delete_queue", "q"), th.DeleteQueue(1, "q")),
    ("current_status", call_frame("current_status", []), th.CurrentStatus(1)),
    ("set_status", call_frame("set_status", [(1, TType.I32, 2)]), th.SetStatus(1, 2)),
    ("get_version", call_frame("get_version", []), th.GetVersion(1)),
    ("old-style-header", call_frame("get_version", [], strict=False), th.GetVersion(1)),
    ("seqid", call_frame("get_version", [], seqid=-5), th.GetVersion(-5)),
    ("utf8-name", queue_call("peek", "\xe9"), th.Peek(1, "\xe9")),
    (
        "unknown-field-skipped",
        call_frame("peek", [(9, TType.I64, 1), (1, TType.STRING, "q")]),
        th.Peek(1, "q"),
    ),
    (
        "wrong-type-skipped",
        call_frame("peek", [(1, TType.I32, 7), (1, TType.STRING, "q")]),
        th.Peek(1, "q"),
    ),
    (
        "unknown-method",
        call_frame("nope", []),
        th.BadCall("nope", 1, th.ApplicationError.UNKNOWN_METHOD, "Invalid method name: 'nope'"),
    ),
    (
        "missing-queue-name",
        call_frame("peek", []),
        th.BadCall(
            "peek", 1, th.ApplicationError.PROTOCOL_ERROR, "Required field 'queue_name' is unset!"
        ),
    ),
]


@pytest.mark.parametrize(
    ("frame", "expected"), [pytest.param(f, e, id=i) for i, f, e in DECODE_CASES]
)
def test_decode_whole_and_split(frame: bytes, expected: th.ThriftEvent) -> None:
    """§11: every method decodes; any split of the bytes gives the same event."""
    assert th.ThriftConnection().receive_data(frame) == [expected]
    for position in range(len(frame) + 1):
        conn = th.ThriftConnection()
        events = conn.receive_data(frame[:position]) + conn.receive_data(frame[position:])
        assert events == [expected], position
    conn = th.ThriftConnection()
    assert conn.receive_data(frame + frame[:3]) == [expected]
    assert conn.buffered == frame[:3]


def test_frame_bounds_close() -> None:
    """Kayos bound: a frame longer than thrift_frame_bytes_max (or negative) closes."""
    conn = th.ThriftConnection(frame_bytes_max=16)
    assert conn.receive_data(struct.pack(">i", 17)) == [Close()]
    assert conn.closed
    with pytest.raises(th.ThriftProtocolError):
        conn.receive_data(b"x")
    assert th.ThriftConnection().receive_data(struct.pack(">i", -1)) == [Close()]
    with pytest.raises(ValueError, match="frame_bytes_max"):
        th.ThriftConnection(frame_bytes_max=limits.thrift_frame_bytes_max + 1)


def test_bad_header_closes_and_truncated_arguments_are_a_protocol_error() -> None:
    conn = th.ThriftConnection()
    assert conn.receive_data(struct.pack(">iI", 4, 0x80020001)) == [Close()]
    frame = call_frame("peek", [(1, TType.STRING, "queue")])
    truncated = struct.pack(">i", len(frame) - 7) + frame[4:-3]
    [event] = th.ThriftConnection().receive_data(truncated)
    assert isinstance(event, th.BadCall)
    assert event.error is th.ApplicationError.PROTOCOL_ERROR


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_any_frame_body_gives_an_event(body: bytes) -> None:
    """Peer input never raises: every frame is a call, a BadCall or a Close."""
    events = th.ThriftConnection().receive_data(struct.pack(">i", len(body)) + body)
    assert len(events) == 1


def test_methods_match_the_docs() -> None:
    from tests.support.layout import REPO_ROOT

    text = (REPO_ROOT / "docs" / "kestrel-compat.md").read_text(encoding="utf-8")
    for spec in th.METHODS:
        assert f"`{spec.name}(" in text, spec.name


# --- the session ---------------------------------------------------------------------------------


class ThriftClient:
    """One thrift connection through a real ThriftConnection and ThriftSession."""

    def __init__(self, harness: Harness, reads: ThriftReads) -> None:
        self.harness = harness
        self.session = ThriftSession(harness.service, reads)
        self.codec = th.ThriftConnection()
        self.closed = False

    async def call(self, frame: bytes) -> Any:
        """Send one call frame; the success value or the TApplicationException."""
        out = bytearray()

        async def write(reply: bytes) -> None:
            out.extend(reply)

        for event in self.codec.receive_data(frame):
            if await self.session.handle(event, write):
                self.disconnect()
        await self.harness.settle()
        if not out:
            return None
        return read_reply(bytes(out))[2]

    def disconnect(self) -> None:
        if not self.closed:
            self.closed = True
            self.session.client_left()
            self.session.finish()


class Server:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.reads = ThriftReads()

    def client(self) -> ThriftClient:
        return ThriftClient(self.harness, self.reads)


async def started(**config: object) -> Server:
    harness = await Harness(make_config(**config) if config else None).start()  # type: ignore[arg-type]
    return Server(harness)


def queue_of(server: Server, name: str = "q") -> Any:
    return server.harness.service.collection.queues[name]


@pytest.mark.asyncio
async def test_put_returns_count_and_get_removes_for_good() -> None:
    """§11 put/get: auto_abort 0 removes for good, id 0."""
    server = await started()
    client = server.client()
    assert await client.call(put("q", [b"a", b"b", b"c"])) == 3
    assert await client.call(get("q", 2)) == [{1: b"a", 2: 0}, {1: b"b", 2: 0}]
    assert len(queue_of(server).open_reads) == 0
    assert await client.call(get("q", 5)) == [{1: b"c", 2: 0}]
    assert await client.call(get("q", 5)) == []


@pytest.mark.asyncio
async def test_get_max_items_zero_is_empty() -> None:
    server = await started()
    client = server.client()
    await client.call(put("q", [b"a"]))
    assert await client.call(get("q", 0)) == []
    assert len(queue_of(server).items) == 1


@pytest.mark.asyncio
async def test_put_stops_at_the_first_refusal() -> None:
    """§11 put: adds in order, stops at the first refusal, returns the count."""
    server = await started(queues={"q": {"max_items": 2}})
    client = server.client()
    assert await client.call(put("q", [b"a", b"b", b"c", b"d"])) == 2
    stats = stats_dict(await server.harness.client().send(b"stats\r\n"))
    assert stats["cmd_set"] == "3"


@pytest.mark.asyncio
async def test_put_expiration_is_relative_ms_and_zero_is_never() -> None:
    server = await started()
    client = server.client()
    await client.call(put("q", [b"soon"], 1000))
    await client.call(put("q", [b"never"], 0))
    server.harness.clock.advance(1.5)
    assert await client.call(get("q", 5)) == [{1: b"never", 2: 0}]


@pytest.mark.asyncio
async def test_reliable_get_ids_then_confirm() -> None:
    """§11 get with auto_abort: open reads with server-wide ids from 1; confirm counts them."""
    server = await started(server={"max_open_transactions": 5})
    client = server.client()
    await client.call(put("q", [b"a", b"b"]))
    items = await client.call(get("q", 5, 0, 60_000))
    assert items == [{1: b"a", 2: 1}, {1: b"b", 2: 2}]
    assert len(queue_of(server).open_reads) == 2
    assert await client.call(ids_call("confirm", "q", [1, 2, 99])) == 2
    assert len(queue_of(server).open_reads) == 0
    assert await client.call(ids_call("confirm", "q", [1])) == 0
    assert await client.call(get("q", 5)) == []


@pytest.mark.asyncio
async def test_abort_puts_back_at_the_head() -> None:
    server = await started(server={"max_open_transactions": 5})
    client = server.client()
    await client.call(put("q", [b"a", b"b"]))
    await client.call(get("q", 1, 0, 60_000))
    assert await client.call(ids_call("abort", "q", [1])) == 1
    assert await client.call(get("q", 5)) == [{1: b"a", 2: 0}, {1: b"b", 2: 0}]


@pytest.mark.asyncio
async def test_auto_abort_timer_puts_the_read_back() -> None:
    """§11: a read not confirmed within auto_abort_msec is aborted."""
    server = await started()
    client = server.client()
    await client.call(put("q", [b"a"]))
    assert await client.call(get("q", 1, 0, 50)) == [{1: b"a", 2: 1}]
    assert len(queue_of(server).items) == 0
    await asyncio.sleep(0.2)
    assert len(queue_of(server).items) == 1
    assert await client.call(ids_call("confirm", "q", [1])) == 0


@pytest.mark.asyncio
async def test_reads_survive_disconnect_and_any_connection_may_confirm() -> None:
    """§11: thrift open reads are not aborted on disconnect; the id map is global."""
    server = await started()
    first = server.client()
    await first.call(put("q", [b"a"]))
    assert await first.call(get("q", 1, 0, 60_000)) == [{1: b"a", 2: 1}]
    first.disconnect()
    assert len(queue_of(server).open_reads) == 1
    second = server.client()
    assert await second.call(ids_call("confirm", "other-name", [1])) == 1
    assert len(queue_of(server).open_reads) == 0


@pytest.mark.asyncio
async def test_get_stops_at_max_open_transactions_per_connection() -> None:
    """§11: stops early, no error, at maxOpenTransactions open reads per connection per queue."""
    server = await started()
    client = server.client()
    await client.call(put("q", [b"a", b"b"]))
    assert await client.call(get("q", 5, 0, 60_000)) == [{1: b"a", 2: 1}]
    assert await client.call(get("q", 5, 0, 60_000)) == []
    assert await client.call(get("q", 5)) == []  # Also a plain get while one is open.
    assert await server.client().call(get("q", 5)) == [{1: b"b", 2: 0}]  # Per connection.
    assert await client.call(ids_call("confirm", "q", [1])) == 1
    await client.call(put("q", [b"c"]))
    assert await client.call(get("q", 5, 0, 60_000)) == [{1: b"c", 2: 2}]


@pytest.mark.asyncio
async def test_get_waits_until_max_items_or_timeout() -> None:
    """§11 get: timeout > 0 waits until max_items or the timeout."""
    server = await started()
    reader = server.client()
    writer = server.client()
    task = asyncio.get_running_loop().create_task(reader.call(get("q", 2, 2000)))
    for data in (b"x", b"y"):
        await asyncio.sleep(0.02)
        assert await writer.call(put("q", [data])) == 1
    assert await asyncio.wait_for(task, 2) == [{1: b"x", 2: 0}, {1: b"y", 2: 0}]
    assert await reader.call(get("q", 2, 50)) == []


@pytest.mark.asyncio
async def test_peek_reports_queue_info() -> None:
    """§11 peek: head without removing; other fields are per-queue stats."""
    server = await started(server={"max_open_transactions": 5})
    client = server.client()
    await client.call(put("q", [b"head", b"next"]))
    await client.call(get("q", 1, 0, 60_000))
    info = await client.call(queue_call("peek", "q"))
    assert info == {1: b"next", 2: 1, 3: 4, 4: 21 + 4 + 21 + 4 + 5, 5: 0, 6: 0, 7: 1}
    empty = await client.call(queue_call("peek", "new"))
    assert empty == {2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0}
    assert "new" in server.harness.service.collection.queues  # peek creates the queue


@pytest.mark.asyncio
async def test_flush_delete_flush_all() -> None:
    server = await started()
    client = server.client()
    await client.call(put("a", [b"1"]))
    await client.call(put("b", [b"2"]))
    assert await client.call(queue_call("flush_queue", "a")) is None
    assert len(queue_of(server, "a").items) == 0
    assert await client.call(call_frame("flush_all_queues", [])) is None
    assert len(queue_of(server, "b").items) == 0
    assert await client.call(queue_call("delete_queue", "a")) is None
    assert "a" not in server.harness.service.collection.queues


@pytest.mark.asyncio
async def test_status_and_version() -> None:
    """§11 current_status / set_status / get_version."""
    server = await started(server={"version": "2.4.8"})
    client = server.client()
    assert await client.call(call_frame("current_status", [])) == th.ThriftStatus.UP
    assert await client.call(call_frame("set_status", [(1, TType.I32, 2)])) is None
    assert await client.call(call_frame("current_status", [])) == th.ThriftStatus.READ_ONLY
    assert await server.harness.client().send(b"status\r\n") == b"READONLY\r\n"
    error = await client.call(call_frame("set_status", [(1, TType.I32, 0)]))
    assert isinstance(error, TApplicationException)
    assert error.message == "Unknown status."
    await server.harness.client().send(b"status writeavoid\r\n")
    assert await client.call(call_frame("current_status", [])) == th.ThriftStatus.NOT_CONFIGURED
    assert await client.call(call_frame("get_version", [])) == b"2.4.8"


@pytest.mark.asyncio
async def test_status_not_configured() -> None:
    server = await started(server={"status_enabled": False})
    client = server.client()
    assert await client.call(call_frame("current_status", [])) == th.ThriftStatus.NOT_CONFIGURED
    error = await client.call(call_frame("set_status", [(1, TType.I32, 3)]))
    assert isinstance(error, TApplicationException)
    assert error.message == "Server status not configured."


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (put("q", [b"a"]), "Server not available for operation setItem"),
        (queue_call("flush_queue", "q"), "Server not available for operation flush"),
        (call_frame("flush_all_queues", []), "Server not available for operation flushAll"),
        (queue_call("delete_queue", "q"), "Server not available for operation delete"),
    ],
)
async def test_read_only_refusals_are_application_exceptions(frame: bytes, message: str) -> None:
    """§11: refusals surface as thrift application exceptions; the connection stays."""
    server = await started(server={"default_status": ServerStatus.READONLY})
    client = server.client()
    error = await client.call(frame)
    assert isinstance(error, TApplicationException)
    assert (error.type, error.message) == (TApplicationException.INTERNAL_ERROR, message)
    assert await client.call(get("q", 1)) == []
    assert await client.call(put("q", [])) == 0  # No item, no status check.


@pytest.mark.asyncio
async def test_quiescent_refuses_get_and_peek() -> None:
    server = await started(server={"default_status": ServerStatus.QUIESCENT})
    client = server.client()
    for frame, operation in ((get("q", 1), "monitorUntil"), (queue_call("peek", "q"), "getItem")):
        error = await client.call(frame)
        assert isinstance(error, TApplicationException)
        assert error.message == f"Server not available for operation {operation}"


@pytest.mark.asyncio
async def test_unknown_method_and_illegal_name() -> None:
    server = await started()
    client = server.client()
    error = await client.call(call_frame("nope", []))
    assert isinstance(error, TApplicationException)
    assert error.type == TApplicationException.UNKNOWN_METHOD
    error = await client.call(put("a.b", [b"x"]))
    assert isinstance(error, TApplicationException)
    assert await client.call(call_frame("get_version", [])) == b"2.4.1"


@pytest.mark.asyncio
async def test_thrift_and_memcache_share_queues() -> None:
    """All protocols see the same queues: thrift put, memcache get and the reverse."""
    server = await started()
    client = server.client()
    memcache = server.harness.client()
    assert await client.call(put("q", [b"from-thrift"])) == 1
    assert await memcache.send(b"get q\r\n") == value("q", b"from-thrift")
    assert await memcache.send(set_request("q", b"from-memcache")) == b"STORED\r\n"
    assert await client.call(get("q", 1)) == [{1: b"from-memcache", 2: 0}]
    stats = stats_dict(await memcache.send(b"stats\r\n"))
    assert (stats["cmd_set"], stats["curr_connections"]) == ("2", "2")
