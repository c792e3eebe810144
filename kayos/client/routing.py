"""Where an ``AsyncClient``'s requests go (docs/node-api.md, "Clients"): the cached topology, the
node a role or a redirect names, the retry loop, and one binary connection per node.

The topology is discovered from any seed and cached; a ``wrong_role`` reply refreshes it and the
request goes where the node said. ``unavailable`` and connection failures are retried with backoff
(``kayos.client.policy``); every other error is the caller's. ``kayos.client.aio`` says what each
request is; this module only routes and retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from kayos import limits
from kayos.client.binary import BinaryConnection
from kayos.client.http import HttpTransport
from kayos.client.policy import RetryPolicy, RetryState, newest_topology
from kayos.clock import Clock
from kayos.errors import InvalidRequest, KayosError, UnavailableError, WrongRoleError
from kayos.topology import Topology

T = TypeVar("T")

# An attempt gets the node a redirect named (None: choose by the topology's roles).
Attempt = Callable[[str | None], Awaitable[T]]


class Settings(Protocol):
    """What the router reads of its client, at each use (a caller may change them meanwhile)."""

    seeds: list[str]
    name: str
    policy: RetryPolicy
    rng: random.Random
    clock: Clock


class Router:
    """One client's view of the cluster: its topology, its connections and its retries. Not
    thread-safe: used from the client's event loop."""

    def __init__(self, settings: Settings, http: HttpTransport) -> None:
        self.settings = settings
        self.http = http
        self.current: Topology | None = None  # the cached topology (None: not yet known)
        self._current_at_s = 0.0  # clock.monotonic_s() when it was installed
        self._connections: dict[str, BinaryConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._tail_turns: dict[int, itertools.count[int]] = {}
        self._refresh_task: asyncio.Task[Topology] | None = None
        self.closed = False

    async def close(self) -> None:
        """Stops a refresh in flight and closes every connection; no connection opens after."""
        self.closed = True
        if self._refresh_task is not None and not self._refresh_task.done():
            self._refresh_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, KayosError):
                await self._refresh_task
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()

    # --- topology --------------------------------------------------------------------------------

    @property
    def topology(self) -> Topology:
        if self.current is None:
            raise InvalidRequest("the client is not connected (call connect() first)")
        return self.current

    async def refresh_topology(self, min_epoch: int = 0) -> Topology:
        """Asks the known nodes, then the seeds, for the topology; keeps the first with an epoch
        of at least ``min_epoch``. ``UnavailableError`` if none has one (a retry may).

        Concurrent callers share one fetch: a node failing under a thousand requests in flight
        costs one round of topology requests, not a thousand."""
        task = self._refresh_task
        if task is None or task.done():
            task = self._refresh_task = asyncio.create_task(self._fetch_topology(min_epoch))
        topology = await asyncio.shield(task)
        if topology.epoch >= min_epoch:
            return topology
        return await self._fetch_topology(min_epoch)  # the shared fetch asked for less

    async def _fetch_topology(self, min_epoch: int) -> Topology:
        """Asks every known node and seed at once and keeps the highest epoch: after a chain
        change some nodes may not have the new topology yet, and the first to answer may be one
        of them (or the node that was removed)."""
        urls = [node.http_url for node in self.current.nodes.values()] if self.current else []
        urls += [seed for seed in self.settings.seeds if seed not in urls]

        async def ask(url: str) -> Topology:
            body = await self.http.request(
                "GET", url + "/v1/topology", timeout_s=limits.client_connect_timeout_ms / 1000
            )
            return Topology.from_json(body)

        answers = await asyncio.gather(*map(ask, urls), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, KayosError):
                raise answer
        topology, failures = newest_topology(urls, answers, min_epoch)
        if topology is None:
            raise UnavailableError("no node gave the topology: " + "; ".join(failures))
        await self._install(topology)
        return topology

    def recent_topology(self) -> None:
        """Starts, in the background, a refresh of a topology older than
        ``limits.client_topology_max_age_ms``: a queue may have gained shards (``kayos ctl queue
        alter``) that a consumer must read. Nothing waits for it (a paused node would hold a
        consumer up for the whole request timeout): the snapshot starting now reads the shards
        the cached topology names, the next one those of the refreshed topology. One try per
        interval, even when it fails."""
        clock = self.settings.clock
        age_s = clock.monotonic_s() - self._current_at_s
        running = self._refresh_task is not None and not self._refresh_task.done()
        if self.current is None or running or age_s * 1000 < limits.client_topology_max_age_ms:
            return
        self._current_at_s = clock.monotonic_s()
        task = self._refresh_task = asyncio.create_task(self._fetch_topology(0))
        task.add_done_callback(_retrieve_error)

    async def _install(self, topology: Topology) -> None:
        old = self.current
        if old is not None and topology.epoch < old.epoch:
            return  # an older view from a lagging node never replaces a newer one
        self.current = topology
        self._current_at_s = self.settings.clock.monotonic_s()
        for node, connection in list(self._connections.items()):
            if old is None or topology.nodes.get(node) != old.nodes.get(node):
                del self._connections[node]  # moved or gone: its address is stale
                await connection.close()

    def node_named(self, redirect: str | None) -> str | None:
        """The node a redirect names, by id or by HTTP URL; None if unknown."""
        if redirect is None:
            return None
        nodes = self.topology.nodes
        if redirect in nodes:
            return redirect
        for node in nodes.values():
            if node.http_url == redirect.rstrip("/"):
                return node.id
        return None

    def tail(self, shard: int) -> str:
        """The shard's tails in turn (fanout spreads consumers over them)."""
        tails = self.topology.shards[shard].tails
        turn = next(self._tail_turns.setdefault(shard, itertools.count()))
        return tails[turn % len(tails)]

    def url(self, node: str) -> str:
        """The node's HTTP base URL."""
        return self.topology.nodes[node].http_url

    # --- retries and connections -----------------------------------------------------------------

    async def retrying(self, attempt: Attempt[T]) -> T:
        """Runs ``attempt`` until it succeeds or the retry policy gives the error to the caller.
        A redirect refreshes the topology (at least the epoch the node acted on) first."""
        state = RetryState(self.settings.policy, self.settings.rng)
        redirect: str | None = None
        while True:
            try:
                return await attempt(redirect)
            except KayosError as error:
                delay_s = state.next_delay_s(error)
                if delay_s is None:
                    raise
                if isinstance(error, WrongRoleError):
                    with contextlib.suppress(UnavailableError):
                        await self.refresh_topology(error.epoch)
                    redirect = self.node_named(error.redirect)
                    continue
                await asyncio.sleep(delay_s)
                redirect = None
                # The node may be gone for good and its shard's chain repaired under a new epoch.
                if self.current is not None:
                    with contextlib.suppress(UnavailableError):
                        await self.refresh_topology()

    async def connection(self, node: str) -> BinaryConnection:
        """The node's binary connection: the open one, else a new one (one opening at a time)."""
        connection = self._connections.get(node)
        if connection is not None and connection.alive:
            return connection
        lock = self._connecting.setdefault(node, asyncio.Lock())
        async with lock:
            connection = self._connections.get(node)
            if connection is not None and connection.alive:
                return connection
            if self.closed:
                raise InvalidRequest("the client is closed")
            address = self.topology.nodes[node]
            connection = await BinaryConnection.open(
                node, address.host, address.bin_port, name=self.settings.name
            )
            self._connections[node] = connection
            return connection


def _retrieve_error(task: asyncio.Task[Topology]) -> None:
    """A background topology refresh's failure is retrieved (so asyncio does not log it): the
    cached topology stays, and the next retry or refresh asks again."""
    if not task.cancelled():
        task.exception()
