"""The manager members' HTTP face (docs/manager.md, "HTTP endpoints").

``GET /v1/manager/status`` on any member; ``POST /v1/manager/remove-node`` (signed, purpose
``remove-node``) on the leader, a follower answering 421 ``not_leader`` with the leader's URL.
Errors are the node API's error body: ``{"error": {"code", "message", "redirect"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from aiohttp import web

from kayos import limits
from kayos.control.config import ManagerSetup
from kayos.errors import InvalidRequest, KayosError, NotLeaderError
from kayos.manager import Action, Event, ManagerView, RemoveNode
from kayos.signing import check_signed

STATUS_FOR_CODE = {
    "invalid_request": 400,
    "unauthenticated": 401,
    "limit_exceeded": 413,
    "not_leader": 421,
    "timeout": 504,
    "unavailable": 503,
}
REQUEST_BYTES_MAX = limits.manager_request_bytes_max


@dataclass(slots=True)
class MemberState:
    """What the face reads from the member: functions, so it always sees the current state."""

    member: str
    setup: ManagerSetup
    view: Callable[[], tuple[ManagerView, str]]
    hashes: Callable[[], tuple[int, list[tuple[int, str]]]]
    leader: Callable[[], str | None]
    term: Callable[[], int]
    ready: Callable[[], bool]
    submit: Callable[[list[Event]], Awaitable[tuple[ManagerView, tuple[Action, ...]]]]


def status_body(state: MemberState) -> dict[str, Any]:
    view, digest = state.view()
    applied, recent = state.hashes()
    leader = state.leader()
    urls = {m.id: m.http_url for m in state.setup.members}
    return {
        "member": state.member,
        "leader": leader,
        "leader_url": urls.get(leader) if leader else None,
        "members": urls,
        "term": state.term(),
        "ready": state.ready(),
        "epoch": view.epoch,
        "view": view.to_data(),
        "view_hash": digest,
        "applied_entries": applied,
        "recent_hashes": [list(pair) for pair in recent],
        "alerts": [{"kind": a.kind, "shard": a.shard, "node": a.node} for a in view.alerts],
    }


def error_response(exc: KayosError) -> web.Response:
    redirect = exc.redirect if isinstance(exc, NotLeaderError) else None
    body = {"error": {"code": exc.code, "message": str(exc), "redirect": redirect}}
    return web.json_response(body, status=STATUS_FOR_CODE.get(exc.code, 500))


def make_app(state: MemberState) -> web.Application:
    app = web.Application(client_max_size=REQUEST_BYTES_MAX)
    routes = web.RouteTableDef()

    @routes.get("/v1/manager/status")
    async def status(request: web.Request) -> web.Response:
        return web.json_response(status_body(state))

    @routes.post("/v1/manager/remove-node")
    async def remove_node(request: web.Request) -> web.Response:
        try:
            node = await _checked_remove(request, state)
            leader = state.leader()
            if leader != state.member:
                url = next((m.http_url for m in state.setup.members if m.id == leader), None)
                raise NotLeaderError(f"member {state.member} does not lead", redirect=url)
            view, _ = await state.submit([RemoveNode(node)])
        except KayosError as exc:
            return error_response(exc)
        found = view.node(node)
        return web.json_response(
            {"node": node, "state": found.state if found else None, "epoch": view.epoch}
        )

    app.add_routes(routes)
    return app


async def _checked_remove(request: web.Request, state: MemberState) -> str:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise InvalidRequest(f"a remove-node request is at most {REQUEST_BYTES_MAX} bytes") from exc
    try:
        if request.content_type == "application/msgpack":
            message = msgpack.unpackb(raw, raw=False)
        else:
            message = json.loads(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidRequest(f"not a JSON or msgpack body: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("body"), dict):
        raise InvalidRequest('expected {"body": {"node": id}, "mac": hex}')
    check_signed(state.setup.identity, "remove-node", message["body"], message.get("mac"))
    node = message["body"].get("node")
    if not isinstance(node, str) or node not in state.setup.topology.nodes:
        raise InvalidRequest(f"unknown node {node!r:.80}")
    return node
