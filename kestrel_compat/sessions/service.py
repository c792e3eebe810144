"""The state every connection of one Kestrel server shares, whatever its protocol.

``KestrelService`` holds the queue collection, the persistence driver, the server status and the
configuration. The memcache, text and thrift sessions (``memcache_session``, ``text_session``,
``thrift_session`` beside this module) all serve one service, so the three protocols see the same
queues, as in Kestrel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kayos.clock import Clock
from kestrel_compat.backends.persister import Persister
from kestrel_compat.core.collection import QueueCollection
from kestrel_compat.core.config import KestrelConfig, load_queue_settings
from kestrel_compat.core.persistence import Backend
from kestrel_compat.core.status import ServerStatus, StatusKeeper
from kestrel_compat.wire.memcache_replies import StatValue, encode_dump_stats

log = logging.getLogger("kestrel_compat.sessions.service")


def _read_status_file(path: str | None) -> ServerStatus | None:
    if path is None:
        return None
    try:
        word = Path(path).read_text(encoding="ascii").strip().upper()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return ServerStatus[word]
    except KeyError:
        log.error("status file %s holds %r; keeping the default status", path, word)
        return None


class KestrelService:
    """Everything the sessions of one server share."""

    def __init__(
        self,
        config: KestrelConfig,
        backend: Backend,
        clock: Clock,
        *,
        config_path: str | None = None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.server_config = config.server
        self.clock = clock
        self.config_path = config_path
        self.collection = QueueCollection(config.queues, clock)
        self.persister = Persister(backend, self.collection)
        self.backend = backend
        self.on_shutdown = on_shutdown
        self.sessions = 0
        self.status: StatusKeeper | None = None
        server = config.server
        if server.status_enabled:
            stored = _read_status_file(server.status_file)
            self.status = StatusKeeper(
                clock,
                initial=stored if stored is not None else server.default_status,
                grace_period_ms=server.status_change_grace_period_ms,
                store=self._store_status if server.status_file is not None else None,
            )

    def _store_status(self, status: ServerStatus) -> None:
        path = self.server_config.status_file
        assert path is not None
        try:
            Path(path).write_text(status.name.lower(), encoding="ascii")
        except OSError as error:
            log.error("cannot store the server status in %s: %s", path, error)

    async def start(self) -> None:
        await self.persister.recover()

    def after_change(self) -> None:
        self.persister.kick()

    def sweep(self) -> None:
        self.collection.sweep()
        self.after_change()

    def reload(self) -> None:
        self.collection.reload(load_queue_settings(self.config_path))
        self.after_change()

    def stats(self) -> list[tuple[str, StatValue]]:
        collection = self.collection
        counters = collection.stats
        now_s = self.clock.now_s()
        budget = self.server_config.memory_budget_bytes
        report: list[tuple[str, StatValue]] = [
            ("uptime", int(now_s - collection.started_s)),
            ("time", int(now_s)),
            ("version", self.server_config.version),
            ("curr_items", collection.current_items()),
            ("total_items", counters.total_items),
            ("bytes", collection.current_bytes()),
            ("reserved_memory_ratio", f"{collection.reserved_memory_bytes() / budget:.3f}"),
            ("curr_connections", counters.curr_connections),
            ("total_connections", counters.total_connections),
            ("cmd_get", counters.cmd_get),
            ("cmd_set", counters.cmd_set),
            ("cmd_peek", counters.cmd_peek),
            ("get_hits", counters.get_hits),
            ("get_misses", counters.get_misses),
            ("bytes_read", counters.bytes_read),
            ("bytes_written", counters.bytes_written),
            ("queue_creates", counters.queue_creates),
            ("queue_deletes", counters.queue_deletes),
            ("queue_expires", counters.queue_expires),
        ]
        for name in collection.queue_names():
            for key, value in collection.queue_stats(name):
                report.append((f"queue_{name}_{key}", value))
        return report

    def dump_stats(self, names: tuple[str, ...]) -> bytes:
        chosen = list(names) if names else self.collection.queue_names()
        return encode_dump_stats((name, self.collection.queue_stats(name)) for name in chosen)

    async def close(self) -> None:
        """Stop: every queue closes (waiters answer END), then the last commits are written."""
        self.collection.shutdown()
        self.persister.close()
        await self.persister.drain()
        await self.backend.close()
