"""A node's reports of a lost chain neighbour to the cluster manager (docs/node-api.md,
"Reporting a lost neighbour"): when a replication link to a neighbour is reset, refused or closed
by the peer, the node posts ``{"node": peer}`` to ``POST /v1/manager/suspect`` of every member it
knows, fire and forget, at most once per neighbour per
``limits.node_suspect_report_interval_ms_min``. The leader only probes the node itself: a report
never changes a chain (docs/manager.md, "Evidence and proof of death").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from kayos import limits, tlsconfig
from kayos.clock import Clock

log = logging.getLogger("kayos.node.reports")

# Failures of a link that say the peer went away (rather than refused us for a reason of its
# own, which a KayosError would carry): a refused connect, a reset, the stream's end.
LOST_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    EOFError,
    asyncio.IncompleteReadError,
)


def due(last_ms: float | None, now_ms: float) -> bool:
    """Whether a neighbour last reported at ``last_ms`` (None: never) may be reported again."""
    return last_ms is None or now_ms - last_ms >= limits.node_suspect_report_interval_ms_min


class SuspectReports:
    """Sends the reports. ``managers()`` gives the members' HTTP base URLs now (the topology's,
    else the file's); ``spawn`` runs a task of the node (cancelled when it stops)."""

    def __init__(
        self,
        node_id: str,
        managers: Callable[[], Sequence[str]],
        clock: Clock,
        spawn: Callable[[Any], asyncio.Task[Any]],
    ) -> None:
        self.node_id = node_id
        self.managers = managers
        self.clock = clock
        self.spawn = spawn
        self.last_ms: dict[str, float] = {}
        self.sent = 0
        self._session: aiohttp.ClientSession | None = None

    def peer_lost(self, peer: str, error: BaseException | None = None) -> None:
        """The link to ``peer`` failed with ``error`` (None: it ended): report it, if the error
        says the peer went away and the peer was not reported within the interval."""
        if peer == self.node_id or (error is not None and not isinstance(error, LOST_ERRORS)):
            return
        urls = list(self.managers())
        now_ms = self.clock.monotonic_s() * 1000
        if not urls or not due(self.last_ms.get(peer), now_ms):
            return
        self.last_ms[peer] = now_ms
        self.sent += 1
        self.spawn(self._send(urls, peer))

    async def _send(self, urls: list[str], peer: str) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=tlsconfig.http_ssl())
            self._session = aiohttp.ClientSession(connector=connector)
        timeout = aiohttp.ClientTimeout(total=limits.manager_request_timeout_ms / 1000)

        async def post(url: str) -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with self._session.post(  # type: ignore[union-attr]
                    f"{url}/v1/manager/suspect", json={"node": peer}, timeout=timeout
                ):
                    pass  # the reply is not read: a follower's 421 or the leader's 202

        log.info("reporting %s to the managers: its link is lost", peer)
        await asyncio.gather(*(post(url) for url in urls))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
