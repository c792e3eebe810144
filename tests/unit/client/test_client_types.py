"""The client's value types (kayos/client/types.py): item checks and the PRODUCE column layout,
consume page assembly from node replies (docs/node-api.md, "Consume"), transactions."""

from __future__ import annotations

from typing import Any

import pytest

import kayos
from kayos import limits
from kayos.client.types import (
    Item,
    Message,
    MessageView,
    Page,
    PageColumns,
    Transaction,
    acks_code,
    acks_param,
    group_from_reply,
    page_from_reply,
    to_columns,
)
from kayos.errors import InvalidRequest, LimitExceeded, ProtocolError

pytestmark = pytest.mark.unit


def test_items_in_every_shape_become_columns() -> None:
    columns = to_columns([("a", "1"), (b"b", b"2", 5), Item("c", None), Item(b"d", "4")])
    assert columns.keys == (b"a", b"b", b"c", b"d")
    assert columns.values == (b"1", b"2", None, b"4")
    assert columns.expiries_ms == (0, 5, 0, 0)
    assert columns.headers is None


def test_columns_without_expiry_or_headers_are_none() -> None:
    columns = to_columns([("a", "1")])
    assert columns.expiries_ms is None
    assert columns.headers is None


def test_headers_become_bytes() -> None:
    columns = to_columns([Item("a", "1", headers={"trace": "x", "raw": b"\x00"}), ("b", "2")])
    assert columns.headers == ({"trace": b"x", "raw": b"\x00"}, None)


def test_http_messages_omit_defaults() -> None:
    columns = to_columns([Item("a", "1", 7, {"h": "v"}), ("b", None)])
    assert columns.to_messages() == [
        {"key": b"a", "value": b"1", "expiry_ms": 7, "headers": {"h": b"v"}},
        {"key": b"b", "delete": True},
    ]


@pytest.mark.parametrize(
    ("items", "error"),
    [
        ([], InvalidRequest),
        ([("", "v")], InvalidRequest),
        ([("k" * (limits.item_key_bytes_max + 1), "v")], LimitExceeded),
        ([("k", "v", -1)], InvalidRequest),
        ([(1, "v")], InvalidRequest),
        ([("k", 2)], InvalidRequest),
        ([("k",)], InvalidRequest),
        ([Item("k", "v", headers={1: "x"})], InvalidRequest),  # type: ignore[dict-item]
    ],
)
def test_bad_items_are_refused_before_sending(items: list[Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        to_columns(items)


@pytest.mark.parametrize(
    ("acks", "code", "param"), [("all", -1, "all"), (-1, -1, "all"), (1, 1, "1"), (0, 0, "0")]
)
def test_acks(acks: Any, code: int, param: str) -> None:
    assert acks_code(acks) == code
    assert acks_param(acks) == param


@pytest.mark.parametrize("acks", [2, "one", True, False, None])
def test_bad_acks(acks: Any) -> None:
    with pytest.raises(InvalidRequest):
        acks_code(acks)


def reply(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "shard": 1,
        "group": "g",
        "hwm": 10,
        "boundary": 20,
        "messages": [
            {
                "seq": 11,
                "key": b"a",
                "value": b"1",
                "expiry_ms": 0,
                "headers": None,
                "deleted": False,
            },
            {
                "seq": 15,
                "key": b"b",
                "value": None,
                "expiry_ms": 0,
                "headers": None,
                "deleted": True,
            },
            {
                "seq": 19,
                "key": b"c",
                "value": b"3",
                "expiry_ms": 99,
                "headers": {"h": b"v"},
                "deleted": False,
            },
        ],
        "next": 19,
        "end": False,
    }
    base.update(changes)
    return base


def test_page_from_a_msgpack_reply() -> None:
    page = page_from_reply(reply())
    assert (page.shard, page.group, page.hwm, page.boundary, page.next, page.end) == (
        1,
        "g",
        10,
        20,
        19,
        False,
    )
    assert page.messages == (
        Message(11, b"a", b"1"),
        Message(15, b"b", None, deleted=True),
        Message(19, b"c", b"3", 99, {"h": b"v"}),
    )


def test_page_from_a_json_reply_gets_bytes() -> None:
    page = page_from_reply(
        reply(messages=[{"seq": 11, "key": "k", "value": "v", "headers": {"h": "x"}}])
    )
    assert page.messages == (Message(11, b"k", b"v", 0, {"h": b"x"}),)


def test_the_end_marker_page_may_be_empty() -> None:
    page = page_from_reply(reply(messages=[], next=20, end=True))
    assert page.end
    assert page.messages == ()


@pytest.mark.parametrize(
    "bad",
    [
        reply(messages=[{"seq": 12}, {"seq": 11}]),  # out of order (and missing keys)
        reply(
            messages=[
                {"seq": 12, "key": b"a", "value": b"1"},
                {"seq": 12, "key": b"b", "value": b"2"},
            ]
        ),
        reply(messages=[{"seq": 10, "key": b"a", "value": b"1"}]),  # not above hwm
        reply(messages=[{"seq": 21, "key": b"a", "value": b"1"}]),  # past the boundary
        reply(hwm=30),
        reply(messages=[{"seq": 11, "key": 5, "value": b"1"}]),
        {"shard": 1},
        [1, 2],
    ],
)
def test_malformed_pages_are_protocol_errors(bad: Any) -> None:
    with pytest.raises(ProtocolError):
        page_from_reply(bad)


def view_of(count: int) -> MessageView:
    seqs = tuple(range(1, count + 1))
    return MessageView(PageColumns(seqs, tuple(b"k%d" % s for s in seqs), (None,) * count))


def test_a_message_view_reads_like_a_tuple_of_messages() -> None:
    view = view_of(5)
    expected = tuple(Message(s, b"k%d" % s, None) for s in range(1, 6))
    assert len(view) == 5
    assert tuple(view) == expected
    assert list(view) == list(expected)
    assert view == expected
    assert expected == view
    assert view == list(expected)
    assert view != expected[:4]
    assert (view[0], view[-1], view[1:3], view[::2], view[4:1]) == (
        expected[0],
        expected[-1],
        expected[1:3],
        expected[::2],
        (),
    )
    assert expected[2] in view
    assert view.index(expected[3]) == 3
    with pytest.raises(IndexError):
        view[5]
    with pytest.raises(TypeError):
        hash(view)


def test_a_message_is_a_named_tuple_with_defaults() -> None:
    message = Message(3, b"k", b"v")
    assert (message.expiry_ms, message.headers, message.deleted) == (0, None, False)
    assert message.append_ms is None  # appended last, so the six fields before keep their places
    assert message == (3, b"k", b"v", 0, None, False, None)
    assert message[:6] == (3, b"k", b"v", 0, None, False)


def test_pages_of_messages_and_of_columns_are_equal_when_their_messages_are() -> None:
    columns = PageColumns((2, 4), (b"a", b"b"), (b"1", None), None, ({"h": b"x"}, None), None)
    from_columns = Page.from_columns(0, "g", 1, 4, columns, 4, True)
    messages = (Message(2, b"a", b"1", 0, {"h": b"x"}), Message(4, b"b", None))
    from_messages = Page(0, "g", 1, 4, messages, 4, True)
    assert from_columns == from_messages
    assert from_columns != Page(0, "g", 1, 4, messages[:1], 4, True)
    assert from_messages.columns == PageColumns(
        (2, 4), (b"a", b"b"), (b"1", None), None, ({"h": b"x"}, None), None
    )
    assert Page(0, "g", 1, 1, (), 1, True).columns == PageColumns((), (), ())
    assert len(from_columns) == len(from_messages) == 2
    with pytest.raises(AttributeError):
        from_columns.end = False  # type: ignore[misc]


def test_group_reply() -> None:
    info = group_from_reply({"shard": 0, "hwm": 3, "boundary": 9, "lag": 6, "state": b"s"})
    assert (info.hwm, info.boundary, info.lag, info.state) == (3, 9, 6, b"s")
    with pytest.raises(ProtocolError):
        group_from_reply({"hwm": 3})


def test_group_reply_lag_seconds() -> None:
    reply = {"shard": 0, "hwm": 3, "boundary": 9, "lag": 6}
    assert group_from_reply(reply).lag_seconds is None, "an older node: unknown"
    assert group_from_reply({**reply, "lag_seconds": None}).lag_seconds is None
    assert group_from_reply({**reply, "lag_seconds": 2.5}).lag_seconds == 2.5
    assert group_from_reply({**reply, "lag_seconds": 0}).lag_seconds == 0.0
    for bad in (-1, "2", True):
        with pytest.raises(ProtocolError):
            group_from_reply({**reply, "lag_seconds": bad})


def test_transaction_collects_puts_and_deletes() -> None:
    txn = Transaction("q")
    txn.put("a", "1", expiry_ms=5)
    txn.delete("b")
    assert len(txn) == 2
    assert to_columns(txn.items).values == (b"1", None)
    txn.result = (1, 2)
    with pytest.raises(InvalidRequest):
        txn.put("c", "3")


def test_public_names_are_lazy_and_complete() -> None:
    for name in kayos.__all__:
        assert getattr(kayos, name) is not None
    assert kayos.Page is kayos.client.Page  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        kayos.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_plain_pairs_take_the_fast_path_with_the_same_result_and_checks() -> None:
    from kayos.client.types import to_columns

    pairs = [(b"k1", b"v1"), (b"k2", b"")]
    assert to_columns(pairs) == to_columns([Item(b"k1", b"v1"), Item(b"k2", b"")])
    with pytest.raises(LimitExceeded, match="item key"):
        to_columns([(b"k", b"v"), (b"x" * (limits.item_key_bytes_max + 1), b"v")])
    with pytest.raises(InvalidRequest, match="empty"):
        to_columns([(b"", b"v")])
