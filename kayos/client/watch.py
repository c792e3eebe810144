"""A client's watch of the cluster's topology (docs/node-api.md, "Clients"): one long poll,
``GET /v1/topology?after=<epoch>&wait_ms=<topology_watch_wait_ms_max>``, kept open to each of its
nodes and seeds, and asked again as soon as it is answered; a newer topology goes to the router
at once. A thin driver: which URLs to watch and how long to pause after each answer are
``kayos.client.policy``'s (``watch_urls``, ``next_poll``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Protocol

from kayos import limits
from kayos.client.http import HttpTransport
from kayos.client.policy import Outcome, RetryPolicy, next_poll, watch_urls
from kayos.clock import Clock
from kayos.errors import KayosError
from kayos.topology import Topology

log = logging.getLogger("kayos.client")


class Follower(Protocol):
    """What the watch needs of the router."""

    current: Topology | None

    async def install(self, topology: Topology) -> None: ...


class Transport(Protocol):
    """What the watch needs of an HTTP transport (``HttpTransport``; a fake in tests)."""

    async def request(
        self, method: str, url: str, *, timeout_s: float, params: dict[str, str] | None = None
    ) -> object: ...


class WatchSettings(Protocol):
    """What the watch reads of its client, at each use (a caller may change them meanwhile)."""

    seeds: list[str]
    policy: RetryPolicy
    rng: random.Random
    clock: Clock


class Watch:
    """The long polls of one client. ``follow`` (after each install) starts a poll for each new
    URL and stops those no longer watched; ``close`` stops them all."""

    def __init__(
        self,
        follower: Follower,
        settings: WatchSettings,
        *,
        transport: Transport | None = None,
        wait_ms: int = limits.topology_watch_wait_ms_max,
    ) -> None:
        self._follower = follower
        self._settings = settings
        self._wait_ms = wait_ms
        self._salt = settings.rng.getrandbits(32)
        # Its own HTTP connections: a long poll never waits for, nor holds up, a request.
        self._own_http: HttpTransport | None = None
        if transport is None:
            transport = self._own_http = HttpTransport(
                connections_max=limits.client_topology_watch_nodes_max
            )
        self._transport: Transport = transport
        self._polls: dict[str, asyncio.Task[None]] = {}
        self.running = False

    async def start(self) -> None:
        if self._own_http is not None:
            await self._own_http.open()
        self.running = True
        self.follow()

    def follow(self) -> None:
        """Polls exactly the URLs the current topology and the seeds give."""
        if not self.running:
            return
        urls = watch_urls(
            self._settings.seeds,
            self._follower.current,
            self._salt,
            limits.client_topology_watch_nodes_max,
        )
        for url in list(self._polls):
            if url not in urls:
                self._polls.pop(url).cancel()
        for url in urls:
            if url not in self._polls:
                self._polls[url] = asyncio.create_task(self._poll(url), name=f"kayos-watch {url}")

    @property
    def urls(self) -> list[str]:
        return list(self._polls)

    async def close(self) -> None:
        self.running = False
        polls, self._polls = list(self._polls.values()), {}
        for task in polls:
            task.cancel()
        for task in polls:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_http is not None:
            await self._own_http.close()

    async def _poll(self, url: str) -> None:
        failures = 0
        wait_s = self._wait_ms / 1000
        while True:
            current = self._follower.current
            after = current.epoch if current is not None else 0
            clock, policy, rng = self._settings.clock, self._settings.policy, self._settings.rng
            started_s = clock.monotonic_s()
            outcome: Outcome = "failed"
            try:
                body = await self._transport.request(
                    "GET",
                    url + "/v1/topology",
                    params={"after": str(after), "wait_ms": str(self._wait_ms)},
                    timeout_s=wait_s + limits.client_connect_timeout_ms / 1000,
                )
                topology = Topology.from_json(body)
                outcome = "newer" if topology.epoch > after else "same"
                if outcome == "newer":
                    await self._follower.install(topology)
            except KayosError as exc:
                if failures == 0:
                    log.debug("topology watch of %s: %s", url, exc)
            elapsed_s = clock.monotonic_s() - started_s
            failures, pause_s = next_poll(failures, outcome, elapsed_s, wait_s, policy, rng)
            if pause_s > 0:
                await asyncio.sleep(pause_s)
