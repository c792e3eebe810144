"""The client's value types, shared by the network client and embedded mode: what a producer hands
in (``Item``) and what a consumer gets back (``Message``, ``Page``, ``GroupInfo``).

Pure data and pure functions; no I/O. Keys and values may be given as ``str`` (UTF-8) or bytes and
are always handed back as bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from operator import eq, lt
from typing import Any, Literal, NamedTuple, TypeAlias, overload

from kayos import limits
from kayos.checks import check_expiry_ms, check_item_key, check_text, encode_text
from kayos.client.times import known_times, samples_from_reply, times_of
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


class Message(NamedTuple):
    """One consumed version: ``value`` is None and ``deleted`` True for a tombstone.
    ``append_ms`` is its append time in unix ms (docs/node-api.md, "Append times"); None unless
    the page was read with ``times=True``, or when the tail does not know it.

    A named tuple, so a page's messages are built from its columns in C (``Page.messages``)."""

    seq: int
    key: bytes
    value: bytes | None
    expiry_ms: int = 0
    headers: dict[str, bytes] | None = None
    deleted: bool = False
    append_ms: int | None = None


class PageColumns(NamedTuple):
    """A page's messages field by field: message i is ``seqs[i]``, ``keys[i]``, ``values[i]``
    (None for a tombstone) and so on. The optional columns are None when no message of the page
    has one: ``expiries_ms`` (all 0), ``headers`` (all None), ``deleted`` (no tombstone),
    ``append_ms`` (no known append time: not asked for, or unknown)."""

    seqs: Sequence[int]
    keys: Sequence[bytes]
    values: Sequence[bytes | None]
    expiries_ms: Sequence[int] | None = None
    headers: Sequence[dict[str, bytes] | None] | None = None
    deleted: Sequence[bool] | None = None
    append_ms: Sequence[int | None] | None = None


_new_message = tuple.__new__  # a Message from one zipped row, with no Python-level __new__


class MessageView(Sequence[Message]):
    """The messages of a page that holds columns: each ``Message`` is built (in C) when it is
    read, and iterating builds one at a time, so a page never holds an object per message (those
    are what cost a consumer most: building thousands at once wakes the cyclic GC again and
    again). Compares equal to any sequence of the same messages; ``tuple(view)`` materializes."""

    __slots__ = ("_columns",)

    def __init__(self, columns: PageColumns) -> None:
        self._columns = columns

    def _rows(self, start: int, stop: int) -> Iterator[tuple[Any, ...]]:
        seqs, keys, values, expiries, headers, deleted, appended = self._columns
        count = stop - start
        return zip(
            seqs[start:stop],
            keys[start:stop],
            values[start:stop],
            repeat(0, count) if expiries is None else expiries[start:stop],
            repeat(None, count) if headers is None else headers[start:stop],
            repeat(False, count) if deleted is None else deleted[start:stop],
            repeat(None, count) if appended is None else appended[start:stop],
            strict=True,
        )

    def __len__(self) -> int:
        return len(self._columns.seqs)

    def __iter__(self) -> Iterator[Message]:
        return map(_new_message, repeat(Message), self._rows(0, len(self)))

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return tuple(
                    map(_new_message, repeat(Message), self._rows(start, max(start, stop)))
                )
            return tuple(self[i] for i in range(start, stop, step))
        position = range(len(self))[index]  # IndexError as a tuple's, negative indexes too
        return _new_message(Message, next(self._rows(position, position + 1)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(map(eq, self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessageView(<{len(self)} messages>)"


class Page:
    """One page of a consumer snapshot ``(hwm, boundary]``. ``end`` marks the last page: the
    snapshot is exhausted and the consumer may commit ``hwm = boundary``.

    ``messages`` is a sequence of ``Message``. A page decoded from the node's columns keeps them
    (``columns``) and its ``messages`` is a ``MessageView`` that builds each message as it is read;
    a page built from messages (embedded mode, a list-of-objects reply) makes its columns when
    first asked. Immutable."""

    __slots__ = ("_columns", "_messages", "boundary", "end", "group", "hwm", "next", "shard")

    shard: int
    group: str
    hwm: int
    boundary: int
    next: int
    end: bool
    _messages: Sequence[Message]
    _columns: PageColumns | None

    def __init__(
        self,
        shard: int,
        group: str,
        hwm: int,
        boundary: int,
        messages: Sequence[Message],
        next: int,  # the wire field's name
        end: bool,
    ) -> None:
        self._init(shard, group, hwm, boundary, next, end, tuple(messages), None)

    @classmethod
    def from_columns(
        cls,
        shard: int,
        group: str,
        hwm: int,
        boundary: int,
        columns: PageColumns,
        next: int,
        end: bool,
    ) -> Page:
        page = cls.__new__(cls)
        page._init(shard, group, hwm, boundary, next, end, MessageView(columns), columns)
        return page

    def _init(
        self,
        shard: int,
        group: str,
        hwm: int,
        boundary: int,
        next: int,
        end: bool,
        messages: Sequence[Message],
        columns: PageColumns | None,
    ) -> None:
        for name, value in (
            ("shard", shard),
            ("group", group),
            ("hwm", hwm),
            ("boundary", boundary),
            ("next", next),
            ("end", end),
            ("_messages", messages),
            ("_columns", columns),
        ):
            object.__setattr__(self, name, value)

    @property
    def messages(self) -> Sequence[Message]:
        return self._messages

    @property
    def columns(self) -> PageColumns:
        columns: PageColumns | None = self._columns
        if columns is None:
            if not self._messages:
                columns = PageColumns((), (), ())
            else:
                rows = zip(*self._messages, strict=True)
                seqs, keys, values, expiries, headers, deleted, appended = rows
                columns = PageColumns(
                    seqs,
                    keys,
                    values,
                    expiries if any(expiries) else None,
                    None if headers.count(None) == len(headers) else headers,
                    deleted if any(deleted) else None,
                    known_times(appended),
                )
            object.__setattr__(self, "_columns", columns)
        return columns

    def __len__(self) -> int:
        return len(self._messages)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Page is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Page is immutable (cannot delete {name!r})")

    def _key(self) -> tuple[Any, ...]:
        return (self.shard, self.group, self.hwm, self.boundary, self.next, self.end)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Page):
            return NotImplemented
        return self._key() == other._key() and self._messages == other._messages

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Page(shard={self.shard}, group={self.group!r}, hwm={self.hwm}, "
            f"boundary={self.boundary}, messages=<{len(self)}>, next={self.next}, end={self.end})"
        )


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group: its high-water mark, the shard's committed boundary and the lag."""

    hwm: int
    boundary: int
    lag: int
    state: bytes | None = None
    # False when the node stopped counting at ``limits.group_lag_scan_entries_max`` entries
    # (``lag`` is then a floor).
    lag_complete: bool = True
    # Age in seconds of the oldest unread message as the answering member's time index gives it
    # (at most ``limits.time_index_interval_ms`` too old); 0.0 when nothing is unread, None when
    # the member does not know when that message came (docs/node-api.md, "Lag").
    lag_seconds: float | None = None


class ShardSeqs(NamedTuple):
    """The seqs one shard's part of a produced batch got (both 0 under ``acks=0``)."""

    shard: int
    first_seq: int
    last_seq: int
    items: int


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """A committed high-water mark and the seq its commit claimed."""

    hwm: int
    seq: int


def as_bytes(data: Data, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return encode_text(data, what)
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

    def pick(self, indexes: list[int]) -> Columns:
        """The items at ``indexes``, in that order (a batch's part for one shard)."""
        if len(indexes) == len(self.keys):
            return self
        return Columns(
            tuple(self.keys[i] for i in indexes),
            tuple(self.values[i] for i in indexes),
            None if self.expiries_ms is None else tuple(self.expiries_ms[i] for i in indexes),
            None if self.headers is None else tuple(self.headers[i] for i in indexes),
        )

    def to_messages(self) -> list[dict[str, Any]]:
        """The HTTP body's ``messages`` list."""
        out: list[dict[str, Any]] = []
        for index, key in enumerate(self.keys):
            value = self.values[index]
            if value is None:  # a delete says so (docs/node-api.md); it carries only its key
                out.append({"key": key, "delete": True})
                continue
            message: dict[str, Any] = {"key": key, "value": value}
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


def _plain_columns(items: list[ItemLike]) -> Columns | None:
    """The columns of a batch of ``(bytes key, bytes value)`` pairs, checked in C-level passes;
    None when the batch has anything else (the general path then checks item by item)."""
    if not items or not all(type(item) is tuple and len(item) == 2 for item in items):
        return None
    keys, values = zip(*items, strict=True)
    if not all(type(key) is bytes for key in keys) or not all(type(v) is bytes for v in values):
        return None
    if min(map(len, keys)) < 1 or max(map(len, keys)) > limits.item_key_bytes_max:
        return None  # the general path names the bad key
    if max(map(len, values)) > limits.value_bytes_max:
        return None
    if len(keys) > limits.batch_entries_max:
        return None
    return Columns(keys, values, None, None)


def to_columns(items: Iterable[ItemLike]) -> Columns:
    """Checks and converts items; raises ``InvalidRequest``/``LimitExceeded`` before anything is
    sent, so a batch the node would refuse never costs a round trip."""
    items = list(items)
    plain = _plain_columns(items)
    if plain is not None:
        return plain
    keys: list[bytes] = []
    values: list[bytes | None] = []
    expiries: list[int] = []
    headers: list[dict[str, bytes] | None] = []
    for raw in items:
        item = to_item(raw)
        key = check_item_key(as_bytes(item.key, "a key"))
        value = None if item.value is None else as_bytes(item.value, "a value")
        if value is not None and len(value) > limits.value_bytes_max:
            raise LimitExceeded(f"value of {len(value)} bytes over {limits.value_bytes_max}")
        check_expiry_ms(item.expiry_ms)
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
        out[check_text(name, "a header name")] = as_bytes(value, f"header {name!r}")
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
    """A consume reply as a ``Page``, in either of its shapes (columns when it has ``seqs``, else a
    ``messages`` list); a reply that breaks the contract is a ``ProtocolError``."""
    try:
        shard, group = int(raw["shard"]), str(raw["group"])
        hwm, boundary = int(raw["hwm"]), int(raw["boundary"])
        position, end = int(raw["next"]), bool(raw["end"])
        samples = None if raw.get("times") is None else samples_from_reply(raw["times"])
        if "seqs" in raw:
            columns = columns_from_reply(raw)
            check_seqs(hwm, boundary, columns.seqs)
            if samples is not None:
                columns = columns._replace(append_ms=known_times(times_of(columns.seqs, samples)))
            return Page.from_columns(shard, group, hwm, boundary, columns, position, end)
        messages = tuple(message_from_reply(m) for m in raw["messages"])
        if samples is not None:
            appended = iter(times_of([m.seq for m in messages], samples))
            messages = tuple(m._replace(append_ms=next(appended)) for m in messages)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed consume reply: {exc!r}") from exc
    page = Page(shard, group, hwm, boundary, messages, position, end)
    check_page(page)
    return page


def columns_from_reply(raw: Any) -> PageColumns:
    """The columns of a columnar consume reply, checked for type and length a column at a time
    (in C: ``map(type, ...)``); text where bytes belong (a JSON reply) is encoded."""
    seqs = tuple(raw["seqs"])
    count = len(seqs)
    if not _types_within(seqs, _INT):
        raise TypeError("seqs must be integers")
    keys = _bytes_column(raw["keys"], count, "keys", _BYTES)
    values = _bytes_column(raw["values"], count, "values", _BYTES_OR_NONE)
    expiries = raw.get("expiries_ms")
    if expiries is not None:
        expiries = tuple(expiries)
        if len(expiries) != count or not _types_within(expiries, _INT):
            raise TypeError(f"expiries_ms must be {count} integers")
    headers = raw.get("headers")
    if headers is not None:
        if len(headers) != count:
            raise TypeError(f"headers must have {count} entries")
        headers = tuple(
            None if not h else {str(k): _reply_bytes(v) for k, v in h.items()} for h in headers
        )
    deleted = raw.get("deleted")
    if deleted is not None:
        deleted = tuple(deleted)
        if len(deleted) != count or not _types_within(deleted, _BOOL):
            raise TypeError(f"deleted must be {count} booleans")
    return PageColumns(seqs, keys, values, expiries, headers, deleted)


_INT: frozenset[type] = frozenset({int})
_BOOL: frozenset[type] = frozenset({bool})
_BYTES: frozenset[type] = frozenset({bytes})
_BYTES_OR_NONE: frozenset[type] = frozenset({bytes, type(None)})


def _types_within(column: Sequence[Any], allowed: frozenset[type]) -> bool:
    return set(map(type, column)) <= allowed


def _bytes_column(raw: Any, count: int, what: str, allowed: frozenset[type]) -> tuple[Any, ...]:
    column = tuple(raw)
    if len(column) != count:
        raise TypeError(f"{what} must have {count} entries, not {len(column)}")
    if not _types_within(column, allowed):
        column = tuple(
            None if v is None and type(None) in allowed else _reply_bytes(v) for v in column
        )
    return column


def check_seqs(hwm: int, boundary: int, seqs: Sequence[int]) -> None:
    """A page's invariants: seqs increase strictly within ``(hwm, boundary]``."""
    if hwm > boundary:
        raise ProtocolError(f"page hwm {hwm} above its boundary {boundary}")
    if not seqs:
        return
    if not (hwm < seqs[0] and seqs[-1] <= boundary and all(map(lt, seqs, islice(seqs, 1, None)))):
        previous = hwm
        for seq in seqs:
            if not previous < seq <= boundary:
                break
            previous = seq
        raise ProtocolError(f"page seq {seq} out of order or outside ({hwm}, {boundary}]")


def check_page(page: Page) -> None:
    """A page's invariants: seqs increase strictly within ``(hwm, boundary]``."""
    check_seqs(page.hwm, page.boundary, page.columns.seqs)


def group_from_reply(raw: Any) -> GroupInfo:
    try:
        state = raw.get("state")
        return GroupInfo(
            hwm=int(raw["hwm"]),
            boundary=int(raw["boundary"]),
            lag=int(raw["lag"]),
            state=None if state is None else _reply_bytes(state),
            lag_complete=bool(raw.get("lag_complete", True)),
            lag_seconds=_reply_seconds(raw.get("lag_seconds")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed group reply: {exc!r}") from exc


def _reply_seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"lag_seconds must be a number >= 0 or null, not {value!r}")
    return float(value)


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
