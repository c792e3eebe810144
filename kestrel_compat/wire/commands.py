"""The commands more than one Kestrel protocol carries, declared once.

The memcache and text protocols ask for the same six things with the same words and arguments:
``confirm <q> <n>``, ``delete <q>``, ``flush <q>``, ``version``, ``shutdown`` and ``quit``; both
codecs parse them into these dataclasses, and each session answers them in its own protocol's
words. ``Close`` is what the text and thrift codecs return when Kestrel would close the connection
without a word. Commands only one protocol has are declared beside its codec
(``memcache_commands``, ``text_codec``, ``thrift_codec``): the thrift calls carry a sequence id and
the IDL's fields, and the memcache and text fetches, puts, monitors and status requests differ in
what the client sends, so they are not the same commands.

Queue names are the latin-1 decoding of the wire bytes, so every byte is one character and
``name.encode("latin-1")`` gives the bytes back. ``command`` is the request's word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class Confirm:
    """``confirm <q> <n>``: confirm the n oldest open reads on q (spec §5, §10)."""

    command: ClassVar[str] = "confirm"
    queue: str
    count: int


@dataclass(frozen=True, slots=True)
class Delete:
    """``delete <q>``: drop a queue, its items and open reads."""

    command: ClassVar[str] = "delete"
    queue: str


@dataclass(frozen=True, slots=True)
class Flush:
    """``flush <q>``: remove a queue's available items."""

    command: ClassVar[str] = "flush"
    queue: str


@dataclass(frozen=True, slots=True)
class Version:
    command: ClassVar[str] = "version"


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the server. Memcache: no reply, the connection closes (spec §2); text: ``+0``."""

    command: ClassVar[str] = "shutdown"


@dataclass(frozen=True, slots=True)
class Quit:
    """No reply; the connection closes (spec §2, §10)."""

    command: ClassVar[str] = "quit"


@dataclass(frozen=True, slots=True)
class Close:
    """Kestrel closes the connection without a word (text), or nothing can be answered (thrift).

    ``reason`` is for logs only; it is never sent and plays no part in equality.
    """

    reason: str = field(default="", compare=False)
