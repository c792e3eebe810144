"""A node's HTTP face (aiohttp), per docs/node-api.md.

Handlers hold no logic: they parse the request (``kayos.node.http.bodies``), call ``Node``, and
map ``KayosError`` to the documented error reply. ``make_app`` registers the routes group by group
(the cluster's, a queue's, the reads, the manager's), then the operator's
(``kayos.node.http.operator_api``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from prometheus_client import generate_latest
from yarl import URL

from kayos import limits, tlsconfig
from kayos.errors import InvalidRequest, KayosError, UnavailableError, WrongRoleError
from kayos.node.http.bodies import (
    MSGPACK,
    error_reply,
    int_param,
    page_payload,
    parse_commit,
    parse_consume,
    parse_produce,
    read_body,
    reply,
    shard_param,
    shard_query,
)
from kayos.node.http.gate import credential_routes, make_gate
from kayos.node.http.lease_api import apply_lease, apply_write_hold
from kayos.node.http.metrics import Collector, Labelled, cluster_label
from kayos.node.http.operator_api import routes as operator_routes
from kayos.node.lag import group_lags
from kayos.node.replicas import learners
from kayos.node.runtime import Node
from kayos.signing import open_signed

_ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1}
_NODE_KEY = web.AppKey("node", Node)
_SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)


def make_app(node: Node) -> web.Application:
    """The node's aiohttp application: every route of docs/node-api.md, and its metrics."""

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except KayosError as exc:
            return error_reply(request, exc, node)

    # The gate runs inside ``errors``: a refusal is an error reply like any other.
    app = web.Application(
        middlewares=[errors, make_gate(node.access)], client_max_size=limits.http_body_bytes_max
    )
    app[_NODE_KEY] = node
    routes = web.RouteTableDef()
    # In this order: aiohttp matches a path against the routes in the order they were added.
    _cluster_routes(routes, node)
    _queue_routes(routes, node)
    _read_routes(routes, node)
    _manager_routes(routes, node)

    collector = Collector(node)
    node.registry.register(collector)

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        await collector.refresh()
        labels = {"node": node.node_id, "cluster": cluster_label(node.topology)}
        body = generate_latest(Labelled(node.registry, labels))
        return web.Response(body=body, content_type="text/plain")

    async def answer_watchers(app: web.Application) -> None:
        # Before the runner waits for handlers to end: a watcher must not hold a stop up.
        node.reconfigure.watch.close()

    app.on_shutdown.append(answer_watchers)
    app.on_cleanup.append(_close_session)
    app.add_routes(routes)
    app.add_routes(operator_routes(node, read_body, int_param))
    app.add_routes(credential_routes(node.access, read_body))
    return app


def _cluster_routes(routes: web.RouteTableDef, node: Node) -> None:
    """The topology the node holds, a new one offered to it, and its status."""

    @routes.get("/v1/topology")
    async def topology(request: web.Request) -> web.Response:
        after = int_param(request.query, "after", None)
        wait_ms = int_param(request.query, "wait_ms", None, high=limits.topology_watch_wait_ms_max)
        if wait_ms is not None and after is None:
            raise InvalidRequest("wait_ms needs after=<epoch>: it waits for a newer topology")
        if after is not None and wait_ms:
            await node.reconfigure.watch.wait_past(
                lambda: node.epoch,
                after,
                wait_ms / 1000,
                gone=lambda: request.transport is None or request.transport.is_closing(),
            )
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
        document = node.status()
        if request.query.get("groups") == "1":
            # The groups' lag takes a scan: only when asked (kayos ctl status), never in the
            # manager's polls.
            for lag in await group_lags(node.replicas, node.clock.now_s()):
                shard = document["shards"].get(str(lag.shard))
                if shard is not None:
                    shard.setdefault("groups", []).append(lag.to_json())
        return web.json_response(document)


def _queue_routes(routes: web.RouteTableDef, node: Node) -> None:
    """A queue's produce and consume, its groups' commits and deletes, and its retention."""

    @routes.post("/v1/queues/{queue}/messages")
    async def produce(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        # acks=all by default, as on every other path (docs/node-api.md, "Produce").
        acks = _ACKS.get(request.query.get("acks", "all"))
        if acks is None:
            raise InvalidRequest("acks must be 0, 1 or all")
        if len(node.topology.shards_for(queue)) == 1:  # else the keys name the shard
            await node.head_replica(queue)  # wrong role before reading a large body
        keys, values, expiries, headers = await read_body(request, parse_produce)
        first, last = await node.produce(queue, keys, values, expiries, headers, acks=acks)
        shard = node.topology.shard_for_batch(queue, keys)
        return reply(request, {"shard": shard, "first_seq": first, "last_seq": last})

    @routes.get("/v1/queues/{queue}/consume")
    async def consume(request: web.Request) -> web.Response:
        page = await node.consume(
            request.match_info["queue"],
            request.query.get("group", ""),
            **parse_consume(request.query),
            shard_id=shard_query(request.query),
        )
        return reply(request, page_payload(page, columns=request.query.get("columns") == "1"))

    @routes.post("/v1/queues/{queue}/groups/{group}/commit")
    async def commit_group(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        group = request.match_info["group"]
        hwm, state = await read_body(request, parse_commit)
        try:
            seq = await node.commit_group(queue, group, hwm, state, shard_query(request.query))
        except WrongRoleError as exc:
            # Any member takes a group commit and relays it to the head.
            return await _relay(node, request, exc, {"hwm": hwm, "state": state})
        return reply(request, {"hwm": hwm, "seq": seq})

    @routes.delete("/v1/queues/{queue}/groups/{group}")
    async def delete_group(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        group = request.match_info["group"]
        try:
            seq = await node.delete_group(queue, group, shard_query(request.query))
        except WrongRoleError as exc:
            return await _relay(node, request, exc, None)
        return reply(request, {"deleted": True, "seq": seq})

    @routes.put("/v1/queues/{queue}/retention")
    async def set_retention(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        shard_id = shard_query(request.query)
        await node.head_replica(queue, shard_id)  # wrong role before the body
        body = await read_body(request)
        return reply(request, await node.retention.set_policy(queue, body, shard_id))

    @routes.get("/v1/queues/{queue}/retention")
    async def get_retention(request: web.Request) -> web.Response:
        return reply(
            request,
            node.retention.get_policy(request.match_info["queue"], shard_query(request.query)),
        )


def _read_routes(routes: web.RouteTableDef, node: Node) -> None:
    """A shard's groups, one group's mark and lag, and a wait for a shard's commit point."""

    @routes.get("/v1/shards/{shard}/groups")
    async def list_groups(request: web.Request) -> web.Response:
        shard = shard_param(request)
        return reply(request, {"shard": shard, "groups": node.list_groups(shard)})

    @routes.get("/v1/queues/{queue}/groups/{group}")
    async def group_info(request: web.Request) -> web.Response:
        return reply(
            request,
            await node.group_info(
                request.match_info["queue"],
                request.match_info["group"],
                shard_query(request.query),
            ),
        )

    @routes.get("/v1/shards/{shard}/committed")
    async def committed(request: web.Request) -> web.Response:
        shard = shard_param(request)
        seq = int_param(request.query, "seq", 0) or 0
        timeout_ms = int_param(request.query, "timeout_ms", 0) or 0
        value = await node.wait_committed(shard, seq, timeout_ms)
        return reply(request, {"shard": shard, "committed_seq": value})


def _manager_routes(routes: web.RouteTableDef, node: Node) -> None:
    """The cluster manager's signed orders (catch-ups, leases, write holds, followers) and its
    watch."""

    @routes.post("/v1/admin/catch-up")
    async def catch_up(request: web.Request) -> web.Response:
        order = learners.parse_catch_up(node.topology.identity, await read_body(request))
        return reply(request, await learners.start_catch_up(node, order))

    @routes.post("/v1/admin/lease")
    async def lease(request: web.Request) -> web.Response:
        message = await read_body(request)
        return reply(request, apply_lease(node.topology.identity, node.lease, node.epoch, message))

    @routes.post("/v1/admin/write-hold")
    async def write_hold(request: web.Request) -> web.Response:
        message = await read_body(request)
        release = node.reconfigure.release_hold
        return reply(request, apply_write_hold(node.topology.identity, release, message))

    @routes.get("/v1/admin/watch")
    async def watch(request: web.Request) -> web.StreamResponse:
        return await node.watches.serve(request)

    @routes.post("/v1/admin/secrets")
    async def secrets(request: web.Request) -> web.Response:
        message = await read_body(request)
        open_signed(node.topology.identity, "secrets", message, frozenset({"node"}))
        return reply(request, await asyncio.to_thread(node.reload_secrets))

    @routes.post("/v1/admin/followers")
    async def followers(request: web.Request) -> web.Response:
        order = learners.parse_followers(node.topology.identity, await read_body(request))
        return reply(request, await learners.keep_followers(node, order))


async def _relay(
    node: Node, request: web.Request, exc: WrongRoleError, body: dict[str, Any] | None
) -> web.Response:
    """A group commit or delete that reached a member other than the head, sent on to the head
    (once: a relayed request is never relayed again); the head's answer is the reply."""
    head = node.topology.nodes.get(exc.redirect or "")
    if head is None or request.headers.get("X-Kayos-Relayed"):
        raise exc
    app = request.app
    session = app.get(_SESSION_KEY)
    if session is None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tlsconfig.http_ssl()))
        app[_SESSION_KEY] = session
    # The raw path and query as the client sent them: its proof covers exactly those bytes.
    url = URL(f"{head.http_url}{request.raw_path}", encoded=True)
    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK, "X-Kayos-Relayed": "1"}
    proof = request.headers.get("Authorization")
    if proof is not None:  # the head checks the client's own proof (same method, path, query)
        headers["Authorization"] = proof
    try:
        async with session.request(
            request.method,
            url,
            data=None if body is None else msgpack.packb(body, use_bin_type=True),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=limits.produce_commit_timeout_ms / 1000 + 5),
        ) as response:
            payload = msgpack.unpackb(await response.read(), raw=False)
            return reply(request, payload, response.status)
    except (aiohttp.ClientError, TimeoutError, ValueError) as relay_error:
        raise UnavailableError(f"cannot reach the head {head.id}: {relay_error}") from exc


async def _close_session(app: web.Application) -> None:
    session = app.get(_SESSION_KEY)
    if session is not None:
        await session.close()
