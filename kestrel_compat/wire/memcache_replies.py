"""The memcache protocol's replies, as exact bytes (spec §1.2, §2, §5-§7).

The constants and encoders the memcache session (``kestrel_compat.sessions.memcache_session``)
writes; the error replies of spec §1.3 are the ``ErrorClass`` rows of ``memcache_commands``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from kestrel_compat.core.status import ServerStatus

STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
END = b"END\r\n"  # No item; also flush, /close, /abort, confirm, `status <s>`, the end of MONITOR.
DELETED = b"DELETED\r\n"
FLUSHED_ALL = b"Flushed all queues.\r\n"
RELOADED = b"Reloaded config.\r\n"
ERROR = b"ERROR\r\n"
CLIENT_ERROR = b"CLIENT_ERROR\r\n"
SERVER_ERROR = b"SERVER_ERROR\r\n"

StatValue: TypeAlias = str | int


def _text(value: str) -> bytes:
    # Everything the server echoes came off the wire as latin-1 or is ASCII it made itself; a line
    # break inside would split one reply line into two.
    assert "\r" not in value, "a reply field never holds a line break"
    assert "\n" not in value, "a reply field never holds a line break"
    return value.encode("latin-1")


def _stat_text(value: StatValue) -> bytes:
    assert not isinstance(value, bool), "stats are numbers or text, never booleans"
    return _text(str(value))


def encode_value(queue: str, data: bytes) -> bytes:
    """One item: ``VALUE <q> 0 <len>``, the data, ``END`` (spec §1.2). Flags are always 0.

    MONITOR sends this per item and then its own ``END`` (spec §5).
    """
    return b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (_text(queue), len(data), data)


def encode_count(count: int) -> bytes:
    """The reply of ``flush_expired``/``flush_all_expired``: the number discarded."""
    assert count >= 0
    return b"%d\r\n" % count


def encode_version(version: str) -> bytes:
    """``VERSION <version>``."""
    return b"VERSION %s\r\n" % _text(version)


def encode_status(status: ServerStatus) -> bytes:
    """The reply of a bare ``status``."""
    return b"%s\r\n" % _text(status.value)


def encode_stats(stats: Iterable[tuple[str, StatValue]]) -> bytes:
    """``STAT <name> <value>`` per pair, then ``END`` (spec §6). An empty value keeps its space."""
    lines = [b"STAT %s %s\r\n" % (_text(name), _stat_text(value)) for name, value in stats]
    return b"".join(lines) + END


def encode_dump_stats(queues: Iterable[tuple[str, Iterable[tuple[str, StatValue]]]]) -> bytes:
    """``dump_stats``: a block per queue, blocks joined by CRLF, then CRLF and ``END`` (spec §6).

    A block is ``queue '<q>' {``, then each ``  name=value``, then ``}``, one per line; a queue with
    no stats (an unknown name) gets one line of two spaces. No queues at all gives ``\\r\\nEND``.
    """
    blocks = []
    for queue, stats in queues:
        fields = b"\r\n  ".join(
            b"%s=%s" % (_text(name), _stat_text(value)) for name, value in stats
        )
        blocks.append(b"queue '%s' {\r\n  %s\r\n}" % (_text(queue), fields))
    return b"\r\n".join(blocks) + b"\r\n" + END
