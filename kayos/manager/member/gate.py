"""A manager member's door (docs/security.md, "Roles"): its routes are checked against
``kayos.auth.rules.HTTP_RULES`` like a node's. The member keeps no credentials table of its own:
it reads the nodes' (``GET /v1/admin/credentials`` as ``@cluster``) when a request needs one and
the copy it holds is older than ``manager_credentials_refresh_ms``, so a push to the nodes reaches
the managers within that bound. With no node answering and no copy yet, a request that needs a
credential is refused with 503 (``unavailable``), never let in. A refusal of a credential is
counted (``kayos_auth_refusals_total``, on the member's ``GET /metrics``) and logged within
``auth_refusal_log_lines_per_minute_max`` lines a minute, as a node's (``kayos.auth.refusals``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from kayos import limits, tlsconfig
from kayos.auth.keys import CLUSTER_PRINCIPAL, cluster_stored_keys
from kayos.auth.proof import SCHEME, NonceWindow, verify_http
from kayos.auth.refusals import Refusals
from kayos.auth.rules import decide, http_rule
from kayos.auth.table import CredentialsTable, parse_table
from kayos.clock import SystemClock
from kayos.errors import Forbidden, KayosError, Unauthenticated, UnavailableError
from kayos.identity import ClusterIdentity
from kayos.manager.member.watch import cluster_headers

log = logging.getLogger("kayos.manager.member.gate")


class ManagerDoor:
    """The member's copy of the credentials table and the check of each request."""

    def __init__(self, identity: ClusterIdentity, node_urls: Callable[[], list[str]]) -> None:
        self.identity = identity
        # The member's own metrics (``GET /metrics``): its refusals, by reason.
        self.registry = CollectorRegistry()
        self.refusals = Refusals(self.registry, SystemClock(), log)
        self.node_urls = node_urls
        self.table: CredentialsTable | None = None
        self.fetched_s = 0.0
        self.window = NonceWindow()
        self._lock = asyncio.Lock()

    @property
    def cluster_stored(self) -> tuple[bytes, ...]:
        """The cluster principal's stored keys under the secrets the member accepts now."""
        return cluster_stored_keys(self.identity.accepted_secrets)

    async def current(self) -> CredentialsTable | None:
        """The newest table the nodes hold, read again once the copy is older than the bound."""
        async with self._lock:
            if time.monotonic() - self.fetched_s < limits.manager_credentials_refresh_ms / 1000:
                return self.table
            timeout = aiohttp.ClientTimeout(total=limits.manager_request_timeout_ms / 1000)
            connector = aiohttp.TCPConnector(ssl=tlsconfig.http_ssl())  # the nodes' TLS, if any
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                for url in self.node_urls():
                    target = url + "/v1/admin/credentials"
                    try:
                        headers = cluster_headers(self.identity, "GET", target)
                        async with session.get(target, headers=headers) as response:
                            if response.status != 200:
                                continue
                            table = parse_table(await response.json())
                    except (aiohttp.ClientError, TimeoutError, ValueError, KayosError):
                        continue
                    if self.table is None or table.version >= self.table.version:
                        self.table = table
                    self.fetched_s = time.monotonic()
                    break
            return self.table

    async def check(self, request: web.Request) -> None:
        """Raises the refusal of a request its route's rule does not allow (counted and logged,
        docs/security.md, "Refusals")."""
        route = request.match_info.route.resource
        if route is None:
            return
        rule = http_rule(request.method, route.canonical)
        if rule.role in ("open", "signed"):
            return
        header = request.headers.get("Authorization")
        now_ms = int(time.time() * 1000)
        what = f"{request.method} {request.path}"
        if header is not None and header.startswith(f"{SCHEME} name={CLUSTER_PRINCIPAL},"):
            # The cluster's own (the launcher, a campaign): proved by the cluster secret, so it
            # needs no table and is answered while no node is up; it holds every role.
            who, reason = verify_http(
                CredentialsTable(), self.cluster_stored, header, request.method,
                request.raw_path, now_ms, self.window,
            )  # fmt: skip
            if who is None:
                self.refusals.refused(what, request.remote, 401, reason or "bad_proof")
                raise Unauthenticated(f"the cluster's own proof did not hold ({reason})")
            return
        table = await self.current()
        if table is None:  # not a refusal of the credential: nothing to judge it by yet
            raise UnavailableError("no node answered with the credentials table: try again")
        who, reason = (None, None)
        if header is not None and not table.is_open:
            who, reason = verify_http(
                table, self.cluster_stored, header, request.method, request.raw_path, now_ms,
                self.window,
            )  # fmt: skip
        verdict = decide(table, who, rule, None, reason)
        if not verdict.allowed:
            self.refusals.refused(what, request.remote, verdict.status, verdict.reason or "missing")
        if verdict.status == 403:
            raise Forbidden("this credential does not hold the role this request needs")
        if verdict.status == 401:
            raise Unauthenticated(f"this request needs a credential ({verdict.reason})")


def make_gate(door: ManagerDoor, error_response: Callable[[KayosError], web.Response]) -> Any:
    @web.middleware
    async def gate(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            await door.check(request)
        except KayosError as exc:
            return error_response(exc)
        response: web.StreamResponse = await handler(request)
        return response

    return gate
