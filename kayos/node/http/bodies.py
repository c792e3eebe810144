"""What a node's HTTP face reads and writes (docs/node-api.md): request bodies and query
parameters parsed and checked, and replies shaped as msgpack or JSON.

Bodies are msgpack by their content type, JSON otherwise; replies are msgpack when the request's
``Accept`` asks for it, JSON otherwise (keys and values as UTF-8 text). A ``KayosError`` becomes
the documented error reply (``error_reply``). Every parser is a pure function of its input, so
the hostile-input tests call them directly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
from aiohttp import web

from kayos import limits
from kayos.checks import (
    check_expiry_ms,
    check_item_key,
    check_json_depth,
    check_text,
    check_u64,
    encode_text,
)
from kayos.errors import (
    InvalidRequest,
    KayosError,
    LimitExceeded,
    ProtocolError,
    RetentionGapError,
    WrongRoleError,
)
from kayos.node.pages import Page
from kayos.node.runtime import Node

MSGPACK = "application/msgpack"
# Large bodies are parsed here (limits.http_parse_threads_max), never in the node's default
# executor, whose threads run commits. Threads start on first use.
_PARSE_EXECUTOR = ThreadPoolExecutor(limits.http_parse_threads_max, "kayos-parse")

STATUS_FOR_CODE = {
    "invalid_request": 400,
    "protocol_error": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "limit_exceeded": 413,
    "wrong_role": 421,
    "stale_epoch": 409,
    "timeout": 504,
    "unavailable": 503,
    "disk_full": 507,
    "retention_gap": 410,
}


def _wants_msgpack(request: web.Request) -> bool:
    return MSGPACK in request.headers.get("Accept", "")


def reply(request: web.Request, payload: Any, status: int = 200) -> web.Response:
    """``payload`` as msgpack if the request accepts it, else as JSON (bytes as UTF-8 text)."""
    if _wants_msgpack(request):
        body = msgpack.packb(payload, use_bin_type=True)
        return web.Response(body=body, status=status, content_type=MSGPACK)
    return web.json_response(_jsonable(payload), status=status)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def error_reply(request: web.Request, exc: KayosError, node: Node) -> web.Response:
    redirect_node = exc.redirect if isinstance(exc, WrongRoleError) else None
    address = node.topology.nodes.get(redirect_node) if redirect_node else None
    payload = {
        "error": {
            "code": exc.code,
            "message": str(exc),
            "redirect": address.http_url if address else None,
            "node": redirect_node,
            "epoch": node.epoch,
        }
    }
    if isinstance(exc, RetentionGapError):
        payload["error"]["floor"] = exc.floor
    return reply(request, payload, STATUS_FOR_CODE.get(exc.code, 500))


async def read_body(request: web.Request, convert: Callable[[Any], Any] | None = None) -> Any:
    """The request's body, parsed (and passed through ``convert``): on the event loop when it is
    at most ``limits.http_body_inline_parse_bytes_max``, else in a parse thread, so that peers'
    pings are still answered while a large produce is parsed."""
    try:
        async with asyncio.timeout(limits.http_body_read_ms_max / 1000):
            raw = await request.read()
    except TimeoutError as exc:  # a half-sent body: nothing was done with it
        raise InvalidRequest(
            f"request body not received within {limits.http_body_read_ms_max} ms"
        ) from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise LimitExceeded(
            f"request body over http_body_bytes_max={limits.http_body_bytes_max} bytes"
        ) from exc
    if len(raw) <= limits.http_body_inline_parse_bytes_max:
        return _parsed(raw, request.content_type, convert)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_PARSE_EXECUTOR, _parsed, raw, request.content_type, convert)


def _parsed(raw: bytes, content_type: str, convert: Callable[[Any], Any] | None) -> Any:
    body = parse_body(raw, content_type)
    return body if convert is None else convert(body)


def parse_body(raw: bytes, content_type: str) -> Any:
    """A request body as Python values: msgpack by its content type, else JSON. Nothing in it can
    make the parser recurse without bound or allocate past the body's size: JSON nesting is
    checked by a scan first (``limits.json_depth_max``), msgpack's C parser has its own depth
    bound and is told that no string, array or map is longer than the body."""
    if content_type == MSGPACK:
        size = len(raw)
        try:
            return msgpack.unpackb(
                raw,
                raw=False,
                strict_map_key=True,
                max_str_len=size,
                max_bin_len=size,
                max_array_len=size,
                max_map_len=size,
                max_ext_len=0,
            )
        except (ValueError, msgpack.UnpackException, TypeError) as exc:
            raise ProtocolError(f"malformed msgpack body: {exc}") from exc
    check_json_depth(raw)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"malformed JSON body: {exc}") from exc


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return encode_text(value, what)
    raise InvalidRequest(f"{what} must be a string or bytes")


_PRODUCE_FIELDS = frozenset({"messages", "txn"})
_MESSAGE_FIELDS = frozenset({"key", "value", "delete", "expiry_ms", "headers"})
_COMMIT_FIELDS = frozenset({"hwm", "state"})


def _refuse_unknown(body: dict[Any, Any], known: frozenset[str], what: str) -> None:
    unknown = [name for name in body if name not in known]
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(map(repr, unknown[:5]))} in {what}; "
            f"its fields are {', '.join(sorted(known))}"
        )


def _parse_message(
    message: Any,
) -> tuple[bytes, bytes | None, int, dict[str, bytes] | None]:
    """One message object: a put names its ``value``; a delete says ``"delete": true`` and
    carries neither value, expiry nor headers (docs/node-api.md)."""
    if not isinstance(message, dict):
        raise InvalidRequest("each message must be an object")
    _refuse_unknown(message, _MESSAGE_FIELDS, "a message")
    if "key" not in message:
        raise InvalidRequest("each message needs a 'key'")
    key = check_item_key(_as_bytes(message["key"], "key"))
    delete = message.get("delete", False)
    if type(delete) is not bool:
        raise InvalidRequest("'delete' must be true or false")
    if delete:
        if message.keys() - {"key", "delete"}:
            raise InvalidRequest("a delete ('delete': true) carries only its key")
        return key, None, 0, None
    value = message.get("value")
    if value is None:
        raise InvalidRequest(
            "each message needs a 'value' (to delete the key, send {'key': ..., 'delete': true})"
        )
    expiry = check_expiry_ms(message.get("expiry_ms", 0))
    raw_headers = message.get("headers")
    if raw_headers is None:
        headers = None
    elif isinstance(raw_headers, dict) and all(isinstance(k, str) for k in raw_headers):
        # A name must be UTF-8 (JSON's "\ud800" is not): it is packed as text down the chain.
        headers = {
            check_text(k, "header name"): _as_bytes(v, "header value")
            for k, v in raw_headers.items()
        }
    else:
        raise InvalidRequest("headers must map names to strings")
    return key, _as_bytes(value, "value"), expiry, headers


def parse_produce(
    body: Any,
) -> tuple[list[bytes], list[bytes | None], list[int] | None, list[dict[str, bytes] | None] | None]:
    """A produce body's columns, every field checked (``InvalidRequest``/``LimitExceeded``)."""
    if not isinstance(body, dict):
        raise InvalidRequest("body must be an object with a 'messages' list")
    _refuse_unknown(body, _PRODUCE_FIELDS, "the body")
    if type(body.get("txn", True)) is not bool:
        raise InvalidRequest("'txn' must be true or false")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list")
    if len(messages) > limits.batch_entries_max:
        raise LimitExceeded(f"batch of {len(messages)} exceeds {limits.batch_entries_max}")
    keys: list[bytes] = []
    values: list[bytes | None] = []
    expiries: list[int] = []
    headers: list[dict[str, bytes] | None] = []
    for message in messages:
        key, value, expiry, header = _parse_message(message)
        keys.append(key)
        values.append(value)
        expiries.append(expiry)
        headers.append(header)
    return (
        keys,
        values,
        expiries if any(expiries) else None,
        headers if any(h is not None for h in headers) else None,
    )


def parse_commit(body: Any) -> tuple[int, bytes | None]:
    """A group commit body: ``(hwm, state)``; the head checks ``hwm`` against what it holds."""
    if not isinstance(body, dict):
        raise InvalidRequest("body must be {'hwm': <integer>, 'state'?: bytes}")
    _refuse_unknown(body, _COMMIT_FIELDS, "the body")
    if "hwm" not in body:
        raise InvalidRequest("body must be {'hwm': <integer>, 'state'?: bytes}")
    hwm = check_u64(body["hwm"], "hwm")
    raw_state = body.get("state")
    state = None if raw_state is None else _as_bytes(raw_state, "state")
    if state is not None and len(state) > limits.group_state_bytes_max:
        raise LimitExceeded(f"group state over {limits.group_state_bytes_max} bytes")
    return hwm, state


def int_param(
    query: Mapping[str, str],
    name: str,
    default: int | None,
    *,
    low: int = 0,
    high: int = limits.u64_max,
) -> int | None:
    """An integer query parameter in ``[low, high]``, or ``default`` when it is absent."""
    raw = query.get(name)
    if raw is None:
        return default
    # int() takes "+1", " 1" and "1_000" and spends quadratic time on thousands of digits.
    if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(limits.u64_max)):
        raise InvalidRequest(f"{name} must be an integer in [{low}, {high}], not {raw[:40]!r}")
    return check_u64(int(raw), name, low=low, high=high)


def parse_consume(query: Mapping[str, str]) -> dict[str, Any]:
    """A consume request's parameters (docs/node-api.md): ``after``/``upto`` seqs are u64s,
    ``limit`` is 1 to ``limits.consume_page_entries_max``, ``wait_ms`` at most
    ``limits.consume_wait_ms_max``, ``times`` 0 or 1."""
    return {
        "after": int_param(query, "after", None),
        "upto": int_param(query, "upto", None),
        "limit": int_param(query, "limit", 1000, low=1, high=limits.consume_page_entries_max),
        "wait_ms": int_param(query, "wait_ms", 0, high=limits.consume_wait_ms_max),
        "times": int_param(query, "times", 0, high=1) == 1,
    }


def shard_query(query: Mapping[str, str]) -> int | None:
    """The ``shard`` a per-shard request of a queue names (None: not given)."""
    raw = query.get("shard")
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10:
        raise InvalidRequest(f"shard must be an integer, not {raw[:40]!r}")
    return int(raw)


def shard_param(request: web.Request) -> int:
    """The ``{shard}`` of a per-shard route's path."""
    raw = request.match_info["shard"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10:
        raise InvalidRequest(f"shard must be an integer, not {raw[:40]!r}")
    return int(raw)


def page_payload(page: Page, *, columns: bool = False) -> dict[str, Any]:
    """A consume reply: a list of message objects (the JSON shape, and msgpack's unless the
    client asks for ``columns=1``) or, with ``columns``, one list per field (docs/node-api.md)."""
    payload: dict[str, Any] = {
        "shard": page.shard,
        "group": page.group,
        "hwm": page.hwm,
        "boundary": page.boundary,
    }
    if columns:
        payload["seqs"] = page.seqs
        payload["keys"] = page.keys
        payload["values"] = page.values
        payload["expiries_ms"] = page.expiries_ms
        payload["headers"] = page.headers
        payload["deleted"] = page.deleted
    else:
        payload["messages"] = [
            {
                "seq": m.seq,
                "key": m.key,
                "value": m.value,
                "expiry_ms": m.expiry_ms,
                "headers": m.headers,
                "deleted": m.deleted,
            }
            for m in page.messages
        ]
    if page.times is not None:  # asked for with times=1 ("Append times")
        payload["times"] = page.times
    payload["next"] = page.next
    payload["end"] = page.end
    return payload
