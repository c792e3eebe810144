"""Embedded mode: one durable queue in-process, with no server (``kayos.open_queue(path)``).

The client's produce / transaction / consume / commit / group calls, synchronous, over one
``ShardStore``: a library queue like Kestrel's PersistentQueue. One queue per path, so item keys
are stored as given (no queue prefix). A group's high-water mark is the store metadata key
``hwm/<group>`` (its opaque state ``gstate/<group>``), committed like any other write.

Every produce is one store commit: durable when it returns and all-or-nothing, so the client's
``acks`` and ``txn`` are accepted for a common signature and change nothing here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType

from kayos import limits
from kayos.client.types import (
    Acks,
    CommitInfo,
    Data,
    GroupInfo,
    Item,
    ItemLike,
    Message,
    Page,
    Transaction,
    acks_code,
    to_columns,
)
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.datadir import DirectoryLock
from kayos.errors import InvalidRequest, LimitExceeded
from kayos.storage import Delete, Entry, Op, Put, ShardStore, StoreOptions

# Embedded mode has one shard; pages name it like the network client's do.
EMBEDDED_SHARD = 0


def hwm_key(group: str) -> str:
    return f"hwm/{_check_group(group)}"


def state_key(group: str) -> str:
    return f"gstate/{_check_group(group)}"


def _check_group(group: str) -> str:
    if not isinstance(group, str) or not group:
        raise InvalidRequest("a consumer group needs a non-empty name")
    if len(group.encode()) > limits.queue_name_bytes_max:
        raise LimitExceeded(f"group name over {limits.queue_name_bytes_max} bytes")
    return group


def _message(entry: Entry) -> Message:
    return Message(entry.seq, entry.key, entry.value, entry.expiry_ms, entry.headers, entry.deleted)


class EmbeddedQueue:
    """One queue in one store directory. Thread-safe (the store serialises commits)."""

    def __init__(self, store: ShardStore, lock: DirectoryLock | None = None) -> None:
        self._store = store
        self._lock = lock  # the directory's owner lock, given up by close()

    @property
    def path(self) -> str:
        return self._store.directory

    @property
    def last_seq(self) -> int:
        return self._store.last_seq

    # --- life cycle ------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self._store.close()
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> EmbeddedQueue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- produce ---------------------------------------------------------------------------------

    def produce(
        self,
        key: Data,
        value: Data | None,
        *,
        expiry_ms: int = 0,
        headers: Mapping[str, Data] | None = None,
        acks: Acks = "all",
    ) -> int:
        """Appends one message (``value=None`` deletes the key); returns its seq."""
        first_seq, _last_seq = self.produce_batch([Item(key, value, expiry_ms, headers)], acks=acks)
        return first_seq

    def produce_batch(
        self, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = True
    ) -> tuple[int, int]:
        """Appends a batch as one durable, all-or-nothing commit; returns its seq range."""
        acks_code(acks)  # refuse a bad value as the client would
        columns = to_columns(items)
        ops: list[Op] = []
        for index, key in enumerate(columns.keys):
            value = columns.values[index]
            if value is None:
                ops.append(Delete(key))
                continue
            expiry_ms = columns.expiries_ms[index] if columns.expiries_ms else 0
            headers = columns.headers[index] if columns.headers else None
            ops.append(Put(key, value, expiry_ms, headers))
        result = self._store.commit(ops)
        assert result.last_seq - result.first_seq + 1 == len(ops), result
        return result.first_seq, result.last_seq

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Collects ``put``/``delete`` calls and commits them on a clean exit as one batch."""
        txn = Transaction(self.path)
        yield txn
        if txn.items:
            txn.result = self.produce_batch(txn.items)

    # --- consume ---------------------------------------------------------------------------------

    def consume(self, group: str, *, page_size: int = 1000) -> Iterator[Page]:
        """One consumer snapshot ``(hwm, boundary]`` of ``group``, read from one pinned store
        snapshot; the last page has ``end=True``. Expired messages are skipped; deletes come as
        tombstones. The snapshot stays pinned until the iterator is exhausted or closed."""
        key = hwm_key(group)
        if not 1 <= page_size <= limits.consume_page_entries_max:
            raise InvalidRequest(f"page_size must be 1 .. {limits.consume_page_entries_max}")
        with self._store.snapshot() as snapshot:
            hwm = int(snapshot.meta.get(key, 0))
            boundary = snapshot.boundary
            assert hwm <= boundary, (hwm, boundary)
            pages = snapshot.pages(hwm, boundary, page_entries=page_size)
            current = next(pages, [])
            while True:
                # One page of lookahead: the page after tells whether this one is the last.
                following = next(pages, None)
                messages = tuple(_message(entry) for entry in current)
                end = following is None
                position = boundary if end else messages[-1].seq
                yield Page(EMBEDDED_SHARD, group, hwm, boundary, messages, position, end)
                if following is None:
                    return
                current = following

    def commit(self, group: str, hwm: int, *, state: bytes | None = None) -> CommitInfo:
        """Records that ``group`` consumed every seq <= ``hwm`` (durable on return)."""
        meta: dict[str, int | bytes | None] = {hwm_key(group): hwm}
        if isinstance(hwm, bool) or not isinstance(hwm, int) or not 0 <= hwm <= self.last_seq:
            raise InvalidRequest(f"hwm must be 0 .. {self.last_seq} (the last seq), not {hwm!r}")
        if state is not None:
            if len(state) > limits.group_state_bytes_max:
                raise LimitExceeded(f"group state over {limits.group_state_bytes_max} bytes")
            meta[state_key(group)] = bytes(state)
        result = self._store.commit([], meta=meta)
        return CommitInfo(hwm, result.last_seq)

    def group(self, group: str) -> GroupInfo:
        meta = self._store.meta
        hwm = int(meta.get(hwm_key(group), 0))
        boundary = self._store.last_seq
        state = meta.get(state_key(group))
        # An embedded queue keeps no time index: the age of an unread message is unknown.
        return GroupInfo(
            hwm,
            boundary,
            boundary - hwm,
            state if isinstance(state, bytes) else None,
            lag_seconds=0.0 if boundary == hwm else None,
        )


def open_queue(
    path: str, *, clock: Clock = SYSTEM_CLOCK, options: StoreOptions | None = None
) -> EmbeddedQueue:
    """Opens (creating if needed) the queue stored in directory ``path``. The queue owns the
    directory until ``close()``: it locks ``path/LOCK`` first, and a second open anywhere (another
    process, or this one) fails at once with ``DirectoryInUseError`` naming the holder's pid."""
    lock = DirectoryLock.acquire(path, what="queue dir")
    try:
        store = ShardStore.open(path, clock=clock, options=options)
    except BaseException:
        lock.release()
        raise
    return EmbeddedQueue(store, lock)
