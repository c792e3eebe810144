"""A node's HTTP face (aiohttp), per docs/node-api.md.

Handlers hold no logic: they parse the request (JSON, or msgpack for the client), call ``Node``,
and map ``KayosError`` to the documented error reply. Replies are msgpack when the request's
``Accept`` asks for it, JSON otherwise (keys and values as UTF-8 text).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily

from kayos import limits
from kayos.errors import (
    InvalidRequest,
    KayosError,
    LimitExceeded,
    ProtocolError,
    UnavailableError,
    WrongRoleError,
)
from kayos.node.runtime import GROUP_STATE_META, HWM_META, Node, Page

MSGPACK = "application/msgpack"

STATUS_FOR_CODE = {
    "invalid_request": 400,
    "protocol_error": 400,
    "limit_exceeded": 413,
    "wrong_role": 421,
    "timeout": 504,
    "unavailable": 503,
    "disk_full": 507,
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
    return _reply(request, payload, STATUS_FOR_CODE.get(exc.code, 500))


async def read_body(request: web.Request) -> Any:
    raw = await request.read()
    if request.content_type == MSGPACK:
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except (ValueError, msgpack.UnpackException, TypeError) as exc:
            raise ProtocolError(f"malformed msgpack body: {exc}") from exc
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed JSON body: {exc}") from exc


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise InvalidRequest(f"{what} must be a string or bytes")


def parse_produce(
    body: Any,
) -> tuple[list[bytes], list[bytes | None], list[int] | None, list[dict[str, bytes] | None] | None]:
    if not isinstance(body, dict):
        raise InvalidRequest("body must be an object with a 'messages' list")
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
        if not isinstance(message, dict):
            raise InvalidRequest("each message must be an object")
        keys.append(_as_bytes(message.get("key"), "key"))
        value = message.get("value")
        values.append(None if value is None else _as_bytes(value, "value"))
        expiry = message.get("expiry_ms", 0)
        if not isinstance(expiry, int) or isinstance(expiry, bool) or expiry < 0:
            raise InvalidRequest("expiry_ms must be a non-negative integer")
        expiries.append(expiry)
        raw_headers = message.get("headers")
        if raw_headers is None:
            headers.append(None)
        elif isinstance(raw_headers, dict) and all(isinstance(k, str) for k in raw_headers):
            headers.append({k: _as_bytes(v, "header value") for k, v in raw_headers.items()})
        else:
            raise InvalidRequest("headers must map names to strings")
    return (
        keys,
        values,
        expiries if any(expiries) else None,
        headers if any(h is not None for h in headers) else None,
    )


def _int_param(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise InvalidRequest(f"{name} must be an integer") from exc
    if value < 0:
        raise InvalidRequest(f"{name} must be >= 0")
    return value


def _shard_param(request: web.Request) -> int:
    try:
        return int(request.match_info["shard"])
    except ValueError as exc:
        raise InvalidRequest("shard must be an integer") from exc


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
        return web.json_response(node.topology.to_json())

    @routes.get("/v1/status")
    async def status(request: web.Request) -> web.Response:
        return web.json_response(node.status())

    @routes.post("/v1/queues/{queue}/messages")
    async def produce(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        acks = _ACKS.get(request.query.get("acks", "1"))
        if acks is None:
            raise InvalidRequest("acks must be 0, 1 or all")
        node.replica_for(queue, want="head")  # wrong role before reading a large body
        keys, values, expiries, headers = parse_produce(await read_body(request))
        first, last = await node.produce(queue, keys, values, expiries, headers, acks=acks)
        shard = node.topology.shard_for(queue)
        return _reply(request, {"shard": shard, "first_seq": first, "last_seq": last})

    @routes.get("/v1/queues/{queue}/consume")
    async def consume(request: web.Request) -> web.Response:
        page = await node.consume(
            request.match_info["queue"],
            request.query.get("group", ""),
            after=_int_param(request, "after", None),
            upto=_int_param(request, "upto", None),
            limit=_int_param(request, "limit", 1000) or 1,
            wait_ms=_int_param(request, "wait_ms", 0) or 0,
        )
        return _reply(request, page_payload(page, columns=request.query.get("columns") == "1"))

    @routes.post("/v1/queues/{queue}/groups/{group}/commit")
    async def commit_group(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        group = request.match_info["group"]
        body = await read_body(request)
        hwm = body.get("hwm") if isinstance(body, dict) else None
        if not isinstance(hwm, int) or isinstance(hwm, bool):
            raise InvalidRequest("body must be {'hwm': <integer>}")
        raw_state = body.get("state")
        state = None if raw_state is None else _as_bytes(raw_state, "state")
        try:
            seq = await node.commit_group(queue, group, hwm, state)
        except WrongRoleError as exc:
            # Any member takes a group commit and relays it to the head.
            return await _relay(request, exc, {"hwm": hwm, "state": state})
        return _reply(request, {"hwm": hwm, "seq": seq})

    @routes.delete("/v1/queues/{queue}/groups/{group}")
    async def delete_group(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        group = request.match_info["group"]
        try:
            seq = await node.delete_group(queue, group)
        except WrongRoleError as exc:
            return await _relay(request, exc, None)
        return _reply(request, {"deleted": True, "seq": seq})

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
            request, node.group_info(request.match_info["queue"], request.match_info["group"])
        )

    @routes.get("/v1/shards/{shard}/committed")
    async def committed(request: web.Request) -> web.Response:
        shard = _shard_param(request)
        seq = _int_param(request, "seq", 0) or 0
        timeout_ms = _int_param(request, "timeout_ms", 0) or 0
        value = await node.wait_committed(shard, seq, timeout_ms)
        return _reply(request, {"shard": shard, "committed_seq": value})

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
    return app


class _Collector:
    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> list[GaugeMetricFamily]:
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
        for shard_id, replica in self._node.replicas.items():
            key = [str(shard_id), str(replica.role)]
            last.add_metric(key, replica.durable)
            committed.add_metric(key, replica.commit_point)
            size.add_metric(key, replica.store.file_bytes())
            for name, hwm in replica.store.meta.items():
                if name.startswith(HWM_META) and isinstance(hwm, int):
                    queue, _, group = name[len(HWM_META) :].partition("/")
                    behind = max(0, replica.last_entry_seq - hwm)
                    lag.add_metric([str(shard_id), queue, group], behind)
        return [last, committed, size, lag]


__all__ = ["GROUP_STATE_META", "make_app"]
