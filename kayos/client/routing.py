"""Where an ``AsyncClient``'s requests go, and how it follows the cluster (docs/node-api.md,
"Clients"): the cached topology, the node a role or a redirect names, the retry loop, one binary
connection per node, the topology watch (``kayos.client.watch``), requests abandoned when their
node leaves the role they were sent for, and connections given up when they fall silent.

The topology is discovered from any seed and cached, and kept current by the watch; a
``wrong_role`` reply refreshes it and the request goes where the node said. What comes after a
failed attempt is ``kayos.client.policy``'s: a redirect, a resend at once (abandoned), a wait for
a newer topology (the connection was lost), a backoff (the node said ``unavailable``), or the
caller's error. ``kayos.client.aio`` says what each request is; this module routes and retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from kayos import limits
from kayos.client.auth import ClientCredential
from kayos.client.binary import BinaryConnection
from kayos.client.http import HttpTransport
from kayos.client.policy import (
    Action,
    Purpose,
    RetryState,
    abandoned,
    check_counts,
    holds_role,
    manager_urls,
    newest_topology,
    report_due,
    silent,
)
from kayos.client.watch import Watch, WatchSettings
from kayos.errors import InvalidRequest, KayosError, UnavailableError, WrongRoleError
from kayos.replication.wire.frames import Frame
from kayos.topology import NodeAddr, Topology

log = logging.getLogger("kayos.client")

T = TypeVar("T")

# An attempt gets the node a redirect named (None: choose by the topology's roles).
Attempt = Callable[[str | None], Awaitable[T]]


class Settings(WatchSettings, Protocol):
    """What the router reads of its client, at each use (a caller may change them meanwhile)."""

    name: str
    follow: bool


class Connection(Protocol):
    """What the router needs of a binary connection (``BinaryConnection``; a fake in tests)."""

    node: str
    last_heard_s: float
    busy_since_s: float

    @property
    def alive(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    async def request(
        self, make_frame: Callable[[int], Frame], timeout_s: float, purpose: Purpose | None = None
    ) -> Frame: ...

    def abandon(
        self, keep: Callable[[Purpose], bool], error_for: Callable[[Purpose], KayosError]
    ) -> int: ...

    async def close(self, error: KayosError | None = None) -> None: ...


# Opens a binary connection to a node (its id and address) for a client of this name.
Connect = Callable[[str, NodeAddr, str], Awaitable[Connection]]


async def open_binary(
    node: str, address: NodeAddr, name: str, credential: ClientCredential | None = None
) -> Connection:
    return await BinaryConnection.open(
        node, address.host, address.bin_port, name=name, credential=credential
    )


class _Pending:
    """A connection being opened, or an HTTP request, for a purpose: abandoned by setting
    ``gave_up``."""

    __slots__ = ("gave_up", "node", "purpose")

    def __init__(self, node: str, purpose: Purpose, gave_up: asyncio.Future[None]) -> None:
        self.node = node
        self.purpose = purpose
        self.gave_up = gave_up


class Router:
    """One client's view of the cluster: its topology, its connections and its retries. Not
    thread-safe: used from the client's event loop."""

    def __init__(
        self, settings: Settings, http: HttpTransport, *, connect: Connect | None = None
    ) -> None:
        self.settings = settings
        self.http = http
        if connect is None:  # the binary port proves what the HTTP requests prove

            async def connect(node: str, address: NodeAddr, name: str) -> Connection:
                return await open_binary(node, address, name, http.credential)

        self.current: Topology | None = None  # the cached topology (None: not yet known)
        self._current_at_s = 0.0  # clock.monotonic_s() when it was installed
        self._connect = connect
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._tail_turns: dict[int, itertools.count[int]] = {}
        self._refresh_task: asyncio.Task[Topology] | None = None
        # Connections being opened and HTTP requests, each for a purpose (abandoned on install).
        self.pending: set[_Pending] = set()
        # Set, and replaced, at each install of a newer topology.
        self._changed = asyncio.Event()
        self._reported: dict[str, float] = {}  # node -> clock.monotonic_s() of its last report
        self._background: set[asyncio.Task[None]] = set()
        self._silence_task: asyncio.Task[None] | None = None
        self.watch = Watch(self, settings)
        self.closed = False

    async def start(self) -> None:
        """Starts following the cluster (once the topology is known): the watch and the
        silence checks, until ``close``."""
        if self.closed or self.watch.running or self._silence_task is not None:
            return
        if self.settings.follow:
            await self.watch.start()
        self._silence_task = asyncio.create_task(self._check_silence(), name="kayos-silence")

    async def close(self) -> None:
        """Stops the watch, the silence checks and a refresh in flight, and closes every
        connection; no connection opens after."""
        self.closed = True
        await self.watch.close()
        tasks = [self._silence_task, self._refresh_task, *self._background]
        for task in tasks:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, KayosError):
                    await task
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
        of them (or the node that was removed). Asked for at least ``min_epoch`` (above 0), the
        first answer that has it will do: a frozen node does not hold the refresh up."""
        urls = [node.http_url for node in self.current.nodes.values()] if self.current else []
        urls += [seed for seed in self.settings.seeds if seed not in urls]

        async def ask(index: int) -> tuple[int, Topology | KayosError]:
            try:
                body = await self.http.request(
                    "GET",
                    urls[index] + "/v1/topology",
                    timeout_s=limits.client_connect_timeout_ms / 1000,
                )
                return index, Topology.from_json(body)
            except KayosError as exc:
                return index, exc

        tasks = [asyncio.ensure_future(ask(index)) for index in range(len(urls))]
        answers: dict[int, Topology | BaseException] = {}
        try:
            for next_answer in asyncio.as_completed(tasks):
                index, answer = await next_answer
                answers[index] = answer
                if min_epoch > 0 and isinstance(answer, Topology) and answer.epoch >= min_epoch:
                    break
        finally:
            for task in tasks:
                task.cancel()
        topology, failures = newest_topology(
            [urls[i] for i in answers], list(answers.values()), min_epoch
        )
        if topology is None:
            raise UnavailableError("no node gave the topology: " + "; ".join(failures))
        await self.install(topology)
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

    async def install(self, topology: Topology) -> None:
        """Makes ``topology`` the client's unless it is older. If it is newer, requests in
        flight to a node that left the role they were sent for are abandoned (their retry sends
        them again at once), waiters for a newer topology wake, and the watch follows the new
        node list; either way connections to nodes that moved or left are closed."""
        old = self.current
        if old is not None and topology.epoch < old.epoch:
            return  # an older view from a lagging node never replaces a newer one
        self.current = topology
        self._current_at_s = self.settings.clock.monotonic_s()
        newer = old is None or topology.epoch > old.epoch
        if newer:
            self._abandon(old, topology)
        for node, connection in list(self._connections.items()):
            if old is None or topology.nodes.get(node) != old.nodes.get(node):
                del self._connections[node]  # moved or gone: its address is stale
                error = UnavailableError(
                    f"node {node} moved or left at topology epoch {topology.epoch}",
                    failure="abandoned",
                )
                await connection.close(error)
        if newer:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
            self.watch.follow()

    def _abandon(self, old: Topology | None, new: Topology) -> None:
        gave_up = 0
        for node, connection in self._connections.items():
            gave_up += connection.abandon(
                functools.partial(holds_role, new, node),
                functools.partial(abandoned_error, node, new.epoch),
            )
        pending = list(self.pending)
        for index in abandoned(old, new, [(p.node, p.purpose) for p in pending]):
            if not pending[index].gave_up.done():
                pending[index].gave_up.set_result(None)
                gave_up += 1
        if gave_up:
            log.info("topology epoch %s: %s requests in flight sent again", new.epoch, gave_up)

    async def newer_than(self, epoch: int, timeout_s: float) -> bool:
        """Waits until a topology newer than ``epoch`` is installed, at most ``timeout_s``;
        whether one was."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while self.current is None or self.current.epoch <= epoch:
            remaining_s = deadline_s - loop.time()
            if remaining_s <= 0:
                return False
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await changed.wait()
        return True

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
        """Runs ``attempt`` until it succeeds or the retry policy gives the error to the caller
        (``kayos.client.policy``, ``RetryState.next_step``). A redirect refreshes the topology
        (at least the epoch the node acted on) first; an abandoned request goes again at once;
        a lost one waits for a topology newer than the one it was sent under (bounded)."""
        state = RetryState(self.settings.policy, self.settings.rng)
        redirect: str | None = None
        while True:
            epoch = self.current.epoch if self.current is not None else 0
            try:
                return await attempt(redirect)
            except KayosError as error:
                step = state.next_step(
                    error,
                    managed=bool(manager_urls(self.current)),
                    epoch=self.current.epoch if self.current is not None else 0,
                )
                log.debug("attempt at epoch %s failed (%s); next: %s", epoch, error, step)
                if step is None or self.closed:
                    raise
                redirect = None
                if step.action is Action.REDIRECT and isinstance(error, WrongRoleError):
                    with contextlib.suppress(UnavailableError):
                        await self.refresh_topology(error.epoch)
                    redirect = self.node_named(error.redirect)
                elif step.action is Action.AWAIT_TOPOLOGY:
                    await self.newer_than(epoch, step.delay_s)
                elif step.action is Action.BACKOFF:
                    await asyncio.sleep(step.delay_s)
                    # Without the watch, the node may be gone for good and its shard's chain
                    # repaired under a new epoch.
                    if self.current is not None and not self.watch.running:
                        with contextlib.suppress(UnavailableError):
                            await self.refresh_topology()

    async def send(
        self,
        node: str,
        purpose: Purpose,
        make_frame: Callable[[int], Frame],
        timeout_s: float,
    ) -> Frame:
        """One binary request to ``node`` for ``purpose``: abandoned (``UnavailableError``,
        ``failure="abandoned"``) if a newer topology moves the role elsewhere while it waits,
        for its connection or for its reply. A lost node is reported to the manager."""
        try:
            connection = self._connections.get(node)
            if connection is None or not connection.alive:
                epoch = self.topology.epoch
                connection = await self._abandonable(node, purpose, self.connection(node))
                if self.topology.epoch > epoch and not holds_role(self.topology, node, purpose):
                    raise abandoned_error(node, self.topology.epoch, purpose)
            return await connection.request(make_frame, timeout_s, purpose)
        except UnavailableError as error:
            if error.failure == "lost":
                self.report(node)
            raise

    async def call(self, node: str, purpose: Purpose, request: Awaitable[T]) -> T:
        """An HTTP request to ``node`` for ``purpose``, abandoned as ``send``'s are."""
        try:
            return await self._abandonable(node, purpose, request)
        except UnavailableError as error:
            if error.failure == "lost":
                self.report(node)
            raise

    async def _abandonable(self, node: str, purpose: Purpose, work: Awaitable[T]) -> T:
        """``work``'s result, unless a newer topology in which ``node`` does not hold
        ``purpose``'s role is installed first: then ``work`` is cancelled and the request
        abandoned."""
        task = asyncio.ensure_future(work)
        pending = _Pending(node, purpose, asyncio.get_running_loop().create_future())
        self.pending.add(pending)
        try:
            await asyncio.wait((task, pending.gave_up), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.pending.discard(pending)
            if not task.done():
                task.cancel()
                task.add_done_callback(_retrieve_error)
        if task.done() and not task.cancelled():
            return task.result()
        raise abandoned_error(node, self.topology.epoch, purpose)

    async def connection(self, node: str) -> Connection:
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
            connection = await self._connect(node, self.topology.nodes[node], self.settings.name)
            self._connections[node] = connection
            return connection

    # --- silence and reports ---------------------------------------------------------------------

    async def _check_silence(self) -> None:
        """Every quarter of ``client_silence_ms``, gives up the connections that fell silent
        (``close_silent``); a check that runs late judges nobody (``check_counts``)."""
        clock = self.settings.clock
        interval_s = limits.client_silence_ms / 4000
        due_s = clock.monotonic_s() + interval_s
        while True:
            await asyncio.sleep(max(0.0, due_s - clock.monotonic_s()))
            now_s = clock.monotonic_s()
            if check_counts(due_s, now_s, interval_s):
                await self.close_silent(now_s)
            due_s = now_s + interval_s

    async def close_silent(self, now_s: float) -> list[str]:
        """Closes each connection with requests outstanding that has heard nothing from its
        node for ``client_silence_ms``: its requests fail as lost (they wait for a newer
        topology, then go again) and the node is reported. The nodes whose connection closed."""
        silence_s = limits.client_silence_ms / 1000
        closed: list[str] = []
        for node, connection in list(self._connections.items()):
            if not connection.alive or not connection.in_flight:
                continue
            if not silent(connection.last_heard_s, connection.busy_since_s, now_s, silence_s):
                continue
            message = (
                f"node {node}: nothing heard for {silence_s:g}s with {connection.in_flight} "
                "requests outstanding; the connection is given up"
            )
            log.warning("%s", message)
            self.report(node)
            await connection.close(UnavailableError(message, failure="lost"))
            closed.append(node)
        return closed

    def report(self, node: str) -> None:
        """Tells each manager member the topology names that ``node`` was lost (``POST
        /v1/manager/suspect``, fire and forget; the manager probes it itself), at most once per
        node per ``client_silence_ms``."""
        urls = manager_urls(self.current)
        now_s = self.settings.clock.monotonic_s()
        interval_s = limits.client_silence_ms / 1000
        if not urls or not report_due(self._reported.get(node), now_s, interval_s):
            return
        self._reported[node] = now_s
        for url in urls:
            task = asyncio.create_task(self._suspect(url, node))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _suspect(self, url: str, node: str) -> None:
        with contextlib.suppress(KayosError):
            await self.http.request(
                "POST",
                url + "/v1/manager/suspect",
                body={"node": node},
                timeout_s=limits.manager_request_timeout_ms / 1000,
            )


def abandoned_error(node: str, epoch: int, purpose: Purpose) -> UnavailableError:
    """What a request abandoned at topology ``epoch`` fails with inside the client."""
    return UnavailableError(
        f"node {node} is not the {purpose.role} of shard {purpose.shard} at topology epoch "
        f"{epoch}; the request goes to the one that is",
        failure="abandoned",
    )


def _retrieve_error(task: asyncio.Future[Any]) -> None:
    """A background task's failure is retrieved (so asyncio does not log it): a topology
    refresh's (the cached topology stays, and the next retry or refresh asks again), or an
    abandoned request's."""
    if not task.cancelled():
        task.exception()
