"""The memcache commands of Kestrel 2.x, declared as data (spec §1-§2, §5, §7).

Everything the codec needs to know about a command word lives in ``COMMANDS``: whether Kestrel
answers it at all, how many arguments it reads, what happens when one is missing, whether a storage
payload follows the line, and whether it ends the connection. ``memcache_codec`` derives its
dispatch from this table, ``docs/kestrel-compat.md`` carries the same table, and a test keeps
the two in step. The remaining columns (access, status refusal, queue creation) are the facts the
memcache session needs; the codec does not read them.

The module also declares the error classes of spec §1.3: reply bytes and whether the connection
closes afterwards. The number rule every command shares, Java's ``Integer.parseInt``, is
``kestrel_compat.wire.java``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# --- error classes (spec §1.3) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorClass:
    """One row of spec §1.3: the exact reply and whether the connection closes after it.

    Kestrel never follows an error keyword with text. ``reply`` is empty for the class where Kestrel
    closes the connection without writing anything (an exception it does not catch).
    """

    name: str
    reply: bytes
    close_after: bool


CLIENT_ERROR_KEEP = ErrorClass("client_error_keep", b"CLIENT_ERROR\r\n", close_after=False)
CLIENT_ERROR_CLOSE = ErrorClass("client_error_close", b"CLIENT_ERROR\r\n", close_after=True)
ERROR_KEEP = ErrorClass("error_keep", b"ERROR\r\n", close_after=False)
ERROR_CLOSE = ErrorClass("error_close", b"ERROR\r\n", close_after=True)
SERVER_ERROR_CLOSE = ErrorClass("server_error_close", b"SERVER_ERROR\r\n", close_after=True)
SILENT_CLOSE = ErrorClass("silent_close", b"", close_after=True)

ERROR_CLASSES: tuple[ErrorClass, ...] = (
    CLIENT_ERROR_KEEP,
    CLIENT_ERROR_CLOSE,
    ERROR_KEEP,
    ERROR_CLOSE,
    SERVER_ERROR_CLOSE,
    SILENT_CLOSE,
)

# --- the command table ---------------------------------------------------------------------------


class Access(enum.Enum):
    """What a command touches; the server-status rules of spec §7 are stated in these terms."""

    READ = "read"  # fetches or settles items: get, monitor, confirm
    WRITE = "write"  # changes what queues hold: set, delete, the flushes
    ADMIN = "admin"  # server-wide: version, stats, status, reload, shutdown, quit


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One memcache command as Kestrel 2.x frames and answers it.

    ``arguments_min`` arguments must follow the command word, else ``missing_argument`` is the
    answer. At most ``arguments_max`` are read (None: all of them); extra ones, such as memcache's
    ``noreply``, are ignored and every command is answered. When ``payload_length_argument`` is set
    the line is a storage line: that argument is the payload's byte count and the payload (plus two
    unchecked bytes) follows the line. An unsupported command is framed like the others (so its
    payload is consumed) and then answered with ``CLIENT_ERROR`` and a close.
    """

    name: str
    summary: str
    access: Access
    arguments_min: int = 0
    arguments_max: int | None = 0
    missing_argument: ErrorClass | None = None
    payload_length_argument: int | None = None
    supported: bool = True
    closes_connection: bool = False
    # How spec §7 refuses the command when the server status forbids it; None: never refused.
    status_refusal: ErrorClass | None = None
    # Whether the command creates the queue it names (spec §8.1). For get this holds only when the
    # options fetch an item (GetOptions.fetches).
    creates_queue: bool = False

    @property
    def payload(self) -> bool:
        """Whether a storage payload follows the request line."""
        return self.payload_length_argument is not None


def _storage(name: str, *, supported: bool) -> CommandSpec:
    # Kestrel's framing reads a payload for all six memcache storage commands, but only `set` is a
    # Kestrel command; the other five are answered CLIENT_ERROR and a close once the payload is in.
    return CommandSpec(
        name=name,
        summary="add an item to a queue" if supported else "memcache storage command; not Kestrel",
        access=Access.WRITE,
        arguments_min=4,
        arguments_max=4,
        missing_argument=SILENT_CLOSE,
        payload_length_argument=3,
        supported=supported,
        status_refusal=SERVER_ERROR_CLOSE if supported else None,
        creates_queue=supported,
    )


COMMANDS: tuple[CommandSpec, ...] = (
    _storage("set", supported=True),
    CommandSpec(
        name="get",
        summary="fetch, peek, open, close or abort a read (spec §3)",
        access=Access.READ,
        arguments_min=1,
        arguments_max=1,
        missing_argument=CLIENT_ERROR_KEEP,
        status_refusal=SERVER_ERROR_CLOSE,
        creates_queue=True,
    ),
    CommandSpec(
        name="gets",
        summary="the same as get",
        access=Access.READ,
        arguments_min=1,
        arguments_max=1,
        missing_argument=CLIENT_ERROR_KEEP,
        status_refusal=SERVER_ERROR_CLOSE,
        creates_queue=True,
    ),
    CommandSpec(
        name="delete",
        summary="drop a queue, its items and open reads",
        access=Access.WRITE,
        arguments_min=1,
        arguments_max=1,
        missing_argument=CLIENT_ERROR_KEEP,
        status_refusal=SERVER_ERROR_CLOSE,
    ),
    CommandSpec(
        name="flush",
        summary="remove a queue's available items",
        access=Access.WRITE,
        arguments_min=1,
        arguments_max=1,
        missing_argument=CLIENT_ERROR_KEEP,
        status_refusal=SERVER_ERROR_CLOSE,
    ),
    CommandSpec(
        name="flush_all",
        summary="flush every queue",
        access=Access.WRITE,
        status_refusal=SERVER_ERROR_CLOSE,
    ),
    CommandSpec(
        name="flush_expired",
        summary="discard a queue's expired items; reply is the count",
        access=Access.WRITE,
        arguments_min=1,
        arguments_max=1,
        missing_argument=SILENT_CLOSE,
        status_refusal=SILENT_CLOSE,
    ),
    CommandSpec(
        name="flush_all_expired",
        summary="discard every queue's expired items; reply is the count",
        access=Access.WRITE,
        status_refusal=SILENT_CLOSE,
    ),
    CommandSpec(
        name="version",
        summary="server version",
        access=Access.ADMIN,
    ),
    CommandSpec(
        name="stats",
        summary="global and per-queue STAT lines (spec §6)",
        access=Access.ADMIN,
    ),
    CommandSpec(
        name="dump_stats",
        summary="per-queue stats blocks, all queues or the ones named",
        access=Access.ADMIN,
        arguments_max=None,
    ),
    CommandSpec(
        name="monitor",
        summary="stream open reads for some seconds (spec §5)",
        access=Access.READ,
        arguments_min=2,
        arguments_max=3,
        missing_argument=SILENT_CLOSE,
        status_refusal=SILENT_CLOSE,
        creates_queue=True,
    ),
    CommandSpec(
        name="confirm",
        summary="confirm the n oldest open reads on a queue (spec §5)",
        access=Access.READ,
        arguments_min=2,
        arguments_max=2,
        missing_argument=CLIENT_ERROR_KEEP,
    ),
    CommandSpec(
        name="status",
        summary="show or set the server status (spec §7)",
        access=Access.ADMIN,
        arguments_max=1,
    ),
    CommandSpec(
        name="reload",
        summary="re-read queue and alias config",
        access=Access.ADMIN,
    ),
    CommandSpec(
        name="shutdown",
        summary="stop the server; no reply",
        access=Access.ADMIN,
        closes_connection=True,
    ),
    CommandSpec(
        name="quit",
        summary="close this connection; no reply",
        access=Access.ADMIN,
        closes_connection=True,
    ),
    _storage("add", supported=False),
    _storage("replace", supported=False),
    _storage("append", supported=False),
    _storage("prepend", supported=False),
    _storage("cas", supported=False),
    CommandSpec(
        name="dump_config",
        summary="removed in Kestrel 2.0 (the guide still lists it)",
        access=Access.ADMIN,
        supported=False,
    ),
)

COMMANDS_BY_NAME: dict[str, CommandSpec] = {spec.name: spec for spec in COMMANDS}


def _check_table() -> None:
    # The table is hand-written; these are the rules a row must keep for the codec to be right.
    assert len(COMMANDS_BY_NAME) == len(COMMANDS), "command names are unique"
    for spec in COMMANDS:
        assert spec.name == spec.name.lower(), "command words are matched lower-cased"
        assert " " not in spec.name
        assert spec.arguments_min >= 0
        assert spec.arguments_max is None or spec.arguments_max >= spec.arguments_min
        assert (spec.missing_argument is None) == (spec.arguments_min == 0)
        if spec.payload_length_argument is not None:
            assert spec.payload_length_argument < spec.arguments_min, "the count is never optional"
            assert spec.missing_argument is SILENT_CLOSE, "storage lines fail in the framing"
        assert not (spec.closes_connection and not spec.supported)
        assert spec.supported or spec.status_refusal is None


_check_table()
