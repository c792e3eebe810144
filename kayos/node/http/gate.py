"""The HTTP face's door (docs/security.md): every request is checked against
``kayos.auth.rules.HTTP_RULES`` before its handler runs, and a refused one changes nothing; and
the routes that read and replace the node's credentials table.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kayos.auth.rules import http_rule
from kayos.node.access import Access, certificate_subject, parse_pushed_table, refusal_error


def make_gate(access: Access) -> Any:
    """The middleware that checks each request's credential against its route's rule."""

    @web.middleware
    async def gate(request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.resource
        if route is None:  # no such route: the 404 says nothing and changes nothing
            response: web.StreamResponse = await handler(request)
            return response
        rule = http_rule(request.method, route.canonical)
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        verdict = access.check_http(
            rule,
            request.match_info.get("queue"),
            request.method,
            request.raw_path,
            request.headers.get("Authorization"),
            certificate_subject(peercert),
            request.remote,
        )
        if not verdict.allowed:
            raise refusal_error(verdict)
        response = await handler(request)
        return response

    return gate


def credential_routes(access: Access, read_body: Any) -> web.RouteTableDef:
    """``GET`` and ``POST /v1/admin/credentials`` (admin role, by the table)."""
    table = web.RouteTableDef()

    @table.get("/v1/admin/credentials")
    async def get_table(request: web.Request) -> web.Response:
        return web.json_response(access.table.to_json())

    @table.post("/v1/admin/credentials")
    async def push_table(request: web.Request) -> web.Response:
        pushed = parse_pushed_table(await read_body(request))
        applied = access.install(pushed)
        return web.json_response({"version": access.table.version, "applied": applied})

    return table
