"""One ``kayos manager`` member: the Raft log, the HTTP face, and the driver while it leads
(docs/manager.md, "Running it"). Owns the event loop's side of the threads pysyncobj runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Awaitable
from typing import Any

import aiohttp
from aiohttp import web

from kayos import limits, tlsconfig
from kayos.datadir import DirectoryLock
from kayos.errors import (
    InvalidRequest,
    KayosError,
    OperationTimeoutError,
    UnavailableError,
    error_from_code,
)
from kayos.identity import secret_prints
from kayos.manager import Action, Event, ManagerView
from kayos.manager.member.config import ManagerSetup
from kayos.manager.member.driver import Driver
from kayos.manager.member.gate import ManagerDoor
from kayos.manager.member.http import MemberState, make_app
from kayos.manager.member.raft import Applied, ManagerLog
from kayos.manager.member.watch import cluster_headers
from kayos.topology import Topology

log = logging.getLogger("kayos.manager")


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Member:
    def __init__(
        self, setup: ManagerSetup, member_id: str, data_dir: str, config_path: str | None = None
    ) -> None:
        self.setup = setup
        # The file the member's secrets are read from again (SIGHUP, POST /v1/manager/secrets).
        self.config_path = config_path
        self.member_id = member_id
        self.data_dir = data_dir
        self.address = setup.member(member_id)
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.log = ManagerLog(setup, member_id, data_dir, on_state_changed=self._state_changed)
        self.session: aiohttp.ClientSession | None = None
        # The driver while this member leads, and the operator sends it has on their way.
        self._driver: Driver | None = None
        self._sends: set[asyncio.Task[None]] = set()

    def _state_changed(self) -> None:  # on pysyncobj's thread
        self._loop.call_soon_threadsafe(self._wake.set)

    async def submit(self, events: list[Event]) -> tuple[ManagerView, tuple[Action, ...]]:
        future: asyncio.Future[tuple[Applied | None, str | None]] = self._loop.create_future()

        def done(applied: Applied | None, reason: str | None) -> None:
            def settle() -> None:
                if not future.done():
                    future.set_result((applied, reason))

            self._loop.call_soon_threadsafe(settle)

        self.log.submit(events, done)
        try:
            async with asyncio.timeout(limits.manager_apply_timeout_ms / 1000):
                applied, reason = await future
        except TimeoutError as exc:
            raise OperationTimeoutError(
                f"log entry not applied within {limits.manager_apply_timeout_ms} ms"
            ) from exc
        if applied is None:
            raise UnavailableError(reason or "log entry not committed")
        if reason is not None:
            raise KayosError(f"log entry refused: {reason}")
        return applied.view, applied.actions

    async def get(self, url: str) -> Any:
        return await self._request("GET", url, None)

    async def post(self, url: str, body: Any) -> Any:
        return await self._request("POST", url, body)

    async def _request(self, method: str, url: str, body: Any) -> Any:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=limits.manager_request_timeout_ms / 1000)
        try:
            headers = cluster_headers(self.setup.identity, method, url)
            async with self.session.request(
                method, url, json=body, timeout=timeout, headers=headers
            ) as reply:
                raw = await reply.read()
                status = reply.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UnavailableError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        try:
            data = json.loads(raw) if raw else None
        except ValueError as exc:
            raise UnavailableError(
                f"{method} {url}: HTTP {status}, not JSON: {raw[:80]!r}"
            ) from exc
        if status >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            if isinstance(error, dict):
                raise error_from_code(str(error.get("code")), str(error.get("message")))
            raise UnavailableError(f"{method} {url}: HTTP {status}")
        return data

    def driver(self) -> Driver:
        return Driver(
            self.setup.identity,
            self.setup.topology.nodes,
            self.get,
            self.post,
            self.submit,
            self.log.view,
            monotonic_ms,
            base=self.setup.topology,
            changes=self.log.changes,
        )

    def send_actions(self, view: ManagerView, actions: tuple[Action, ...]) -> None:
        """What an operator entry's actions ask to send, sent now by the leading driver (in a
        task: the operator's reply does not wait on the nodes). A send that fails is logged; the
        driver's rounds send it again, as for their own."""
        driver = self._driver
        if driver is None or not actions or not self.log.is_leader():
            return
        task = asyncio.create_task(driver.carry_out(view, actions))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    def state(self) -> MemberState:
        return MemberState(
            self.member_id,
            self.setup,
            lambda: (self.log.view(), self.log.view_hash()),
            lambda: (self.log.applied_entries(), self.log.recent_hashes()),
            self.log.changes,
            self.log.leader,
            self.log.term,
            self.log.ready,
            self.submit,
            self.send_actions,
            self.suspect,
            self.exited,
            self.reload_secrets,
        )

    def reload_secrets(self) -> dict[str, Any]:
        """Reads the secrets of the member's file again (docs/security.md, "Rotating the cluster
        secret"): the orders it signs and the messages it checks use them from now on. The Raft
        password stays the one it started with until it restarts."""
        if self.config_path is None:
            raise InvalidRequest(f"member {self.member_id} has no file to read its secrets from")
        fresh = Topology.load(self.config_path).identity
        if fresh is None or fresh.is_placeholder:
            raise InvalidRequest(f"{self.config_path} has no cluster secret")
        self.setup.identity.rekey(fresh)
        prints = secret_prints(self.setup.identity)
        log.info("manager %s: cluster secrets reloaded: %s", self.member_id, prints)
        return prints

    def on_sighup(self) -> None:
        tls = tlsconfig.member()
        if tls is not None:
            tls.reload()
        if self.config_path is not None:
            try:
                self.reload_secrets()
            except (KayosError, OSError) as exc:
                log.error("secrets not reloaded, the previous ones stay: %s", exc)

    def suspect(self, node: str) -> bool | None:
        """The leading driver probes ``node`` (None: no driver runs here now)."""
        driver = self._driver
        return None if driver is None or not self.log.is_leader() else driver.suspect(node)

    def exited(self, node: str, incarnation: str) -> Awaitable[ManagerView] | None:
        """The leading driver logs a supervisor's exit report (None: no driver runs here)."""
        driver = self._driver
        if driver is None or not self.log.is_leader():
            return None
        return driver.exited(node, incarnation)

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: serves HTTP; drives while leading."""
        door = ManagerDoor(
            self.setup.identity,
            lambda: [address.http_url for address in self.setup.topology.nodes.values()],
        )
        runner = web.AppRunner(make_app(self.state(), door), access_log=None)
        await runner.setup()
        member = tlsconfig.member()
        site = web.TCPSite(
            runner,
            self.address.host,
            self.address.http_port,
            ssl_context=member.server if member is not None else None,
        )
        await site.start()
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tlsconfig.http_ssl())
        )
        log.info(
            "manager %s: raft %s, http %s", self.member_id, self.address.raft_address,
            self.address.http_url,
        )  # fmt: skip
        leading: asyncio.Task[None] | None = None
        # After a driver failure (its entry not committed in time: a partition, a slow disk) the
        # next start waits a poll interval, so a failing leader does not flood its own log.
        retry_at = 0
        try:
            while not stop.is_set():
                if self.log.is_leader() and leading is None and monotonic_ms() >= retry_at:
                    log.info("manager %s became leader at term %d", self.member_id, self.log.term())
                    self._driver = self.driver()
                    leading = asyncio.create_task(self._driver.lead(self.log.is_leader))
                if leading is not None and leading.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        exc = leading.exception()
                        if exc is not None:
                            log.warning("driver stopped: %r", exc)
                            retry_at = monotonic_ms() + limits.manager_poll_interval_ms
                    leading, self._driver = None, None
                if leading is not None and not self.log.is_leader():
                    log.info("manager %s no longer leads", self.member_id)
                    leading.cancel()
                    with contextlib.suppress(asyncio.CancelledError, KayosError):
                        await leading
                    leading, self._driver = None, None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(limits.manager_raft_heartbeat_ms / 1000):
                        await self._wake.wait()
        finally:
            for task in [*self._sends, *([leading] if leading else [])]:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await self.session.close()
            await runner.cleanup()
            self.log.close()


async def serve(
    setup: ManagerSetup, member_id: str, data_dir: str, config_path: str | None = None
) -> None:
    """Runs one member until SIGINT or SIGTERM."""
    lock = DirectoryLock.acquire(data_dir, what="kayos manager data directory")
    try:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        member = Member(setup, member_id, data_dir, config_path)
        loop.add_signal_handler(signal.SIGHUP, member.on_sighup)
        await member.run(stop)
    finally:
        lock.release()
