"""A batch before it is queued: ops as columns, every bound checked and each entry measured
(``prepare_columns``), and the metadata check.

Separate from the engine because the node and the replicas check and measure batches themselves
before they reach a store (kayos.node.runtime, kayos.replication.shard.replica).
"""

from __future__ import annotations

from operator import add, attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack

from kayos import limits
from kayos.errors import InvalidRequest, LimitExceeded
from kayos.storage.records import Delete, Op, Put

if TYPE_CHECKING:
    from collections.abc import Sequence


class BatchColumns(NamedTuple):
    """One batch as columns, checked and measured by ``prepare_columns``: entry i is
    ``keys[i]``, ``values[i]`` (None for a delete) and the optional columns' item i."""

    keys: Sequence[bytes]
    values: Sequence[bytes | None]
    expiries_ms: Sequence[int] | None  # None when every entry's is 0
    headers: Sequence[dict[str, bytes] | None] | None  # None when no entry has any
    sizes: list[int]  # payload bytes of each entry: key + value + packed headers
    payload_bytes: int
    plain: bool  # no deletes and every value inline: the leaf takes the values as they are


_BYTES_TYPES = frozenset({bytes})
_VALUE_TYPES = frozenset({bytes, type(None)})
_EXPIRY_TYPES = frozenset({int})
_op_key = attrgetter("key")
_op_value = attrgetter("value")
_op_expiry = attrgetter("expiry_ms")
_op_headers = attrgetter("headers")


def _packed_headers_size(headers: dict[str, bytes] | None) -> int:
    if not headers:
        return 0
    return len(msgpack.packb(headers, use_bin_type=True))


def validate_meta(meta: dict[str, Any] | None) -> None:
    """Refuses metadata the meta chunk cannot hold before it is queued: in a group commit it
    would otherwise fail every batch of the group."""
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise InvalidRequest("metadata must be a dict")
    try:
        packed = msgpack.packb(meta, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"metadata cannot be encoded: {exc}") from exc
    if len(packed) >= limits.chunk_bytes_max:
        raise LimitExceeded(f"metadata of {len(packed)} bytes exceeds {limits.chunk_bytes_max}")


def ops_to_columns(
    ops: Sequence[Op],
) -> tuple[list[bytes], list[bytes | None], list[int] | None, list[dict[str, bytes] | None] | None]:
    """(keys, values, expiries_ms, headers) of ``ops``; a delete's value is None."""
    if len(ops) > limits.batch_entries_max:
        raise LimitExceeded(f"batch of {len(ops)} entries exceeds {limits.batch_entries_max}")
    kinds = set(map(type, ops))
    if kinds <= {Put}:  # every op a Put: one C-level pass per column
        keys: list[bytes] = list(map(_op_key, ops))
        values: list[bytes | None] = list(map(_op_value, ops))
        expiries: list[int] = list(map(_op_expiry, ops))
        headers: list[dict[str, bytes] | None] = list(map(_op_headers, ops))
    else:
        keys, values, expiries, headers = [], [], [], []
        for op in ops:
            if isinstance(op, Put):
                values.append(op.value)
                expiries.append(op.expiry_ms)
                headers.append(op.headers)
            elif isinstance(op, Delete):
                values.append(None)
                expiries.append(0)
                headers.append(None)
            else:
                raise _unknown_operation(op, keys, values, expiries, headers)
            keys.append(op.key)
    return keys, values, expiries if any(expiries) else None, headers if any(headers) else None


def _unknown_operation(
    op: object,
    keys: list[bytes],
    values: list[bytes | None],
    expiries_ms: list[int],
    headers: list[dict[str, bytes] | None],
) -> InvalidRequest:
    """The error for an op that is neither a Put nor a Delete, unless one of the ops before it
    breaks a bound: that is raised instead, as an entry-by-entry check would."""
    _check_entries(keys, values, expiries_ms, headers)
    return InvalidRequest(f"unknown operation {type(op).__name__}")


def validate_ops(ops: Sequence[Op]) -> int:
    """Checks every bound; returns the batch's payload bytes. Raises before anything is queued."""
    return prepare_columns(*ops_to_columns(ops)).payload_bytes


def prepare_columns(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    expiries_ms: Sequence[int] | None = None,
    headers: Sequence[dict[str, bytes] | None] | None = None,
    *,
    check: bool = True,
) -> BatchColumns:
    """Checks a batch's columns against every bound (unless ``check`` is False: the caller
    checked them) and measures each entry. Raises before anything is queued.

    The common batch (bytes keys and values within bounds, valid expiries) is checked with a few
    C-level passes per column; any other is checked entry by entry, so the error raised is the
    first one in entry order, whatever the batch's shape."""
    count = len(keys)
    if count > limits.batch_entries_max:
        raise LimitExceeded(f"batch of {count} entries exceeds {limits.batch_entries_max}")
    if (
        len(values) != count
        or (expiries_ms is not None and len(expiries_ms) != count)
        or (headers is not None and len(headers) != count)
    ):
        raise InvalidRequest("keys, values, expiries and headers differ in length")
    if expiries_ms is not None and not any(expiries_ms):
        expiries_ms = None
    if headers is not None and not any(headers):
        headers = None
    deletes = None in values
    # Entry by entry only when a C-level pass finds something off; once is enough.
    checked = not check
    if not checked and not _types_look_valid(keys, values, expiries_ms, deletes):
        _check_entries(keys, values, expiries_ms, headers)
        checked = True
    key_bytes = list(map(len, keys))
    if deletes:
        value_bytes = [0 if value is None else len(value) for value in values]
    else:
        value_bytes = list(map(len, values))  # type: ignore[arg-type]
    if not checked and not _bounds_hold(key_bytes, value_bytes, expiries_ms):
        _check_entries(keys, values, expiries_ms, headers)
    sizes = list(map(add, key_bytes, value_bytes))
    if headers is not None or (deletes and expiries_ms is not None):
        expiries_ms, headers = _entry_options(values, expiries_ms, headers, sizes, check=check)
    payload = sum(sizes)
    if check and payload > limits.batch_bytes_max:
        raise LimitExceeded(f"batch of {payload} bytes exceeds {limits.batch_bytes_max}")
    plain = not deletes and max(value_bytes, default=0) <= limits.value_inline_bytes_max
    return BatchColumns(keys, values, expiries_ms, headers, sizes, payload, plain)


def _types_look_valid(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    expiries_ms: Sequence[int] | None,
    deletes: bool,
) -> bool:
    """True when every key and value is bytes (a value may be None) and every expiry an int."""
    if keys and set(map(type, keys)) != _BYTES_TYPES:
        return False
    if values and not set(map(type, values)) <= (_VALUE_TYPES if deletes else _BYTES_TYPES):
        return False
    return expiries_ms is None or set(map(type, expiries_ms)) <= _EXPIRY_TYPES


def _bounds_hold(
    key_bytes: list[int], value_bytes: list[int], expiries_ms: Sequence[int] | None
) -> bool:
    """True when no key, value or expiry breaks a bound (headers are measured later)."""
    if key_bytes and (min(key_bytes) == 0 or max(key_bytes) > limits.key_bytes_max):
        return False
    if value_bytes and max(value_bytes) > limits.value_bytes_max:
        return False
    return expiries_ms is None or (min(expiries_ms) >= 0 and max(expiries_ms) <= limits.u64_max)


def _check_entries(
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    expiries_ms: Sequence[int] | None,
    headers: Sequence[dict[str, bytes] | None] | None,
) -> None:
    """Checks the entries one at a time, in order; raises at the first that breaks a bound. A
    delete has only a key: its headers are not looked at."""
    for index, key in enumerate(keys):
        if not isinstance(key, bytes) or not key:
            raise InvalidRequest("every key must be non-empty bytes")
        if len(key) > limits.key_bytes_max:
            raise LimitExceeded(f"key of {len(key)} bytes exceeds {limits.key_bytes_max}")
        # Even a delete's expiry is checked: the column goes down the chain as it is (u64).
        expiry = expiries_ms[index] if expiries_ms is not None else 0
        if not isinstance(expiry, int):
            raise InvalidRequest("expiry_ms must be an int")
        if expiry < 0:
            raise InvalidRequest("expiry_ms must be >= 0")
        if expiry > limits.u64_max:
            raise InvalidRequest(f"expiry_ms must be <= {limits.u64_max} (u64)")
        value = values[index]
        if value is None:
            continue
        if not isinstance(value, bytes):
            raise InvalidRequest("values must be bytes")
        if len(value) > limits.value_bytes_max:
            raise LimitExceeded(f"value of {len(value)} bytes exceeds {limits.value_bytes_max}")
        header_bytes = _packed_headers_size(headers[index] if headers is not None else None)
        if header_bytes > limits.headers_bytes_max:
            raise LimitExceeded(
                f"headers of {header_bytes} bytes exceed {limits.headers_bytes_max}"
            )


def _entry_options(
    values: Sequence[bytes | None],
    expiries_ms: Sequence[int] | None,
    headers: Sequence[dict[str, bytes] | None] | None,
    sizes: list[int],
    *,
    check: bool,
) -> tuple[list[int] | None, list[dict[str, bytes] | None] | None]:
    """The expiry and headers columns as stored (a delete has neither, empty headers are none);
    adds each entry's packed headers to its size."""
    stored_expiries: list[int] | None = None
    if expiries_ms is not None:
        stored_expiries = [
            0 if value is None else expiry
            for value, expiry in zip(values, expiries_ms, strict=True)
        ]
        if not any(stored_expiries):
            stored_expiries = None
    if headers is None:
        return stored_expiries, None
    stored_headers: list[dict[str, bytes] | None] = [None] * len(values)
    for index, header_map in enumerate(headers):
        if not header_map or values[index] is None:
            continue
        header_bytes = _packed_headers_size(header_map)
        if check and header_bytes > limits.headers_bytes_max:
            raise LimitExceeded(
                f"headers of {header_bytes} bytes exceed {limits.headers_bytes_max}"
            )
        stored_headers[index] = header_map
        sizes[index] += header_bytes
    return stored_expiries, stored_headers if any(stored_headers) else None
