"""A node's HTTP face (aiohttp), per docs/node-api.md.

Handlers hold no logic: they parse the request (JSON, or msgpack for the client), call ``Node``,
and map ``KayosError`` to the documented error reply. Replies are msgpack when the request's
``Accept`` asks for it, JSON otherwise (keys and values as UTF-8 text).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
    UnavailableError,
    WrongRoleError,
)
from kayos.node import learners
from kayos.node.lease_api import apply_lease, apply_write_hold
from kayos.node.operator_api import routes as operator_routes
from kayos.node.runtime import GROUP_STATE_META, HWM_META, Node, Page, link_status
from kayos.node.runtime import lag_seconds as lag_seconds_of

MSGPACK = "application/msgpack"
# Large bodies are parsed here (limits.http_parse_threads_max), never in the node's default
# executor, whose threads run commits. Threads start on first use.
_PARSE_EXECUTOR = ThreadPoolExecutor(limits.http_parse_threads_max, "kayos-parse")

STATUS_FOR_CODE = {
    "invalid_request": 400,
    "protocol_error": 400,
    "unauthenticated": 401,
    "limit_exceeded": 413,
    "wrong_role": 421,
    "stale_epoch": 409,
    "timeout": 504,
    "unavailable": 503,
    "disk_full": 507,
    "retention_gap": 410,
}
_ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1}
_NODE_KEY = web.AppKey("node", Node)
_SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)


def _wants_msgpack(request: web.Request) -> bool:
    return MSGPACK in request.headers.get("Accept", "")


def _reply(request: web.Request, payload: Any, status: int = 200) -> web.Response:
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
    return _reply(request, payload, STATUS_FOR_CODE.get(exc.code, 500))


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
    ``limits.consume_wait_ms_max``."""
    return {
        "after": int_param(query, "after", None),
        "upto": int_param(query, "upto", None),
        "limit": int_param(query, "limit", 1000, low=1, high=limits.consume_page_entries_max),
        "wait_ms": int_param(query, "wait_ms", 0, high=limits.consume_wait_ms_max),
    }


def shard_query(query: Mapping[str, str]) -> int | None:
    """The ``shard`` a per-shard request of a queue names (None: not given)."""
    raw = query.get("shard")
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10:
        raise InvalidRequest(f"shard must be an integer, not {raw[:40]!r}")
    return int(raw)


def _shard_param(request: web.Request) -> int:
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
    payload["next"] = page.next
    payload["end"] = page.end
    return payload


def make_app(node: Node) -> web.Application:
    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except KayosError as exc:
            return error_reply(request, exc, node)

    app = web.Application(middlewares=[errors], client_max_size=limits.http_body_bytes_max)
    app[_NODE_KEY] = node
    routes = web.RouteTableDef()

    @routes.get("/v1/topology")
    async def topology(request: web.Request) -> web.Response:
        payload = node.topology.to_json()
        message = node.reconfigure.message
        if message is not None:  # the MAC it came with (the secret never leaves the node)
            payload["mac"] = message["mac"]
        return web.json_response(payload)

    @routes.post("/v1/admin/topology")
    async def admin_topology(request: web.Request) -> web.Response:
        message = await read_body(request)
        epoch, applied = await node.reconfigure.offer(message)
        return web.json_response({"epoch": epoch, "applied": applied})

    @routes.get("/v1/status")
    async def status(request: web.Request) -> web.Response:
        return web.json_response(node.status())

    @routes.post("/v1/queues/{queue}/messages")
    async def produce(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        acks = _ACKS.get(request.query.get("acks", "1"))
        if acks is None:
            raise InvalidRequest("acks must be 0, 1 or all")
        if len(node.topology.shards_for(queue)) == 1:  # else the keys name the shard
            node.replica_for(queue, want="head")  # wrong role before reading a large body
        keys, values, expiries, headers = await read_body(request, parse_produce)
        first, last = await node.produce(queue, keys, values, expiries, headers, acks=acks)
        shard = node.topology.shard_for_batch(queue, keys)
        return _reply(request, {"shard": shard, "first_seq": first, "last_seq": last})

    @routes.get("/v1/queues/{queue}/consume")
    async def consume(request: web.Request) -> web.Response:
        page = await node.consume(
            request.match_info["queue"],
            request.query.get("group", ""),
            **parse_consume(request.query),
            shard_id=shard_query(request.query),
        )
        return _reply(request, page_payload(page, columns=request.query.get("columns") == "1"))

    @routes.post("/v1/queues/{queue}/groups/{group}/commit")
    async def commit_group(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        group = request.match_info["group"]
        hwm, state = await read_body(request, parse_commit)
        try:
            seq = await node.commit_group(queue, group, hwm, state, shard_query(request.query))
        except WrongRoleError as exc:
            # Any member takes a group commit and relays it to the head.
            return await _relay(request, exc, {"hwm": hwm, "state": state})
        return _reply(request, {"hwm": hwm, "seq": seq})

    @routes.delete("/v1/queues/{queue}/groups/{group}")
    async def delete_group(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        group = request.match_info["group"]
        try:
            seq = await node.delete_group(queue, group, shard_query(request.query))
        except WrongRoleError as exc:
            return await _relay(request, exc, None)
        return _reply(request, {"deleted": True, "seq": seq})

    @routes.put("/v1/queues/{queue}/retention")
    async def set_retention(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        shard_id = shard_query(request.query)
        node.replica_for(queue, want="head", shard_id=shard_id)  # wrong role before the body
        body = await read_body(request)
        return _reply(request, await node.retention.set_policy(queue, body, shard_id))

    @routes.get("/v1/queues/{queue}/retention")
    async def get_retention(request: web.Request) -> web.Response:
        return _reply(
            request,
            node.retention.get_policy(request.match_info["queue"], shard_query(request.query)),
        )

    @routes.get("/v1/shards/{shard}/groups")
    async def list_groups(request: web.Request) -> web.Response:
        shard = _shard_param(request)
        return _reply(request, {"shard": shard, "groups": node.list_groups(shard)})

    async def _relay(
        request: web.Request, exc: WrongRoleError, body: dict[str, Any] | None
    ) -> web.Response:
        head = node.topology.nodes.get(exc.redirect or "")
        if head is None or request.headers.get("X-Kayos-Relayed"):
            raise exc
        session = app.get(_SESSION_KEY)
        if session is None:
            session = aiohttp.ClientSession()
            app[_SESSION_KEY] = session
        url = f"{head.http_url}{request.rel_url.path}"
        try:
            async with session.request(
                request.method,
                url,
                params=dict(request.query),  # it names the shard of a queue with several
                data=None if body is None else msgpack.packb(body, use_bin_type=True),
                headers={"Content-Type": MSGPACK, "Accept": MSGPACK, "X-Kayos-Relayed": "1"},
                timeout=aiohttp.ClientTimeout(total=limits.produce_commit_timeout_ms / 1000 + 5),
            ) as response:
                payload = msgpack.unpackb(await response.read(), raw=False)
                return _reply(request, payload, response.status)
        except (aiohttp.ClientError, TimeoutError, ValueError) as relay_error:
            raise UnavailableError(f"cannot reach the head {head.id}: {relay_error}") from exc

    @routes.get("/v1/queues/{queue}/groups/{group}")
    async def group_info(request: web.Request) -> web.Response:
        return _reply(
            request,
            await node.group_info(
                request.match_info["queue"],
                request.match_info["group"],
                shard_query(request.query),
            ),
        )

    @routes.get("/v1/shards/{shard}/committed")
    async def committed(request: web.Request) -> web.Response:
        shard = _shard_param(request)
        seq = int_param(request.query, "seq", 0) or 0
        timeout_ms = int_param(request.query, "timeout_ms", 0) or 0
        value = await node.wait_committed(shard, seq, timeout_ms)
        return _reply(request, {"shard": shard, "committed_seq": value})

    @routes.post("/v1/admin/catch-up")
    async def catch_up(request: web.Request) -> web.Response:
        order = learners.parse_catch_up(node.topology.identity, await read_body(request))
        return _reply(request, await learners.start_catch_up(node, order))

    @routes.post("/v1/admin/lease")
    async def lease(request: web.Request) -> web.Response:
        message = await read_body(request)
        return _reply(request, apply_lease(node.topology.identity, node.lease, node.epoch, message))

    @routes.post("/v1/admin/write-hold")
    async def write_hold(request: web.Request) -> web.Response:
        message = await read_body(request)
        release = node.reconfigure.release_hold
        return _reply(request, apply_write_hold(node.topology.identity, release, message))

    @routes.post("/v1/admin/followers")
    async def followers(request: web.Request) -> web.Response:
        order = learners.parse_followers(node.topology.identity, await read_body(request))
        return _reply(request, await learners.keep_followers(node, order))

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(node.registry), content_type="text/plain")

    async def close_session(app: web.Application) -> None:
        session = app.get(_SESSION_KEY)
        if session is not None:
            await session.close()

    node.registry.register(_Collector(node))
    app.on_cleanup.append(close_session)
    app.add_routes(routes)
    app.add_routes(operator_routes(node, read_body, int_param))
    return app


class _Collector:
    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["shard", "role"]
        last = GaugeMetricFamily(
            "kayos_shard_last_seq", "Durable last seq of the replica", labels=labels
        )
        committed = GaugeMetricFamily(
            "kayos_shard_committed_seq",
            "Seq durable on this replica and all below it",
            labels=labels,
        )
        size = GaugeMetricFamily(
            "kayos_shard_file_bytes", "Bytes of the shard's data file", labels=labels
        )
        lag = GaugeMetricFamily(
            "kayos_group_lag",
            "Last seq holding an entry minus the group's high-water mark",
            labels=["shard", "queue", "group"],
        )
        lag_seconds = GaugeMetricFamily(
            "kayos_group_lag_seconds",
            "Seconds since this replica took in the first seq past the group's high-water mark, "
            "by its time index (absent: unknown)",
            labels=["shard", "queue", "group"],
        )
        link_labels = ["shard", "peer", "direction"]
        link_up = GaugeMetricFamily(
            "kayos_link_up", "1 while the replication link is up, else 0", labels=link_labels
        )
        link_heard = GaugeMetricFamily(
            "kayos_link_last_heard_seconds",
            "Seconds since the link's peer was last heard from (absent: never)",
            labels=link_labels,
        )
        link_lag = GaugeMetricFamily(
            "kayos_link_lag_entries",
            "Seqs between this replica and the link's peer (downstream: not yet reported)",
            labels=link_labels,
        )
        rolled_back = CounterMetricFamily(
            "kayos_shard_rolled_back_entries",
            "Seqs the replica's rollbacks dropped since the node started",
            labels=labels,
        )
        refetched = CounterMetricFamily(
            "kayos_shard_refetched_entries",
            "Entries the replica copied in catch-up (a learner's or a repair's included)",
            labels=labels,
        )
        repairs = GaugeMetricFamily(
            "kayos_shard_repair",
            "1 while the replica repairs a damaged store (or reads met damage), else 0",
            labels=labels,
        )
        rolled_back_committed = CounterMetricFamily(
            "kayos_shard_rolled_back_committed_entries",
            "Of those, seqs at or below the commit point the replica knew (a bug if not 0)",
            labels=labels,
        )
        refused = CounterMetricFamily(
            "kayos_shard_refused_rollbacks",
            "Upstream orders to roll back below the known commit point that the replica refused",
            labels=labels,
        )
        now_s = self._node.clock.now_s()
        for shard_id, replica in self._node.replicas.items():
            for link in link_status(replica):
                link_key = [str(shard_id), link["peer"], link["direction"]]
                link_up.add_metric(link_key, 1 if link["up"] else 0)
                if link["last_heard_s"] is not None:
                    link_heard.add_metric(link_key, link["last_heard_s"])
                link_lag.add_metric(link_key, link["lag_entries"])
            key = [str(shard_id), str(replica.role)]
            last.add_metric(key, replica.durable)
            committed.add_metric(key, replica.commit_point)
            size.add_metric(key, replica.store.file_bytes())
            rolled_back.add_metric(key, replica.rolled_back_entries)
            rolled_back_committed.add_metric(key, replica.rolled_back_committed_entries)
            refused.add_metric(key, replica.refused_rollbacks)
            refetched.add_metric(key, replica.refetched_entries)
            repair = replica.repair_status()
            repairs.add_metric(key, 1 if repair and repair["state"] != "repaired" else 0)
            for name, hwm in replica.store.meta.items():
                if name.startswith(HWM_META) and isinstance(hwm, int):
                    queue, _, group = name[len(HWM_META) :].partition("/")
                    behind = max(0, replica.last_entry_seq - hwm)
                    lag.add_metric([str(shard_id), queue, group], behind)
                    since = lag_seconds_of(replica, hwm + 1 if behind else None, now_s)
                    if since is not None:
                        lag_seconds.add_metric([str(shard_id), queue, group], since)
        return [
            last,
            committed,
            size,
            lag,
            lag_seconds,
            link_up,
            link_heard,
            link_lag,
            rolled_back,
            rolled_back_committed,
            refused,
            refetched,
            repairs,
        ]


__all__ = [
    "GROUP_STATE_META",
    "int_param",
    "make_app",
    "parse_body",
    "parse_commit",
    "parse_consume",
    "parse_produce",
]
