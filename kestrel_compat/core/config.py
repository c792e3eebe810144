"""Kestrel server and queue configuration, with Kestrel 2.3.4's inheritance (spec §9).

A queue setting is either *specified* or left to inheritance. ``QueueBuilder`` holds only the
specified fields of one ``[queues.<name>]`` table; ``QueueConfig`` is a fully resolved config.
Resolution follows Kestrel >= 2.3.4:

- the default config is the built-in defaults overridden by the ``[default]`` table;
- a named master queue is its builder resolved against the default config; a queue without a
  builder uses the default config;
- a fanout ``m+c`` is the builder ``m+c`` resolved against m's config, else m's config.

The file is TOML (``kestrel --config FILE``)::

    [server]                       # read at start only; ``reload`` ignores it
    host = "127.0.0.1"
    port = 22133                   # memcache
    text_port = 2222               # false: no text protocol
    thrift_port = 2229             # false: no thrift protocol
    max_open_transactions = 1
    expiration_timer_frequency_ms = 1000

    [default]                      # overrides of the built-in queue defaults
    max_memory_size_bytes = 8388608

    [queues.q]                     # per queue; names with '+' need quotes
    max_items = 500

    [queues."q+audit"]
    max_age_ms = 60000

    [aliases.everything]
    destination_queues = ["q", "other"]

``reload`` re-reads ``[default]``, ``[queues]`` and ``[aliases]`` and recomputes every live queue's
config (spec §9). Unknown keys are errors, so a typo never silently does nothing.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kayos.errors import InvalidRequest
from kestrel_compat import limits
from kestrel_compat.core.status import ServerStatus


class ConfigError(InvalidRequest):
    """The configuration file cannot be read or holds a value Kestrel would not accept."""

    code = "kestrel_config"


# Kestrel's built-in QueueBuilder defaults (spec §9). Journal fields have no effect on where Kayos
# keeps items; they shape the `logsize`, `journal_*` and `reserved_memory_ratio` stats only.
JAVA_INT_MAX = limits.java_int_max
JAVA_LONG_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue's resolved settings; field names carry their units."""

    max_items: int = JAVA_INT_MAX
    max_size_bytes: int = JAVA_LONG_MAX
    max_item_size_bytes: int = JAVA_LONG_MAX
    max_age_ms: int | None = None
    discard_old_when_full: bool = False
    expire_to_queue: str | None = None
    max_expire_sweep: int = JAVA_INT_MAX
    max_queue_age_ms: int | None = None
    fanout_only: bool = False
    keep_journal: bool = True
    sync_journal_ms: int | None = None
    default_journal_size_bytes: int = 16 * 1024 * 1024
    max_memory_size_bytes: int = 128 * 1024 * 1024
    max_journal_size_bytes: int = 1024 * 1024 * 1024
    min_journal_compact_delay_ms: int | None = 60_000
    disable_aggressive_rewrites: bool = False
    open_transaction_timeout_ms: int | None = None
    enable_trace: bool = False


_QUEUE_FIELDS: dict[str, dataclasses.Field[Any]] = {
    item.name: item for item in dataclasses.fields(QueueConfig)
}
_OPTIONAL_INT_FIELDS = {
    "max_age_ms",
    "max_queue_age_ms",
    "sync_journal_ms",
    "min_journal_compact_delay_ms",
    "open_transaction_timeout_ms",
}
_BOOL_FIELDS = {
    "discard_old_when_full",
    "fanout_only",
    "keep_journal",
    "disable_aggressive_rewrites",
    "enable_trace",
}


@dataclass(frozen=True, slots=True)
class QueueBuilder:
    """The fields one config table specifies; everything else is inherited."""

    overrides: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, base: QueueConfig) -> QueueConfig:
        return dataclasses.replace(base, **dict(self.overrides))


@dataclass(frozen=True, slots=True)
class AliasConfig:
    destination_queues: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """The part of the configuration ``reload`` re-reads: defaults, queues and aliases."""

    default: QueueConfig = field(default_factory=QueueConfig)
    queues: Mapping[str, QueueBuilder] = field(default_factory=dict)
    aliases: Mapping[str, AliasConfig] = field(default_factory=dict)

    def config_for(self, name: str) -> QueueConfig:
        """The resolved config of queue ``name`` (spec §9 inheritance)."""
        if "+" in name:
            master = name.split("+", 1)[0]
            master_config = self.config_for(master)
            builder = self.queues.get(name)
            return builder.resolve(master_config) if builder is not None else master_config
        builder = self.queues.get(name)
        return builder.resolve(self.default) if builder is not None else self.default


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Server-wide settings (Kestrel's KestrelConfig), read once at start."""

    host: str = "127.0.0.1"
    port: int = 22133
    # Kestrel's textListenPort and thriftListenPort; None (``false`` in the file) turns the
    # protocol off. 0 means any free port, as for ``port``.
    text_port: int | None = 2222
    thrift_port: int | None = 2229
    max_open_transactions: int = 1
    expiration_timer_frequency_ms: int | None = None
    client_timeout_ms: int | None = None
    # Kestrel keeps the status in /tmp/.kestrel-status by default. Kayos keeps it in memory unless a
    # file is named, so one test run's READONLY never leaks into the next server started.
    status_file: str | None = None
    status_enabled: bool = True
    default_status: ServerStatus = ServerStatus.UP
    status_change_grace_period_ms: int = 0
    connection_limit_refuse_writes: int | None = None
    connection_limit_refuse_reads: int | None = None
    version: str = "2.4.1"
    # Stands in for the JVM's max heap in `reserved_memory_ratio` (sum of maxMemorySize / heap).
    memory_budget_bytes: int = 1024 * 1024 * 1024
    # The front's own identity toward a Kayos cluster that holds credentials: a credentials file
    # (docs/security.md); None: --credentials or KAYOS_CREDENTIALS, else none.
    kayos_credentials: str | None = None


@dataclass(frozen=True, slots=True)
class KestrelConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    queues: QueueSettings = field(default_factory=QueueSettings)


# --- loading ------------------------------------------------------------------------------------


def _check_int(where: str, value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value}")
    return value


def _queue_overrides(where: str, table: object) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    overrides: dict[str, Any] = {}
    for key, value in table.items():
        if key not in _QUEUE_FIELDS:
            raise ConfigError(f"{where}.{key}: unknown queue setting")
        path = f"{where}.{key}"
        if key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: expected true or false")
            overrides[key] = value
        elif key == "expire_to_queue":
            if not isinstance(value, str) or value == "":
                raise ConfigError(f"{path}: expected a queue name")
            overrides[key] = value
        elif key in _OPTIONAL_INT_FIELDS:
            overrides[key] = _check_int(path, value)
        else:
            overrides[key] = _check_int(path, value)
    return overrides


def parse_queue_settings(document: Mapping[str, Any]) -> QueueSettings:
    default = QueueBuilder(_queue_overrides("default", document.get("default", {}))).resolve(
        QueueConfig()
    )
    queues_table = document.get("queues", {})
    if not isinstance(queues_table, dict):
        raise ConfigError("queues: expected a table of queue tables")
    queues = {
        name: QueueBuilder(_queue_overrides(f"queues.{name}", table))
        for name, table in queues_table.items()
    }
    aliases_table = document.get("aliases", {})
    if not isinstance(aliases_table, dict):
        raise ConfigError("aliases: expected a table of alias tables")
    aliases: dict[str, AliasConfig] = {}
    for name, table in aliases_table.items():
        if not isinstance(table, dict) or set(table) - {"destination_queues"}:
            raise ConfigError(f"aliases.{name}: only destination_queues may be set")
        destinations = table.get("destination_queues", [])
        if not isinstance(destinations, list) or not all(
            isinstance(item, str) and item for item in destinations
        ):
            raise ConfigError(f"aliases.{name}.destination_queues: expected a list of names")
        aliases[name] = AliasConfig(tuple(destinations))
    return QueueSettings(default=default, queues=queues, aliases=aliases)


_SERVER_INT_FIELDS = {
    "port": 0,
    "max_open_transactions": 1,
    "expiration_timer_frequency_ms": 1,
    "client_timeout_ms": 1,
    "status_change_grace_period_ms": 0,
    "connection_limit_refuse_writes": 0,
    "connection_limit_refuse_reads": 0,
    "memory_budget_bytes": 1,
}


# A protocol's port, or false to turn the protocol off.
_OPTIONAL_PORT_FIELDS = ("text_port", "thrift_port")


def parse_server_config(table: object) -> ServerConfig:
    if not isinstance(table, dict):
        raise ConfigError("server: expected a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in _OPTIONAL_PORT_FIELDS:
            values[key] = None if value is False else _check_int(f"server.{key}", value)
        elif key in _SERVER_INT_FIELDS:
            values[key] = _check_int(f"server.{key}", value, minimum=_SERVER_INT_FIELDS[key])
        elif key in {"host", "status_file", "version", "kayos_credentials"}:
            if not isinstance(value, str) or value == "":
                raise ConfigError(f"server.{key}: expected a non-empty string")
            values[key] = value
        elif key == "status_enabled":
            if not isinstance(value, bool):
                raise ConfigError("server.status_enabled: expected true or false")
            values[key] = value
        elif key == "default_status":
            try:
                values[key] = ServerStatus[str(value).upper()]
            except KeyError:
                raise ConfigError(f"server.default_status: unknown status {value!r}") from None
        else:
            raise ConfigError(f"server.{key}: unknown server setting")
    for key in ("port", *_OPTIONAL_PORT_FIELDS):
        if (values.get(key) or 0) > 65535:
            raise ConfigError(f"server.{key}: must be at most 65535")
    return ServerConfig(**values)


def _read_document(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from error
    unknown = set(document) - {"server", "default", "queues", "aliases"}
    if unknown:
        raise ConfigError(f"{path}: unknown tables {sorted(unknown)}")
    return document


def load_config(path: str | Path | None) -> KestrelConfig:
    """The whole configuration; built-in defaults when ``path`` is None."""
    if path is None:
        return KestrelConfig()
    document = _read_document(Path(path))
    return KestrelConfig(
        server=parse_server_config(document.get("server", {})),
        queues=parse_queue_settings(document),
    )


def load_queue_settings(path: str | Path | None) -> QueueSettings:
    """What ``reload`` re-reads: the queue and alias part of the file."""
    if path is None:
        return QueueSettings()
    return parse_queue_settings(_read_document(Path(path)))
