"""The node's side of the manager's watch (docs/node-api.md, "Incarnation and the manager's
watch"): ``GET /v1/admin/watch`` streams a line with the node's incarnation at once and then every
``limits.manager_watch_beat_ms``, for as long as the node runs; on a clean stop, once the node's
lease has ended, a last ``{"bye": true}`` line. The manager leader counts each line as the node
heard, and the stream's end (or a reset) makes it probe the node at once (docs/manager.md,
"Evidence and proof of death").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from aiohttp import web

from kayos import limits
from kayos.errors import UnavailableError

log = logging.getLogger("kayos.node.watch")

CONTENT_TYPE = "application/x-ndjson"


def beat_line(incarnation: str, beat: int) -> bytes:
    """One beat: ``{"incarnation": I, "beat": n}`` and a newline."""
    return json.dumps({"incarnation": incarnation, "beat": beat}).encode() + b"\n"


def bye_line(incarnation: str) -> bytes:
    """The last line of a clean stop: ``{"bye": true, "incarnation": I}`` and a newline."""
    return json.dumps({"bye": True, "incarnation": incarnation}).encode() + b"\n"


class Watches:
    """The watches a node serves: at most ``limits.node_watchers_max`` at once; ``goodbye`` ends
    them all with the goodbye line (the caller ends the lease first)."""

    def __init__(self, incarnation: str) -> None:
        self.incarnation = incarnation
        self.open = 0
        self._stopping = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/admin/watch``: the stream, until the node stops or the watcher goes away."""
        if self.stopping:
            raise UnavailableError("the node is stopping")
        if self.open >= limits.node_watchers_max:
            raise UnavailableError(
                f"this node serves {limits.node_watchers_max} watches already (node_watchers_max)"
            )
        self.open += 1
        self.idle.clear()
        response = web.StreamResponse(headers={"Cache-Control": "no-store"})
        response.content_type = CONTENT_TYPE
        try:
            await response.prepare(request)
            await self._stream(response)
        except (ConnectionError, RuntimeError, OSError):
            pass  # the watcher went away (a RuntimeError: aiohttp's closing transport)
        finally:
            self.open -= 1
            if not self.open:
                self.idle.set()
        return response

    async def _stream(self, response: web.StreamResponse) -> None:
        beat = 0
        interval_s = limits.manager_watch_beat_ms / 1000
        while not self.stopping:
            await response.write(beat_line(self.incarnation, beat))
            beat += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._stopping.wait()
        await response.write(bye_line(self.incarnation))
        await response.write_eof()

    async def goodbye(self) -> None:
        """Ends every watch with its goodbye line and waits (at most
        ``limits.node_goodbye_ms_max``) until each is written; new watches are refused."""
        self._stopping.set()
        try:
            async with asyncio.timeout(limits.node_goodbye_ms_max / 1000):
                await self.idle.wait()
        except TimeoutError:
            log.info("%d watches did not take their goodbye in time", self.open)
