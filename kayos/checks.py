"""Checks of the values that cross an edge (HTTP API, binary port, client), in one place.

Every face calls these before anything is sent or takes a seq, so a value the wire or the store
cannot hold (an integer past u64, an empty key, a body nested past ``limits.json_depth_max``) is
an ``InvalidRequest`` (or ``LimitExceeded``) where it enters, never a failure further in (an
``OverflowError`` in an encoder, a ``RecursionError`` in a parser). Pure functions, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import accumulate

from kayos import limits
from kayos.errors import InvalidRequest, LimitExceeded


def check_u64(value: object, what: str, *, low: int = 0, high: int = limits.u64_max) -> int:
    """``value`` as an int in ``[low, high]`` (a bool is not an integer here)."""
    if type(value) is not int:
        raise InvalidRequest(f"{what} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidRequest(f"{what} must be in [{low}, {high}], not {value}")
    return value


def check_expiry_ms(value: object) -> int:
    """An absolute expiry, ms since the Unix epoch (0: never): a u64."""
    return check_u64(value, "expiry_ms")


def encode_text(text: str, what: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (JSON's ``"\ud800"``) has no UTF-8 form."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{what} is not valid Unicode text: {exc.reason}") from exc


def check_text(text: str, what: str) -> str:
    """``text`` if it has a UTF-8 form (msgpack packs every str as UTF-8)."""
    encode_text(text, what)
    return text


def check_group_name(group: str) -> str:
    """A consumer group: 1-128 printable characters (so UTF-8 text), no '/'."""
    if not group or len(group) > 128 or "/" in group or not group.isprintable():
        raise InvalidRequest(f"bad group name {group[:200]!r}: 1-128 printable characters, no '/'")
    return group


def check_item_key(key: bytes) -> bytes:
    """An item key as a producer gives it: 1 to ``limits.item_key_bytes_max`` bytes."""
    if not key:
        raise InvalidRequest("a key must not be empty")
    if len(key) > limits.item_key_bytes_max:
        raise LimitExceeded(f"item key of {len(key)} bytes over {limits.item_key_bytes_max}")
    return key


def check_item_keys(keys: Sequence[bytes]) -> None:
    """``check_item_key`` on a column, with the common case in C (``min``/``max`` of lengths)."""
    if not keys:
        return
    lengths = list(map(len, keys))
    if min(lengths) == 0 or max(lengths) > limits.item_key_bytes_max:
        for key in keys:
            check_item_key(key)


def check_expiries(expiries_ms: Sequence[int] | None) -> None:
    """Every expiry of a column is a u64 (the common case in C: a type set, ``min``, ``max``)."""
    if not expiries_ms:
        return
    if set(map(type, expiries_ms)) == {int} and (
        min(expiries_ms) >= 0 and max(expiries_ms) <= limits.u64_max
    ):
        return
    for expiry in expiries_ms:
        check_expiry_ms(expiry)


# A JSON string (its escapes included), matched possessively: strings may hold brackets. An
# unterminated string runs to the end of the text (a lone backslash included): were the closing
# quote required, every quote of a long unterminated run of escapes would start a scan to the end,
# and a 32 KB body would hold the event loop for seconds (quadratic).
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(_BRACKETS)))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(raw: bytes) -> int:
    """How deep a JSON text nests arrays and objects, found without parsing it (so without
    recursion): strings are cut out, the brackets left are counted up and down. A text with at
    most ``limits.json_depth_max`` openings answers their count (a bound of its depth, within the
    limit either way). For text that is not JSON the answer is some number; the parser then
    refuses the text anyway."""
    opens = raw.count(b"[") + raw.count(b"{")
    if opens <= limits.json_depth_max:
        return opens  # the depth is at most the number of openings: no need to look closer
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def check_json_depth(raw: bytes) -> None:
    """``InvalidRequest`` when a JSON body nests deeper than ``limits.json_depth_max``."""
    depth = json_depth(raw)
    if depth > limits.json_depth_max:
        raise InvalidRequest(
            f"JSON body nests {depth} levels deep, over json_depth_max={limits.json_depth_max}"
        )
