"""The manager members' HTTP face (docs/manager.md, "HTTP endpoints").

``GET /v1/manager/status`` and ``GET /v1/manager/changes`` on any member;
``POST /v1/manager/remove-node`` (signed, purpose ``remove-node``), ``POST /v1/manager/operator``
(signed, purpose ``operator``: add-node, drain, move-shard, rebalance), ``POST
/v1/manager/suspect`` (unsigned: a report that makes the leader probe a node) and ``POST
/v1/manager/exited`` (signed, purpose ``exited``: a supervisor's report) on the leader, a follower
answering 421 ``not_leader`` with the leader's URL. ``GET /metrics`` (open) on any member: its own
counters (the refusals its door counted).
Errors are the node API's error body: ``{"error": {"code", "message", "redirect"}}``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from kayos import limits
from kayos.errors import InvalidRequest, KayosError, NotLeaderError, UnavailableError
from kayos.manager import (
    Action,
    AddNode,
    Drain,
    Event,
    ManagerView,
    MoveReplica,
    OperatorEvent,
    Rebalance,
    RemoveNode,
    SetQueueShards,
    check_event,
    check_incarnation,
)
from kayos.manager.member.config import ManagerSetup
from kayos.manager.member.gate import ManagerDoor, make_gate
from kayos.manager.restore import restore_status
from kayos.signing import check_signed, open_signed
from kayos.topology import Topology

STATUS_FOR_CODE = {
    "invalid_request": 400,
    "unauthenticated": 401,
    "forbidden": 403,
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
    changes: Callable[[], tuple[list[dict[str, Any]], int]]
    leader: Callable[[], str | None]
    term: Callable[[], int]
    ready: Callable[[], bool]
    submit: Callable[[list[Event]], Awaitable[tuple[ManagerView, tuple[Action, ...]]]]
    # Sends what an operator entry's actions ask for (a move's catch-up order, a new topology)
    # at once, without waiting for it (the leader's driver, ``Member.send_actions``); the
    # driver's next polling round would send them otherwise.
    send_actions: Callable[[ManagerView, tuple[Action, ...]], None] = lambda _view, _actions: None
    # The leading driver's probe of a reported node (whether one was started) and its logging of
    # a supervisor's exit report (the view after it); None on a member whose driver is not
    # running (a follower, or a leader between two drivers).
    suspect: Callable[[str], bool | None] = lambda _node: None
    exited: Callable[[str, str], Awaitable[ManagerView] | None] = lambda _node, _inc: None
    # Reads the member's secrets from its file again (docs/security.md); their prints.
    reload_secrets: Callable[[], dict[str, Any]] | None = None


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
        # Rule 10: replacements running and short shards with the reason none runs.
        "restore": restore_status(view),
    }


def error_response(exc: KayosError) -> web.Response:
    redirect = exc.redirect if isinstance(exc, NotLeaderError) else None
    body = {"error": {"code": exc.code, "message": str(exc), "redirect": redirect}}
    return web.json_response(body, status=STATUS_FOR_CODE.get(exc.code, 500))


def make_app(state: MemberState, door: ManagerDoor | None = None) -> web.Application:
    """The member's routes; ``door`` checks each request's credential (docs/security.md)."""
    middlewares = [] if door is None else [make_gate(door, error_response)]
    app = web.Application(client_max_size=REQUEST_BYTES_MAX, middlewares=middlewares)
    routes = web.RouteTableDef()

    @routes.get("/v1/manager/status")
    async def status(request: web.Request) -> web.Response:
        return web.json_response(status_body(state))

    @routes.get("/v1/manager/changes")
    async def changes(request: web.Request) -> web.Response:
        kept, dropped = state.changes()
        view, _ = state.view()
        body = {"member": state.member, "epoch": view.epoch, "dropped": dropped, "changes": kept}
        return web.json_response(body)

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

    @routes.post("/v1/manager/secrets")
    async def secrets(request: web.Request) -> web.Response:
        try:
            message = await request.json()
            open_signed(state.setup.identity, "secrets", message, frozenset({"node"}))
            if state.reload_secrets is None:
                raise InvalidRequest("this member cannot reload its secrets")
            prints = await asyncio.to_thread(state.reload_secrets)
        except KayosError as exc:
            return error_response(exc)
        except ValueError:
            return error_response(InvalidRequest("the body is not JSON"))
        return web.json_response(prints)

    @routes.post("/v1/manager/operator")
    async def operator(request: web.Request) -> web.Response:
        try:
            body = await _signed_body(request, state, "operator")
            _check_leader(state)
            event = operator_event(body, state.view()[0], state.setup.topology)
            view, actions = await state.submit([event])
        except KayosError as exc:
            return error_response(exc)
        state.send_actions(view, actions)
        reply = {"op": body["op"], "epoch": view.epoch, **progress(view)}
        if isinstance(event, SetQueueShards):
            reply["queue"] = event.queue
            reply["shards"] = queue_shard_count(view, state.setup.topology, event.queue)
        return web.json_response(reply)

    # The member's own counters (docs/manager.md, "HTTP endpoints"): open, as a node's.
    registry = door.registry if door is not None else CollectorRegistry()

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    _report_routes(routes, state)
    app.add_routes(routes)
    return app


def _report_routes(routes: web.RouteTableDef, state: MemberState) -> None:
    """Reports that a node may be gone: anyone's (``suspect``: the leader probes) and a
    supervisor's signed exit report (``exited``: proof, logged at once)."""

    @routes.post("/v1/manager/suspect")
    async def suspect(request: web.Request) -> web.Response:
        try:
            node = _reported_node(await _json_body(request), state)
            _check_leader(state)
            probed = state.suspect(node)
            if probed is None:
                raise UnavailableError("the leader's driver is starting; report again")
        except KayosError as exc:
            return error_response(exc)
        return web.json_response({"node": node, "probe": probed}, status=202)

    @routes.post("/v1/manager/exited")
    async def exited(request: web.Request) -> web.Response:
        try:
            body = await _signed_body(request, state, "exited")
            node = _reported_node(body, state)
            incarnation = body.get("incarnation")
            if not isinstance(incarnation, str):
                raise InvalidRequest("exited: incarnation must be a string")
            check_incarnation(incarnation)
            _check_leader(state)
            logged = state.exited(node, incarnation)
            if logged is None:
                raise UnavailableError("the leader's driver is starting; report again")
            view = await logged
        except KayosError as exc:
            return error_response(exc)
        found = view.node(node)
        return web.json_response(
            {"node": node, "state": found.state if found else None, "epoch": view.epoch}
        )


def _reported_node(body: Any, state: MemberState) -> str:
    """The node a report names: one the view holds."""
    node = body.get("node") if isinstance(body, dict) else None
    if not isinstance(node, str) or state.view()[0].node(node) is None:
        raise InvalidRequest(f"unknown node {node!r:.80}")
    return node


async def _json_body(request: web.Request) -> Any:
    try:
        raw = await request.read()
        return json.loads(raw)
    except web.HTTPRequestEntityTooLarge as exc:
        raise InvalidRequest(f"a request is at most {REQUEST_BYTES_MAX} bytes") from exc
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"not a JSON body: {exc}") from exc


def progress(view: ManagerView) -> dict[str, Any]:
    """What an operator's long request waits on: pending moves, draining nodes, blocked drains."""
    moves = [
        {"shard": s.id, "source": src, "target": dst, "joined": dst in s.chain}
        for s in view.shards
        for dst, src in s.moves
    ]
    counts: dict[str, int] = {}
    for shard in view.shards:
        for member in shard.chain:
            counts[member] = counts.get(member, 0) + 1
    blocked = [{"shard": a.shard, "node": a.node} for a in view.alerts if a.kind == "drain_blocked"]
    return {
        "moves": moves,
        "draining": list(view.draining),
        "drain_blocked": blocked,
        "replicas": {n.id: counts.get(n.id, 0) for n in view.nodes if n.state != "removed"},
    }


def progress_of_status(status: dict[str, Any]) -> dict[str, Any]:
    """``progress`` of the view in a ``GET /v1/manager/status`` reply (for kayos ctl)."""
    view = ManagerView.from_data(status["view"])
    return {"epoch": view.epoch, **progress(view)}


def operator_event(
    body: dict[str, Any], view: ManagerView, base: Topology | None = None
) -> OperatorEvent:
    """The event an operator's signed body asks for. The body names the view's epoch it was made
    against, so a replayed request is refused once anything changed (docs/manager.md). ``base``:
    the topology file (a queue's shard count when the view sets none)."""
    if body.get("epoch") != view.epoch:
        raise InvalidRequest(
            f"stale_epoch: the request names epoch {body.get('epoch')!r:.20},"
            f" the view is at {view.epoch}"
        )
    op = body.get("op")
    event: OperatorEvent
    if op == "add-node":
        event = AddNode(
            _field(body, "node", str),
            _field(body, "host", str),
            _field(body, "http_port", int),
            _field(body, "bin_port", int),
        )
        if view.node(event.node) is not None:
            raise InvalidRequest(f"node {event.node!r} is already known")
    elif op == "drain":
        event = Drain(_field(body, "node", str))
        _known(view, event.node)
    elif op == "move-shard":
        event = MoveReplica(
            _field(body, "shard", int), _field(body, "source", str), _field(body, "target", str)
        )
        _check_move(view, event)
    elif op == "rebalance":
        event = Rebalance()
    elif op in ("queue-create", "queue-alter"):
        event = SetQueueShards(_field(body, "queue", str), _field(body, "shards", int))
        check_event(event)
        _check_queue(view, base, event, create=op == "queue-create")
    else:
        raise InvalidRequest(f"unknown operator op {op!r:.40}")
    check_event(event)
    return event


def _field(body: dict[str, Any], name: str, kind: type[Any]) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidRequest(f"operator request field {name!r} must be a {kind.__name__}")
    return value


def _known(view: ManagerView, node: str) -> None:
    found = view.node(node)
    if found is None or found.state == "removed":
        raise InvalidRequest(f"unknown node {node!r:.80}")


def _check_move(view: ManagerView, move: MoveReplica) -> None:
    """Refuses, with the reason, a move decide would ignore (decide stays silent: a logged event
    may be stale; an operator's fresh request deserves an answer)."""
    shard = view.shard(move.shard)
    if shard is None:
        raise InvalidRequest(f"unknown shard {move.shard}")
    _known(view, move.target)
    if shard.moves == ((move.target, move.source),):
        return  # the same move asked again (kayos ctl re-run after Ctrl-C): it goes on as it is
    if move.source not in shard.chain:
        raise InvalidRequest(f"{move.source} holds no replica of shard {move.shard}")
    if move.target in shard.chain:
        raise InvalidRequest(f"{move.target} already holds shard {move.shard}")
    if shard.moves:
        raise InvalidRequest(
            f"shard {move.shard} is already moving ({shard.moves[0][1]} -> {shard.moves[0][0]})"
        )
    target = view.node(move.target)
    if target is None or target.state != "up" or move.target in view.draining:
        raise InvalidRequest(f"{move.target} is not up, or is draining")


def queue_shard_count(view: ManagerView, base: Topology | None, queue: str) -> int:
    """The queue's shard count as published: the view's, else the file's entry or default."""
    count = view.queue_shards(queue)
    if count is not None:
        return count
    return base.queue_shard_count(queue) if base is not None else 1


def _check_queue(
    view: ManagerView, base: Topology | None, event: SetQueueShards, *, create: bool
) -> None:
    """Refuses, with the reason, a queue change decide would ignore or that makes no sense."""
    if event.shards > len(view.shards):
        raise InvalidRequest(
            f"queue {event.queue!r}: {event.shards} shards asked, the cluster has "
            f"{len(view.shards)} (a queue's shard count is 1 .. {len(view.shards)})"
        )
    named = view.queue_shards(event.queue) is not None or (
        base is not None and event.queue in base.queues
    )
    current = queue_shard_count(view, base, event.queue)
    if create and named:
        raise InvalidRequest(
            f"queue {event.queue!r} already exists with {current} shard(s): use queue alter"
        )
    if not create and event.shards <= current:
        raise InvalidRequest(
            f"queue {event.queue!r} has {current} shard(s) today; {event.shards} would not add "
            "any: a queue's shard count never goes down (the dropped shards' entries and marks "
            "would be read by no one)"
        )


def _check_leader(state: MemberState) -> None:
    leader = state.leader()
    if leader != state.member:
        url = next((m.http_url for m in state.setup.members if m.id == leader), None)
        raise NotLeaderError(f"member {state.member} does not lead", redirect=url)


async def _signed_body(request: web.Request, state: MemberState, purpose: str) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise InvalidRequest(f"a request is at most {REQUEST_BYTES_MAX} bytes") from exc
    try:
        if request.content_type == "application/msgpack":
            message = msgpack.unpackb(raw, raw=False)
        else:
            message = json.loads(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidRequest(f"not a JSON or msgpack body: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("body"), dict):
        raise InvalidRequest('expected {"body": {...}, "mac": hex}')
    check_signed(state.setup.identity, purpose, message["body"], message.get("mac"))
    body: dict[str, Any] = message["body"]
    return body


async def _checked_remove(request: web.Request, state: MemberState) -> str:
    body = await _signed_body(request, state, "remove-node")
    node = body.get("node")
    # A node of the view: one of the file's or one an operator added at runtime (add-node). A
    # removed one stays known (removing it again answers as before: nothing changes).
    if not isinstance(node, str) or state.view()[0].node(node) is None:
        raise InvalidRequest(f"unknown node {node!r:.80}")
    return node
