"""GET key options: ``work/t=500/close/open`` to a queue name and ``GetOptions`` (spec §3.1-§3.2).

A GET key is split on ``/`` the way Java's ``String.split("/")`` splits it: empty parts between
slashes stay, trailing empty parts are dropped, and a key with no slash is one part. Part 0 is the
queue name; every later part is an option: ``t=<ms>``, ``open``, ``close``, ``abort``, ``peek``,
matched exactly (case-sensitive). Any other part is ignored, so ``get q/xyz`` is ``get q``.

The checks run in the order Kestrel runs them, and the order decides which reply a key with two
faults gets:

1. A key made only of slashes splits into no parts: ``CLIENT_ERROR``, connection kept.
2. The options are read left to right; a ``t=`` that is not a Java int closes the connection with
   nothing sent, before any later check.
3. An empty queue name or a forbidden combination (``peek`` with ``open``/``close``/``abort``,
   ``abort`` with ``open``/``close``): ``CLIENT_ERROR`` and the connection closes.

Pure: no clock (``t=`` stays relative milliseconds), no queue state.
"""

from __future__ import annotations

from dataclasses import dataclass

from kayos.errors import InvalidRequest
from kestrel_compat.wire.java import parse_java_int
from kestrel_compat.wire.memcache_commands import (
    CLIENT_ERROR_CLOSE,
    CLIENT_ERROR_KEEP,
    SILENT_CLOSE,
    ErrorClass,
)

_TIMEOUT_PREFIX = "t="


class GetOptionsError(InvalidRequest):
    """A GET key Kestrel refuses; ``error_class`` holds the exact reply and whether to close."""

    code = "kestrel_get_options"

    def __init__(self, message: str, *, error_class: ErrorClass) -> None:
        super().__init__(message)
        self.error_class = error_class


@dataclass(frozen=True, slots=True)
class GetOptions:
    """The options of one GET, after Kestrel's exclusivity rules have been checked.

    ``timeout_ms`` is the last ``t=`` given, in milliseconds relative to when the GET is served
    (None: none given; zero or negative: do not wait). The four flags are the wire words.
    """

    timeout_ms: int | None = None
    open: bool = False
    close: bool = False
    abort: bool = False
    peek: bool = False

    def __post_init__(self) -> None:
        # The parser never builds a forbidden combination; constructing one by hand is a bug.
        assert not (self.peek and (self.open or self.close)), "peek excludes open and close"
        assert not (self.abort and (self.open or self.close)), "abort excludes open and close"
        assert not (self.peek and self.abort), "peek excludes abort"

    @property
    def fetches(self) -> bool:
        """Whether the GET looks at an item: every form except ``close`` alone and ``abort``.

        Only a fetching GET creates its queue, counts in ``cmd_get``/``cmd_peek`` and can be refused
        by the server status (spec §3.3, §7, §8.1).
        """
        if self.abort:
            return False
        return self.open or not self.close

    @property
    def removes(self) -> bool:
        """Whether the GET takes the head item away (for good, or as an open read)."""
        return self.fetches and not self.peek


@dataclass(frozen=True, slots=True)
class GetKey:
    """A parsed GET key: the bare queue name (what VALUE echoes) and its options."""

    queue: str
    options: GetOptions


def _split_key(key: str) -> list[str]:
    # Java's String.split with a one-character literal: no match gives the whole string as the only
    # part (even when empty); otherwise trailing empty parts are removed.
    if "/" not in key:
        return [key]
    parts = key.split("/")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def parse_get_key(key: str) -> GetKey:
    """Split a GET key into queue name and options, or raise ``GetOptionsError``."""
    parts = _split_key(key)
    if not parts:
        raise GetOptionsError("key is only slashes", error_class=CLIENT_ERROR_KEEP)
    queue = parts[0]
    timeout_ms: int | None = None
    flags = {"open": False, "close": False, "abort": False, "peek": False}
    for part in parts[1:]:
        if part.startswith(_TIMEOUT_PREFIX):
            timeout_ms = parse_java_int(part[len(_TIMEOUT_PREFIX) :])
            if timeout_ms is None:
                raise GetOptionsError(f"t= is not a Java int: {part!r}", error_class=SILENT_CLOSE)
        elif part in flags:
            flags[part] = True
    if queue == "":
        raise GetOptionsError("empty queue name", error_class=CLIENT_ERROR_CLOSE)
    peek, abort = flags["peek"], flags["abort"]
    transaction = flags["open"] or flags["close"]
    if (peek or abort) and transaction:
        raise GetOptionsError("peek/abort with open/close", error_class=CLIENT_ERROR_CLOSE)
    if peek and abort:
        raise GetOptionsError("peek with abort", error_class=CLIENT_ERROR_CLOSE)
    options = GetOptions(
        timeout_ms=timeout_ms,
        open=flags["open"],
        close=flags["close"],
        abort=abort,
        peek=peek,
    )
    return GetKey(queue=queue, options=options)


def format_get_key(queue: str, options: GetOptions) -> str:
    """The key a client sends for ``queue`` with ``options``; ``parse_get_key`` inverts it."""
    assert queue != "", "an empty queue name is refused"
    assert "/" not in queue, "a slash would start the options"
    parts = [queue]
    if options.timeout_ms is not None:
        parts.append(f"{_TIMEOUT_PREFIX}{options.timeout_ms}")
    words = (
        ("close", options.close),
        ("open", options.open),
        ("abort", options.abort),
        ("peek", options.peek),
    )
    parts.extend(word for word, given in words if given)
    return "/".join(parts)
