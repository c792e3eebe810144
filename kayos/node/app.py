"""A node's HTTP face (aiohttp): produce, consume snapshots, commit high-water marks, metrics.

This is the single-node stage: every queue is one shard store on this node (replication factor 1).
Chain replication adds roles and redirects on top of the same routes. Handlers hold no logic: they
parse, call the store in a worker thread, and map ``KayosError`` to a JSON error reply.

Routes (JSON bodies; keys and values are UTF-8 strings):
- ``POST /v1/queues/{queue}/messages`` with
  ``{"messages": [{"key", "value", "expiry_ms"?}], "delete"?: [keys]}``
  -> ``{"first_seq", "last_seq"}``; the batch is all-or-nothing and durable on return.
- ``GET /v1/queues/{queue}/consume?group=G&limit=N[&after=S&upto=B]`` -> the next page of the
  group's snapshot
  ``(hwm, boundary]``: ``{"messages": [...], "hwm", "boundary", "next_hwm", "end"}``; ``end`` true
  is the boundary marker.
- ``POST /v1/queues/{queue}/groups/{group}/commit`` ``{"hwm": N}`` -> ``{"hwm": N}``.
- ``GET /v1/queues/{queue}/groups/{group}`` -> ``{"hwm", "last_seq", "lag"}``.
- ``GET /v1/status``, ``GET /metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from kayos import limits
from kayos.errors import InvalidRequest, KayosError, LimitExceeded
from kayos.storage import Delete, Put, ShardStore

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_HWM_PREFIX = "hwm/"

_STATUS_FOR = {
    "invalid_request": 400,
    "limit_exceeded": 413,
    "protocol_error": 400,
    "wrong_role": 421,
    "disk_full": 507,
    "timeout": 504,
    "unavailable": 503,
}


class Node:
    """Owns the shard stores of one node's data directory."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self._stores: dict[str, ShardStore] = {}
        self._lock = threading.Lock()
        os.makedirs(os.path.join(data_dir, "queues"), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(data_dir, "queues"))):
            if QUEUE_NAME.match(name):
                self.store(name)

    def store(self, queue: str) -> ShardStore:
        if not QUEUE_NAME.match(queue):
            raise InvalidRequest(f"bad queue name {queue!r}: use 1-128 of A-Z a-z 0-9 _ -")
        with self._lock:
            found = self._stores.get(queue)
            if found is None:
                found = ShardStore.open(os.path.join(self.data_dir, "queues", queue))
                self._stores[queue] = found
            return found

    def queues(self) -> dict[str, ShardStore]:
        with self._lock:
            return dict(self._stores)

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()


def _text(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidRequest(f"{what} must be a string")
    return value.encode()


def parse_produce(body: Any) -> list[Put | Delete]:
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    messages = body.get("messages", [])
    deletes = body.get("delete", [])
    if not isinstance(messages, list) or not isinstance(deletes, list):
        raise InvalidRequest("messages and delete must be lists")
    if len(messages) + len(deletes) > limits.batch_entries_max:
        raise LimitExceeded(f"batch exceeds {limits.batch_entries_max} entries")
    ops: list[Put | Delete] = []
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidRequest("each message must be an object")
        expiry = message.get("expiry_ms", 0)
        if not isinstance(expiry, int) or expiry < 0:
            raise InvalidRequest("expiry_ms must be a non-negative integer")
        ops.append(
            Put(_text(message.get("key"), "key"), _text(message.get("value"), "value"), expiry)
        )
    ops.extend(Delete(_text(key, "key")) for key in deletes)
    if not ops:
        raise InvalidRequest("empty batch")
    return ops


def _error_reply(exc: KayosError) -> web.Response:
    status = _STATUS_FOR.get(exc.code, 500)
    return web.json_response({"error": exc.code, "message": str(exc)}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except KayosError as exc:
        return _error_reply(exc)


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from exc


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidRequest(f"{name} must be an integer") from exc


def _group_name(raw: str) -> str:
    if not QUEUE_NAME.match(raw):
        raise InvalidRequest(f"bad group name {raw!r}")
    return raw


def make_app(node: Node) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=limits.batch_bytes_max * 2)
    routes = web.RouteTableDef()

    @routes.post("/v1/queues/{queue}/messages")
    async def produce(request: web.Request) -> web.Response:
        store = node.store(request.match_info["queue"])
        ops = parse_produce(await _json_body(request))
        result = await asyncio.to_thread(store.commit, ops)
        return web.json_response({"first_seq": result.first_seq, "last_seq": result.last_seq})

    @routes.get("/v1/queues/{queue}/consume")
    async def consume(request: web.Request) -> web.Response:
        store = node.store(request.match_info["queue"])
        group = _group_name(request.query.get("group", ""))
        limit = max(1, min(_int_param(request, "limit", 1000), limits.scan_page_entries_max))
        hwm = int(store.meta.get(_HWM_PREFIX + group, 0))
        after = max(hwm, _int_param(request, "after", hwm))
        upto = _int_param(request, "upto", -1)
        page = await asyncio.to_thread(_read_page, store, hwm, after, upto, limit)
        return web.json_response(page)

    @routes.post("/v1/queues/{queue}/groups/{group}/commit")
    async def commit_hwm(request: web.Request) -> web.Response:
        store = node.store(request.match_info["queue"])
        group = _group_name(request.match_info["group"])
        body = await _json_body(request)
        hwm = body.get("hwm") if isinstance(body, dict) else None
        if not isinstance(hwm, int) or hwm < 0 or hwm > store.last_seq:
            raise InvalidRequest(f"hwm must be an integer in [0, {store.last_seq}]")
        await asyncio.to_thread(store.commit, [], meta={_HWM_PREFIX + group: hwm})
        return web.json_response({"hwm": hwm})

    @routes.get("/v1/queues/{queue}/groups/{group}")
    async def group_state(request: web.Request) -> web.Response:
        store = node.store(request.match_info["queue"])
        group = _group_name(request.match_info["group"])
        hwm = int(store.meta.get(_HWM_PREFIX + group, 0))
        return web.json_response(
            {"hwm": hwm, "last_seq": store.last_seq, "lag": store.last_seq - hwm}
        )

    @routes.get("/v1/status")
    async def status(request: web.Request) -> web.Response:
        queues = {name: store.stats() for name, store in node.queues().items()}
        return web.json_response({"role": "single", "replication_factor": 1, "queues": queues})

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        registry.register(_Collector(node))
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app.add_routes(routes)
    return app


def _read_page(store: ShardStore, hwm: int, after: int, upto: int, limit: int) -> dict[str, Any]:
    """One page of ``(after, boundary]``; a consumer paging through one snapshot passes the
    boundary of its first page as ``upto`` so later commits wait for its next snapshot."""
    with store.snapshot() as snapshot:
        boundary = snapshot.boundary if upto < 0 else min(upto, snapshot.boundary)
        entries = next(snapshot.pages(after, boundary, page_entries=limit), [])
    messages = [
        {
            "seq": entry.seq,
            "key": entry.key.decode(errors="replace"),
            "value": None if entry.value is None else entry.value.decode(errors="replace"),
            "deleted": entry.deleted,
        }
        for entry in entries
    ]
    next_hwm = entries[-1].seq if len(entries) == limit else boundary
    return {
        "messages": messages,
        "hwm": hwm,
        "boundary": boundary,
        "next_hwm": next_hwm,
        "end": next_hwm >= boundary,
    }


class _Collector:
    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> list[GaugeMetricFamily]:
        last = GaugeMetricFamily("kayos_last_seq", "Highest committed seq", labels=["queue"])
        size = GaugeMetricFamily("kayos_file_bytes", "Bytes of the data file", labels=["queue"])
        lag = GaugeMetricFamily("kayos_group_lag", "last_seq - hwm", labels=["queue", "group"])
        for name, store in self._node.queues().items():
            last.add_metric([name], store.last_seq)
            size.add_metric([name], store.file_bytes())
            for meta_key, hwm in store.meta.items():
                if meta_key.startswith(_HWM_PREFIX):
                    lag.add_metric([name, meta_key[len(_HWM_PREFIX) :]], store.last_seq - hwm)
        return [last, size, lag]
