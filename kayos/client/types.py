"""The client's value types, shared by the network client and embedded mode: what a producer hands
in (``Item``) and what a consumer gets back (``Message``, ``Page``, ``GroupInfo``).

Pure data and pure functions; no I/O. Keys and values may be given as ``str`` (UTF-8) or bytes and
are always handed back as bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from kayos import limits
from kayos.errors import InvalidRequest, LimitExceeded, ProtocolError

Acks: TypeAlias = Literal["all", 0, 1, -1]
Data: TypeAlias = bytes | str


@dataclass(frozen=True, slots=True)
class Item:
    """One message to produce. ``value=None`` deletes the key (consumers see a tombstone).
    ``expiry_ms`` is absolute, ms since the Unix epoch (0: never)."""

    key: Data
    value: Data | None
    expiry_ms: int = 0
    headers: Mapping[str, Data] | None = None


ItemLike: TypeAlias = Item | tuple[Data, Data | None] | tuple[Data, Data | None, int]


@dataclass(frozen=True, slots=True)
class Message:
    """One consumed version: ``value`` is None and ``deleted`` True for a tombstone."""

    seq: int
    key: bytes
    value: bytes | None
    expiry_ms: int = 0
    headers: dict[str, bytes] | None = None
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a consumer snapshot ``(hwm, boundary]``. ``end`` marks the last page: the
    snapshot is exhausted and the consumer may commit ``hwm = boundary``."""

    shard: int
    group: str
    hwm: int
    boundary: int
    messages: tuple[Message, ...]
    next: int
    end: bool


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group: its high-water mark, the shard's committed boundary and the lag."""

    hwm: int
    boundary: int
    lag: int
    state: bytes | None = None


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """A committed high-water mark and the seq its commit claimed."""

    hwm: int
    seq: int


def as_bytes(data: Data, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    raise InvalidRequest(f"{what} must be bytes or str, not {type(data).__name__}")


def acks_code(acks: Acks) -> int:
    """The wire value of ``acks``: 0 accepted, 1 durable on the head, -1 committed (all)."""
    if acks == "all" or acks == -1:
        return -1
    if acks == 1 and acks is not True:
        return 1
    if acks == 0 and acks is not False:
        return 0
    raise InvalidRequest(f"acks must be 'all', 1 or 0, not {acks!r}")


def acks_param(acks: Acks) -> str:
    """The HTTP query value of ``acks``."""
    code = acks_code(acks)
    return "all" if code == -1 else str(code)


@dataclass(frozen=True, slots=True)
class Columns:
    """A batch in the column layout of ``PRODUCE``: all four columns have one entry per item;
    ``expiries_ms``/``headers`` are None when no item has one (the frame's compact encoding)."""

    keys: tuple[bytes, ...]
    values: tuple[bytes | None, ...]
    expiries_ms: tuple[int, ...] | None
    headers: tuple[dict[str, bytes] | None, ...] | None

    def __len__(self) -> int:
        return len(self.keys)

    def to_messages(self) -> list[dict[str, Any]]:
        """The HTTP body's ``messages`` list."""
        out: list[dict[str, Any]] = []
        for index, key in enumerate(self.keys):
            message: dict[str, Any] = {"key": key, "value": self.values[index]}
            if self.expiries_ms is not None and self.expiries_ms[index]:
                message["expiry_ms"] = self.expiries_ms[index]
            if self.headers is not None and self.headers[index] is not None:
                message["headers"] = self.headers[index]
            out.append(message)
        return out


def to_item(item: ItemLike) -> Item:
    if isinstance(item, Item):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        return Item(item[0], item[1])
    if isinstance(item, tuple) and len(item) == 3:
        return Item(item[0], item[1], item[2])
    raise InvalidRequest(f"an item is Item, (key, value) or (key, value, expiry_ms): {item!r}")


def to_columns(items: Iterable[ItemLike]) -> Columns:
    """Checks and converts items; raises ``InvalidRequest``/``LimitExceeded`` before anything is
    sent, so a batch the node would refuse never costs a round trip."""
    keys: list[bytes] = []
    values: list[bytes | None] = []
    expiries: list[int] = []
    headers: list[dict[str, bytes] | None] = []
    for raw in items:
        item = to_item(raw)
        key = as_bytes(item.key, "a key")
        if not 1 <= len(key) <= limits.item_key_bytes_max:
            raise LimitExceeded(f"item key of {len(key)} bytes: 1 to {limits.item_key_bytes_max}")
        value = None if item.value is None else as_bytes(item.value, "a value")
        if value is not None and len(value) > limits.value_bytes_max:
            raise LimitExceeded(f"value of {len(value)} bytes over {limits.value_bytes_max}")
        if type(item.expiry_ms) is not int or item.expiry_ms < 0:
            raise InvalidRequest(f"expiry_ms must be an int >= 0, not {item.expiry_ms!r}")
        keys.append(key)
        values.append(value)
        expiries.append(item.expiry_ms)
        headers.append(_headers(item.headers))
    if not keys:
        raise InvalidRequest("a batch needs at least one item")
    if len(keys) > limits.batch_entries_max:
        raise LimitExceeded(f"batch of {len(keys)} items over {limits.batch_entries_max}")
    return Columns(
        tuple(keys),
        tuple(values),
        tuple(expiries) if any(expiries) else None,
        tuple(headers) if any(h is not None for h in headers) else None,
    )


def _headers(headers: Mapping[str, Data] | None) -> dict[str, bytes] | None:
    if headers is None:
        return None
    out: dict[str, bytes] = {}
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidRequest(f"header names are str, not {type(name).__name__}")
        out[name] = as_bytes(value, f"header {name!r}")
    return out


# --- replies -------------------------------------------------------------------------------------


def message_from_reply(raw: Any) -> Message:
    """One message of a consume reply (msgpack: keys and values are bytes)."""
    try:
        headers = raw.get("headers")
        return Message(
            seq=int(raw["seq"]),
            key=_reply_bytes(raw["key"]),
            value=None if raw.get("value") is None else _reply_bytes(raw["value"]),
            expiry_ms=int(raw.get("expiry_ms") or 0),
            headers=None if not headers else {str(k): _reply_bytes(v) for k, v in headers.items()},
            deleted=bool(raw.get("deleted", raw.get("value") is None)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed message in a consume reply: {exc!r}") from exc


def page_from_reply(raw: Any) -> Page:
    """A consume reply as a ``Page``; a reply that breaks the contract is a ``ProtocolError``."""
    try:
        page = Page(
            shard=int(raw["shard"]),
            group=str(raw["group"]),
            hwm=int(raw["hwm"]),
            boundary=int(raw["boundary"]),
            messages=tuple(message_from_reply(m) for m in raw["messages"]),
            next=int(raw["next"]),
            end=bool(raw["end"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed consume reply: {exc!r}") from exc
    check_page(page)
    return page


def check_page(page: Page) -> None:
    """A page's invariants: seqs increase strictly within ``(hwm, boundary]``."""
    if page.hwm > page.boundary:
        raise ProtocolError(f"page hwm {page.hwm} above its boundary {page.boundary}")
    previous = page.hwm
    for message in page.messages:
        if not previous < message.seq <= page.boundary:
            raise ProtocolError(
                f"page seq {message.seq} out of order or outside ({page.hwm}, {page.boundary}]"
            )
        previous = message.seq


def group_from_reply(raw: Any) -> GroupInfo:
    try:
        state = raw.get("state")
        return GroupInfo(
            hwm=int(raw["hwm"]),
            boundary=int(raw["boundary"]),
            lag=int(raw["lag"]),
            state=None if state is None else _reply_bytes(state),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed group reply: {exc!r}") from exc


def _reply_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):  # a JSON reply, or a node that sent text
        return value.encode()
    raise TypeError(f"expected bytes, got {type(value).__name__}")


class Transaction:
    """Puts and deletes collected inside ``transaction(queue)``; produced on a clean exit as one
    all-or-nothing batch, with ``result`` its ``(first_seq, last_seq)``. Nothing is produced if
    the block raises."""

    __slots__ = ("items", "queue", "result")

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.items: list[Item] = []
        self.result: tuple[int, int] | None = None

    def put(
        self,
        key: Data,
        value: Data,
        *,
        expiry_ms: int = 0,
        headers: Mapping[str, Data] | None = None,
    ) -> None:
        if self.result is not None:
            raise InvalidRequest("the transaction was produced already")
        self.items.append(Item(key, value, expiry_ms, headers))

    def delete(self, key: Data) -> None:
        if self.result is not None:
            raise InvalidRequest("the transaction was produced already")
        self.items.append(Item(key, None))

    def __len__(self) -> int:
        return len(self.items)
