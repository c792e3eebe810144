"""Java's parsing rules, as Kestrel's codecs inherit them: ``Integer.parseInt`` and ``split(" ")``.

Kestrel reads every number a client sends (flags, exptime, byte counts, ``t=``, counts, seconds,
timeouts) with ``Integer.parseInt`` and splits every request line with ``String.split(" ")``; the
memcache and text codecs and the GET key options all follow these two rules (spec §1.3).
"""

from __future__ import annotations

import re

from kestrel_compat import limits

# Integer.parseInt: an optional sign, then one or more ASCII digits; nothing else (no spaces, no
# underscores, no other scripts' digits, which Python's int() would all accept).
_JAVA_INT_PATTERN = re.compile(r"[+-]?[0-9]+")
# Unsigned digit strings this long or shorter are always Java ints (the largest has 10 digits).
_SAFE_DIGITS = 9
assert limits.java_int_max >= 10**_SAFE_DIGITS - 1


def parse_java_int(token: str) -> int | None:
    """``token`` read the way Kestrel reads every number; None where Java would throw."""
    if 0 < len(token) <= _SAFE_DIGITS and token.isascii() and token.isdigit():
        return int(token)  # The common case: a few ASCII digits, always in range.
    if _JAVA_INT_PATTERN.fullmatch(token) is None:
        return None
    value = int(token)
    if value < limits.java_int_min or value > limits.java_int_max:
        return None
    return value


def split_line(line: str) -> list[str]:
    """A request line's tokens as Java's ``String.split(" ")`` gives them.

    No space gives the line itself as the only token (even when empty); otherwise doubled spaces
    give empty tokens and trailing empty tokens are removed, so a line of spaces has no tokens.
    """
    if " " not in line:
        return [line]
    tokens = line.split(" ")
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens
