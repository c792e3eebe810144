"""The leader's watches (docs/manager.md, "Evidence and proof of death"): one long-lived
``GET /v1/admin/watch`` per node, each line the node heard; when one ends, the leader at once
connects to the node itself (the probe). Nothing listening (refused) or a goodbye is proof the
node's process is gone: the driver logs ``NodeGone`` at once. A reset, a connection that answers
under another incarnation (a restart) or silence proves nothing more. The choices are
``kayos.manager.member.evidence`` (pure); this is the asyncio part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from yarl import URL

from kayos import limits, tlsconfig
from kayos.auth.proof import cluster_authorization
from kayos.identity import ClusterIdentity
from kayos.manager import ManagerView, NodeGone
from kayos.manager.member.evidence import Evidence, Line, Outcome, parse_line
from kayos.topology import NodeAddr

log = logging.getLogger("kayos.manager.watch")

WATCH_PATH = "/v1/admin/watch"
# A watch line is ~60 bytes; anything longer is no watch line (the stream is dropped).
LINE_BYTES_MAX = 1024


def cluster_headers(identity: ClusterIdentity | None, method: str, url: str) -> dict[str, str]:
    """The proof a member's request to a node carries: the cluster's own principal, whose key
    comes from the cluster secret (docs/security.md). None without an identity."""
    if identity is None:
        return {}
    now_ms = int(time.time() * 1000)
    path_qs = URL(url).raw_path_qs
    proof = cluster_authorization(identity.proving_secret, method, path_qs, now_ms, os.urandom(16))
    return {"Authorization": proof}


class Watches:
    """One watch task per node the view holds; ``probe`` for a report from a node or client.
    ``on_gone`` logs a ``NodeGone`` and carries out what it decides (the driver)."""

    def __init__(
        self,
        evidence: Evidence,
        addresses: Callable[[], Mapping[str, NodeAddr]],
        view: Callable[[], ManagerView],
        clock_ms: Callable[[], int],
        on_gone: Callable[[NodeGone], Awaitable[None]],
        identity: ClusterIdentity | None = None,
    ) -> None:
        self.identity = identity
        self.evidence = evidence
        self.addresses = addresses
        self.view = view
        self.clock_ms = clock_ms
        self.on_gone = on_gone
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.probes: set[asyncio.Task[None]] = set()
        self.session: aiohttp.ClientSession | None = None

    def sync(self) -> None:
        """Starts a watch for every node with an address and none yet (those added at runtime
        included)."""
        if self.session is None:
            # Every request on a connection of its own: a probe must connect anew to be refused.
            connector = aiohttp.TCPConnector(force_close=True, limit=0, ssl=tlsconfig.http_ssl())
            self.session = aiohttp.ClientSession(connector=connector)
        for node in self.addresses():
            if node not in self.tasks:
                self.tasks[node] = asyncio.create_task(self._watch(node))

    async def close(self) -> None:
        for task in [*self.tasks.values(), *self.probes]:
            task.cancel()
        for task in [*self.tasks.values(), *self.probes]:
            with contextlib.suppress(BaseException):
                await task
        self.tasks.clear()
        if self.session is not None:
            await self.session.close()
            self.session = None

    def probe(self, node: str) -> bool:
        """Probes ``node`` once now (a report from a node or client), unless it was probed
        within ``limits.manager_probe_interval_ms_min``; whether a probe was started."""
        if node not in self.addresses() or not self.evidence.may_probe(node, self.clock_ms()):
            return False
        task = asyncio.create_task(self._probe(node))
        self.probes.add(task)
        task.add_done_callback(self.probes.discard)
        return True

    async def _probe(self, node: str) -> None:
        outcome, response = await self._connect(node)
        if response is not None:
            response.close()
        await self._judge(node, outcome)

    async def _watch(self, node: str) -> None:
        """Until cancelled: watch ``node``, probe it at once when the watch ends, and again."""
        while True:
            try:
                pause_s = await self._watch_once(node)
            except Exception:  # a watch never dies of a surprise: logged, then again
                log.exception("watch of %s failed", node)
                pause_s = limits.manager_poll_interval_ms / 1000
            if pause_s:
                await asyncio.sleep(pause_s)

    async def _watch_once(self, node: str) -> float:
        """One connection (the first after an ended one is the probe); returns how long to wait
        before the next."""
        if not self.evidence.may_probe(node, self.clock_ms()):
            return limits.manager_probe_interval_ms_min / 1000
        outcome, response = await self._connect(node)
        if outcome.kind == "line" and response is not None:
            assert outcome.line is not None
            if not outcome.line.bye:
                self._heard(node, outcome.line)
                outcome = await self._stream(node, response)
            response.close()
        await self._judge(node, outcome)
        if outcome.kind in ("refused", "silent") or (outcome.line and outcome.line.bye):
            # Nothing to watch now (gone, frozen, starting): look again next round.
            return limits.manager_poll_interval_ms / 1000
        return 0.0  # ended: the probe is the next connection, at once

    async def _connect(self, node: str) -> tuple[Outcome, aiohttp.ClientResponse | None]:
        """A new connection to the node's watch and its first line, within
        ``limits.manager_request_timeout_ms``."""
        address = self.addresses().get(node)
        if address is None or self.session is None:
            return Outcome("silent"), None
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(limits.manager_request_timeout_ms / 1000):
                url = f"{address.http_url}{WATCH_PATH}"
                headers = cluster_headers(self.identity, "GET", url)
                response = await self.session.get(url, headers=headers)
                if response.status != 200:
                    response.close()
                    return Outcome("silent"), None  # no watch here (a node of an earlier version)
                raw = await response.content.readline()
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            return Outcome("refused" if refused else "silent"), None
        except (aiohttp.ClientError, ConnectionError, EOFError):
            if response is not None:
                response.close()
            return Outcome("ended"), None
        except (TimeoutError, OSError, ValueError):
            if response is not None:
                response.close()
            return Outcome("silent"), None
        line = parse_line(raw[:LINE_BYTES_MAX])
        if line is None:
            response.close()
            return Outcome("ended" if not raw else "silent"), None
        return Outcome("line", line), response

    async def _stream(self, node: str, response: aiohttp.ClientResponse) -> Outcome:
        """Reads the watch's lines until it ends (``ended``), says goodbye (``line``, bye) or
        stays silent for the detection window (``silent``: opened again)."""
        window_s = limits.manager_detection_window_ms / 1000
        try:
            while True:
                async with asyncio.timeout(window_s):
                    raw = await response.content.readline()
                if not raw:
                    return Outcome("ended")
                line = parse_line(raw[:LINE_BYTES_MAX])
                if line is None:
                    continue
                if line.bye:
                    return Outcome("line", line)
                self._heard(node, line)
        except TimeoutError:
            return Outcome("silent")
        except (aiohttp.ClientError, ConnectionError, EOFError, OSError, ValueError):
            return Outcome("ended")

    def _heard(self, node: str, line: Line) -> None:
        if self.evidence.beat(node, line.incarnation, self.clock_ms()):
            log.info("%s runs a new process (incarnation %s): the one before is gone", node,
                     line.incarnation)  # fmt: skip

    async def _judge(self, node: str, outcome: Outcome) -> None:
        """Logs ``NodeGone`` for proof (refused, a goodbye) of a node the view holds live."""
        if outcome.kind == "refused":
            cause, incarnation = "refused", ""
        elif outcome.kind == "line" and outcome.line is not None and outcome.line.bye:
            cause, incarnation = "stopped", outcome.line.incarnation
        else:
            if outcome.kind == "line" and outcome.line is not None:
                self._heard(node, outcome.line)
            return
        event = self.evidence.proof(node, cause, self.clock_ms(), incarnation)
        state = self.view().node(node)
        if event is None or state is None or state.state in ("down", "removed"):
            return  # stale, or the view holds it gone already: recorded for the holds only
        log.warning("%s is gone (%s, incarnation %s): logging it", node, cause, event.incarnation)
        await self.on_gone(event)
