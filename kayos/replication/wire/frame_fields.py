"""The field types of the frame table: each one's name in the protocol document and its check.

``docs/replication-protocol.md`` names a type for every field of every frame (``u64``,
``[bin | nil]``, ``takeover``...); a ``WireType`` here is that name with the check a value must
pass, and the count of msgpack arrays and maps a value may decode into. ``frame_table`` builds
its rows from them, and the frames check their fields against them when built.

Apart from ``frames`` (the codec) and ``frame_table`` (the frames) because a type's check knows
nothing of frames or bytes: it is the one place that says what a well-formed field value is.
Column checks run in C (``frozenset.issuperset(map(type, column))``, ``min``, ``max``): no Python
bytecode runs per entry, except for the per-entry headers maps msgpack itself builds.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Final

from kayos import limits

# HELLO's role field: a client, the connector's role in the shard's chain, or a copy that counts
# in no commit: a learner (a node outside the chain catching up) or a member repairing its store.
CHAIN_ROLES: Final = frozenset({"head", "middle", "tail"})
COPY_ROLES: Final = frozenset({"learner", "repair"})
ROLES: Final = frozenset({"client"}) | CHAIN_ROLES | COPY_ROLES

# PRODUCE's acks field, Kafka's numbering: answer when accepted, durable on the head, or committed.
ACKS_NONE: Final = 0
ACKS_HEAD: Final = 1
ACKS_ALL: Final = -1

_U64_END: Final = 1 << 64
_UUID_BYTES: Final = 16
# An HMAC-SHA256 digest.
MAC_BYTES: Final = 32


# --- field types ---------------------------------------------------------------------------------

_INT_TYPES: Final[frozenset[type]] = frozenset({int})
_BYTES_TYPES: Final[frozenset[type]] = frozenset({bytes})
_BYTES_OR_NONE_TYPES: Final[frozenset[type]] = frozenset({bytes, type(None)})
_DICT_OR_NONE_TYPES: Final[frozenset[type]] = frozenset({dict, type(None)})
_STR_TYPES: Final[frozenset[type]] = frozenset({str})
_META_VALUE_TYPES: Final[frozenset[type]] = frozenset({int, bytes, type(None)})


@dataclasses.dataclass(frozen=True, slots=True)
class WireType:
    """One field type of the table: its name in the protocol document and its check.

    ``arrays_max`` and ``maps_max`` say how many msgpack arrays and maps a value of this type may
    decode into; the decoder refuses a body that builds more containers than its frame's fields
    allow, so a small frame cannot make msgpack allocate an unbounded number of objects.
    """

    name: str
    check: Callable[[object], bool]
    arrays_max: int = 0
    maps_max: int = 0


def _unsigned(bits: int) -> Callable[[object], bool]:
    end = 1 << bits

    def check(value: object) -> bool:
        return type(value) is int and 0 <= value < end

    return check


def optional(wire: WireType) -> WireType:
    def check(value: object) -> bool:
        return value is None or wire.check(value)

    return WireType(f"{wire.name} | nil", check, wire.arrays_max, wire.maps_max)


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_role(value: object) -> bool:
    return type(value) is str and value in ROLES


def _is_acks(value: object) -> bool:
    return type(value) is int and value in (ACKS_NONE, ACKS_HEAD, ACKS_ALL)


def _is_column(value: object, element_types: frozenset[type]) -> bool:
    # issuperset over map(type, ...) runs in C and stops at the first stray type.
    return (
        type(value) is tuple
        and len(value) <= limits.batch_entries_max
        and element_types.issuperset(map(type, value))
    )


def _is_u64_column(value: object) -> bool:
    if not _is_column(value, _INT_TYPES):
        return False
    assert isinstance(value, tuple)
    return not value or (min(value) >= 0 and max(value) < _U64_END)


def _is_bytes_column(value: object) -> bool:
    return _is_column(value, _BYTES_TYPES)


def _is_optional_bytes_column(value: object) -> bool:
    return _is_column(value, _BYTES_OR_NONE_TYPES)


def _is_headers_column(value: object) -> bool:
    if not _is_column(value, _DICT_OR_NONE_TYPES):
        return False
    assert isinstance(value, tuple)
    # filter(None, ...) skips nil and empty maps; iterating a map yields its keys.
    maps = tuple(filter(None, value))
    header_names = itertools.chain.from_iterable(maps)
    if not _STR_TYPES.issuperset(map(type, header_names)):
        return False
    header_values = itertools.chain.from_iterable(map(dict.values, maps))
    return _BYTES_TYPES.issuperset(map(type, header_values))


def _is_takeover_table(value: object) -> bool:
    if type(value) is not tuple or len(value) > limits.takeover_table_entries_max:
        return False
    previous_seq = 0
    for entry in value:
        if type(entry) is not tuple or len(entry) != 2:
            return False
        master_uuid, seq = entry
        if type(master_uuid) is not bytes or len(master_uuid) != _UUID_BYTES:
            return False
        if type(seq) is not int or not previous_seq <= seq < _U64_END:
            return False
        previous_seq = seq
    # The divergence rule looks masters up by uuid, so each may appear once.
    return len({master_uuid for master_uuid, _ in value}) == len(value)


def _is_meta(value: object) -> bool:
    if type(value) is not dict or len(value) > limits.frame_meta_entries_max:
        return False
    if not _STR_TYPES.issuperset(map(type, value)):
        return False
    if not _META_VALUE_TYPES.issuperset(map(type, value.values())):
        return False
    return all(0 <= item < _U64_END for item in value.values() if type(item) is int)


def _exact_bytes(size: int) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        return type(value) is bytes and len(value) == size

    return check


U16: Final = WireType("u16", _unsigned(16))
UUID: Final = WireType("uuid", _exact_bytes(_UUID_BYTES))
NONCE: Final = WireType("nonce", _exact_bytes(limits.auth_nonce_bytes))
MAC: Final = WireType("mac", _exact_bytes(MAC_BYTES))
U32: Final = WireType("u32", _unsigned(32))
U64: Final = WireType("u64", _unsigned(64))
BOOL: Final = WireType("bool", _is_bool)
STR: Final = WireType("str", _is_str)
ROLE: Final = WireType("role", _is_role)
ACKS: Final = WireType("acks (0, 1 or -1)", _is_acks)
U64_COLUMN: Final = WireType("[u64]", _is_u64_column, arrays_max=1)
BYTES_COLUMN: Final = WireType("[bin]", _is_bytes_column, arrays_max=1)
VALUES_COLUMN: Final = WireType("[bin | nil]", _is_optional_bytes_column, arrays_max=1)
HEADERS_COLUMN: Final = WireType(
    "[headers | nil]", _is_headers_column, arrays_max=1, maps_max=limits.batch_entries_max
)
TAKEOVER: Final = WireType(
    "takeover", _is_takeover_table, arrays_max=1 + limits.takeover_table_entries_max
)
META: Final = WireType("meta", _is_meta, maps_max=1)


def _is_snapshot_data(value: object) -> bool:
    return type(value) is bytes and 0 < len(value) <= limits.snapshot_chunk_bytes_max


SNAPSHOT_DATA: Final = WireType("bin (1 .. snapshot_chunk_bytes_max)", _is_snapshot_data)


def describe(value: object) -> str:
    """Describe a rejected value for an error message: its type, and the value if small."""
    if value is None or type(value) in (bool, int, float):
        return f"{type(value).__name__} {value!r}"
    if type(value) in (str, bytes):
        text = repr(value)
        return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, (tuple, list, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
