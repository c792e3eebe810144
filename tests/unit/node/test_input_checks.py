"""The edge's pure checks (kayos/checks.py) and the HTTP body parsers (kayos/node/http/bodies.py),
called directly: every input gets a defined answer (a value or an ``InvalidRequest``)."""

from __future__ import annotations

import inspect
import json
from typing import Any

import msgpack
import pytest

from kayos import limits
from kayos.checks import check_expiries, check_item_keys, check_json_depth, check_u64, json_depth
from kayos.client.aio import AsyncClient
from kayos.client.sync import Client
from kayos.errors import InvalidRequest, LimitExceeded, ProtocolError
from kayos.node.http.bodies import int_param, parse_body, parse_commit, parse_consume, parse_produce

pytestmark = pytest.mark.unit

U64_END = 2**64


@pytest.mark.parametrize("value", [-1, U64_END, True, 1.0, "1", None])
def test_check_u64_refuses(value: Any) -> None:
    with pytest.raises(InvalidRequest, match="what"):
        check_u64(value, "what")


def test_check_u64_takes_the_whole_range() -> None:
    assert check_u64(0, "x") == 0
    assert check_u64(U64_END - 1, "x") == U64_END - 1
    with pytest.raises(InvalidRequest, match=r"\[1, 5\]"):
        check_u64(0, "x", low=1, high=5)


def test_column_checks() -> None:
    check_item_keys([b"a", b"b" * limits.item_key_bytes_max])
    with pytest.raises(InvalidRequest, match="empty"):
        check_item_keys([b"a", b""])
    with pytest.raises(LimitExceeded):
        check_item_keys([b"k" * (limits.item_key_bytes_max + 1)])
    check_expiries([0, U64_END - 1])
    check_expiries(None)
    for bad in ([U64_END], [-1], [True]):
        with pytest.raises(InvalidRequest, match="expiry_ms"):
            check_expiries(bad)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 3),
        (b'"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["', 0),
        (b'["\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]', 1),
        (b"[" * 40 + b"]" * 40, 40),
        (b"[]" * 100, 1),
    ],
)
def test_json_depth_counts_nesting_not_brackets_in_strings(text: bytes, depth: int) -> None:
    if text.count(b"[") + text.count(b"{") > limits.json_depth_max:
        assert json_depth(text) == depth
    else:
        assert json_depth(text) <= limits.json_depth_max


@pytest.mark.timeout(60)
def test_json_depth_of_an_unterminated_run_of_escapes_is_linear() -> None:
    # A 1 MB body of escaped quotes that never closes: with the closing quote required, the string
    # pattern rescanned to the end from every quote (about 50 minutes here); now one pass.
    hostile = b"[" * (limits.json_depth_max + 1) + b'"' + b'\\"' * 500_000
    assert json_depth(hostile) == limits.json_depth_max + 1
    with pytest.raises(InvalidRequest, match="json_depth_max"):
        check_json_depth(hostile)
    assert json_depth(b"[" * 40 + b'"abc\\') == 40  # a lone backslash at the end


def test_json_depth_bound() -> None:
    check_json_depth(b"[" * limits.json_depth_max + b"]" * limits.json_depth_max)
    with pytest.raises(InvalidRequest, match="json_depth_max"):
        check_json_depth(b"[" * (limits.json_depth_max + 1) + b"]" * (limits.json_depth_max + 1))


def test_parse_body_never_recurses() -> None:
    with pytest.raises(InvalidRequest):
        parse_body(b"[" * 200_000, "application/json")
    with pytest.raises(ProtocolError):
        parse_body(b"\x91" * 200_000 + b"\xc0", "application/msgpack")
    with pytest.raises(ProtocolError):
        parse_body(b"\xdd\xff\xff\xff\xff", "application/msgpack")  # array of 2^32-1: no
    assert parse_body(b'{"a": 1}', "application/json") == {"a": 1}


def _produce(*messages: dict[str, Any], **top: Any) -> Any:
    return parse_produce({"messages": list(messages), **top})


def test_parse_produce_puts_and_deletes() -> None:
    keys, values, expiries, headers = _produce(
        {"key": "a", "value": "1", "expiry_ms": U64_END - 1, "headers": {"h": "v"}},
        {"key": b"b", "delete": True},
        {"key": "c", "value": "", "delete": False},
        txn=False,
    )
    assert keys == [b"a", b"b", b"c"]
    assert values == [b"1", None, b""]
    assert expiries == [U64_END - 1, 0, 0]
    assert headers == [{"h": b"v"}, None, None]


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"key": "k", "valeu": "v"}, "valeu"),
        ({"key": "k"}, "value"),
        ({"key": "k", "value": None}, "value"),
        ({"value": "v"}, "key"),
        ({"key": "", "value": "v"}, "empty"),
        ({"key": 1, "value": "v"}, "key"),
        ({"key": "k", "value": 1}, "value"),
        ({"key": "k", "value": "v", "expiry_ms": U64_END}, "expiry_ms"),
        ({"key": "k", "value": "v", "expiry_ms": -1}, "expiry_ms"),
        ({"key": "k", "value": "v", "expiry_ms": 1.5}, "expiry_ms"),
        ({"key": "k", "value": "v", "expiry_ms": True}, "expiry_ms"),
        ({"key": "k", "delete": True, "value": "v"}, "only its key"),
        ({"key": "k", "delete": True, "expiry_ms": 5}, "only its key"),
        ({"key": "k", "delete": 1}, "delete"),
        ({"key": "k", "value": "v", "headers": {"h": 1}}, "header"),
        ({"key": "k", "value": "v", "headers": []}, "headers"),
        ({"key": "\ud800", "value": "v"}, "Unicode"),
        ({"key": "k", "value": "\udfff"}, "Unicode"),
        ({"key": "k", "value": "v", "headers": {"\ud800": "x"}}, "Unicode"),
        ({"key": "k", "value": "v", "headers": {"h": "\ud800"}}, "Unicode"),
    ],
)
def test_parse_produce_refuses(message: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        _produce(message)


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {},
        {"messages": []},
        {"messages": {}},
        {"messages": [1]},
        {"messages": [{"key": "k", "value": "v"}], "extra": 1},
        {"messages": [{"key": "k", "value": "v"}], "txn": 1},
    ],
)
def test_parse_produce_refuses_bodies(body: Any) -> None:
    with pytest.raises(InvalidRequest):
        parse_produce(body)


def test_parse_commit() -> None:
    assert parse_commit({"hwm": 5}) == (5, None)
    assert parse_commit({"hwm": 5, "state": "s"}) == (5, b"s")
    assert parse_commit({"hwm": 5, "state": None}) == (5, None)  # a relayed commit's shape
    for body in ({}, {"hwm": -1}, {"hwm": U64_END}, {"hwm": True}, {"hwm": 1, "x": 2}, [1]):
        with pytest.raises(InvalidRequest):
            parse_commit(body)
    with pytest.raises(LimitExceeded):
        parse_commit({"hwm": 1, "state": b"s" * (limits.group_state_bytes_max + 1)})


def test_query_parameters() -> None:
    assert parse_consume({}) == {
        "after": None,
        "upto": None,
        "limit": 1000,
        "wait_ms": 0,
        "times": False,
    }
    assert parse_consume({"after": str(U64_END - 1)})["after"] == U64_END - 1
    assert parse_consume({"times": "1"})["times"] is True
    assert parse_consume({"times": "0"})["times"] is False
    for query in (
        {"after": str(U64_END)},
        {"after": "-1"},
        {"after": "+1"},
        {"after": " 1"},
        {"after": "1_000"},
        {"after": "٣"},  # a digit to str.isdigit, not to the API
        {"limit": "0"},
        {"limit": str(limits.consume_page_entries_max + 1)},
        {"wait_ms": str(limits.consume_wait_ms_max + 1)},
        {"upto": "9" * 100_000},
        {"times": "2"},
        {"times": "yes"},
    ):
        with pytest.raises(InvalidRequest):
            parse_consume(query)
    assert int_param({}, "seq", 7) == 7


def _public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def test_the_blocking_client_has_everything_the_async_one_has() -> None:
    assert _public(AsyncClient) - {"connect"} <= _public(Client)
    # ... and the same keyword defaults (acks="all" everywhere).
    for name in _public(AsyncClient) - {"connect", "close", "topology"}:
        asynchronous = inspect.signature(getattr(AsyncClient, name)).parameters
        blocking = inspect.signature(getattr(Client, name)).parameters
        assert list(asynchronous) == list(blocking), name
        for parameter, spec in asynchronous.items():
            assert blocking[parameter].default == spec.default, (name, parameter)


@pytest.mark.parametrize("method", ["produce", "produce_batch", "transaction", "produce_http"])
def test_acks_defaults_to_all(method: str) -> None:
    for cls in (AsyncClient, Client):
        assert inspect.signature(getattr(cls, method)).parameters["acks"].default == "all"


def test_json_messages_body_round_trips_through_the_parser() -> None:
    from kayos.client.types import Item, to_columns

    columns = to_columns([Item("a", "1", 7, {"h": "v"}), ("b", None)])
    body = {"messages": columns.to_messages(), "txn": True}
    keys, values, expiries, _ = parse_produce(
        parse_body(msgpack.packb(body, use_bin_type=True), "application/msgpack")
    )
    assert (keys, values, expiries) == ([b"a", b"b"], [b"1", None], [7, 0])
    assert parse_produce(json.loads(json.dumps({"messages": [{"key": "k", "value": "v"}]})))


def test_lone_surrogates_in_json_are_refused_not_crashed_on() -> None:
    raw = b'{"messages": [{"key": "\\ud800", "value": "v"}]}'
    with pytest.raises(InvalidRequest, match="Unicode"):
        parse_produce(parse_body(raw, "application/json"))


@pytest.mark.parametrize("name", ["\ud800", "a\udfffb"])
def test_names_with_lone_surrogates(name: str) -> None:
    from kayos.checks import check_group_name
    from kayos.client.types import Item, to_columns
    from kayos.topology import check_queue_name

    with pytest.raises(InvalidRequest):
        check_queue_name(name)
    with pytest.raises(InvalidRequest):
        check_group_name(name)
    with pytest.raises(InvalidRequest, match="Unicode"):
        to_columns([Item(name, "v")])
    with pytest.raises(InvalidRequest, match="Unicode"):
        to_columns([Item("k", "v", 0, {name: "v"})])
