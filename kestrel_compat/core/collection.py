"""Kestrel 2.x queue semantics, pure and deterministic: no sockets, no asyncio, time from a Clock.

``QueueCollection`` is Kestrel's QueueCollection and ``KestrelQueue`` its PersistentQueue (spec
§3-§9): FIFO queues, open reads (xids) put back at the head on abort, lazy head-only expiry with
expireToQueue, limits with discardOldWhenFull, fanouts and aliases, per-queue and global stats,
and one FIFO of waiters per queue of which each add or abort wakes exactly the oldest.

Waiting itself belongs to the driver (``kestrel_compat.sessions.memcache_session``): a ``Waiter`` is an object the
driver registers on a queue; the collection calls its ``wake`` callback when it is the one woken,
and the driver then re-runs its fetch and, if it lost the race, registers it again at the tail.

Persistence is described, not done: every change the backend must learn about is put in
``outbox`` as an operation (append an entry, commit a group's state, delete a group or a log),
in the order it happened, and the driver carries them out (``kestrel_compat.backends.persister``). Items are
served from memory at once; their seq arrives when their append returns (``assign_seqs``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kayos.clock import Clock
from kayos.errors import InvalidRequest
from kestrel_compat import limits
from kestrel_compat.core.config import QueueConfig, QueueSettings
from kestrel_compat.core.persistence import GroupState, NewEntry, encode_removed
from kestrel_compat.wire.memcache_codec import ServerStatus, queue_name_is_legal


class IllegalQueueName(InvalidRequest):
    """A queue name holding ``.``, ``/`` or ``~`` was to be created (spec §8.1): close."""

    code = "kestrel_illegal_queue_name"


# Kestrel's journal record sizes (spec §12), which `logsize` adds up: ADDX is an op byte, a 32-bit
# length, two 64-bit times and the data; REMOVE is the op byte; the xid records add a 32-bit xid.
JOURNAL_ADD_OVERHEAD_BYTES = 1 + 4 + 8 + 8
JOURNAL_REMOVE_BYTES = 1
JOURNAL_XID_RECORD_BYTES = 1 + 4


def now_ms(clock: Clock) -> int:
    return int(clock.now_s() * 1000)


# --- items and log entries -----------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Item:
    """One queued copy of an item. Fanout copies share a ``LogEntry`` and so a seq."""

    data: bytes
    add_ms: int
    expiry_ms: int | None  # Absolute ms, already capped by maxAge at add time; None: never.
    seq: int | None = None  # None until the append that stores it returns.
    gone: bool = False  # Removed for good (confirmed, read, discarded, expired, flushed).
    xid: int = 0
    open_deadline_ms: int | None = None  # openTransactionTimeout, while an open read.
    behind: bool = False  # Added while its queue was in read-behind: in the log only.


@dataclass(eq=False, slots=True)
class LogEntry:
    """One append in flight: the value and the queues (groups) that took a copy."""

    log: str
    value: bytes
    add_ms: int
    expiry_ms: int | None
    copies: list[tuple[KestrelQueue, Item]] = field(default_factory=list)
    seq: int | None = None

    def new_entry(self) -> NewEntry:
        groups = tuple(queue.name for queue, _ in self.copies)
        return NewEntry(self.value, self.add_ms, self.expiry_ms, groups)


# --- operations for the persistence driver -------------------------------------------------------


@dataclass(eq=False, slots=True)
class AppendOp:
    entry: LogEntry


@dataclass(eq=False, slots=True)
class CommitOp:
    queue: KestrelQueue


@dataclass(frozen=True, slots=True)
class DeleteGroupOp:
    log: str
    group: str


@dataclass(frozen=True, slots=True)
class DeleteLogOp:
    log: str


@dataclass(eq=False, slots=True)
class RefillOp:
    """Page a read-behind queue's items back in from its log (docs/kestrel-compat.md §10)."""

    queue: KestrelQueue


PersistOp = AppendOp | CommitOp | DeleteGroupOp | DeleteLogOp | RefillOp


class GroupLedger:
    """A queue's durable position: hwm plus the seqs above it removed out of order.

    Live seqs are those of queued items and open reads. Every assigned seq of this group that is
    not live is removed, so the hwm is just below the lowest live seq, or the log's tail when
    nothing is live; removed seqs above the hwm go into the blob.
    """

    def __init__(self, hwm: int, removed: set[int] | None = None) -> None:
        self.hwm = hwm
        self._removed: set[int] = set(removed or ())
        self._live: set[int] = set()
        self._heap: list[int] = []
        self.commit_queued = False
        # The state the backend last took, so an unchanged one is not sent again (a `set` to a
        # queue that already holds items changes nothing the backend keeps).
        self.committed: GroupState | None = None
        # Read-behind: every seq above this one named for the group is behind (live, in the log
        # only); None while the queue is not behind or its first behind entry has no seq yet.
        self.behind_after: int | None = None

    def live(self, seq: int) -> None:
        assert seq > self.hwm, "a live seq is above the hwm"
        self._live.add(seq)
        heapq.heappush(self._heap, seq)

    def gone(self, seq: int) -> None:
        self._live.discard(seq)
        if seq > self.hwm:
            self._removed.add(seq)

    def is_removed(self, seq: int) -> bool:
        return seq <= self.hwm or seq in self._removed

    def state(self, tail_seq: int) -> GroupState:
        heap, live = self._heap, self._live
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        hwm = heap[0] - 1 if heap else tail_seq
        if self.behind_after is not None:
            hwm = min(hwm, self.behind_after)
        if hwm > self.hwm:
            self.hwm = hwm
            if self._removed:
                self._removed = {seq for seq in self._removed if seq > hwm}
        # Every removed seq is above the hwm: `gone` keeps only those, and a rising hwm drops the
        # rest above.
        hwm = self.hwm
        return GroupState(hwm=hwm, blob=encode_removed(hwm, sorted(self._removed)))


# --- waiters -------------------------------------------------------------------------------------


class Waiter:
    """A blocked fetch (GET ``t=``, peek ``t=``, MONITOR) registered on one queue.

    ``wake`` is called at most once per registration, when this waiter is the oldest and an add or
    abort happens, or when the queue closes.
    """

    __slots__ = ("wake",)

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake


# --- one queue -----------------------------------------------------------------------------------


class KestrelQueue:
    """One Kestrel queue (Kestrel's PersistentQueue), a group on log ``log``."""

    def __init__(
        self,
        name: str,
        config: QueueConfig,
        *,
        collection: QueueCollection,
        created_ms: int,
        hwm: int,
        removed: set[int] | None = None,
    ) -> None:
        self.name = name
        self.log = name.split("+", 1)[0]
        self.is_fanout = "+" in name
        self.config = config
        self._collection = collection
        self.created_ms = created_ms
        self.items: deque[Item] = deque()
        self.bytes = 0
        self.open_reads: dict[int, Item] = {}
        self._waiters: dict[Waiter, None] = {}
        self._xid_counter = 0
        self.closed = False
        self.paused = False
        self.ledger = GroupLedger(hwm, removed)
        self.expire_target: KestrelQueue | None = None
        # Stats (spec §6).
        self.total_items = 0
        self.put_bytes = 0
        self.expired_items = 0
        self.discarded = 0
        self.transactions = 0
        self.canceled_transactions = 0
        self.total_flushes = 0
        self.journal_rewrites = 0
        self.journal_rotations = 0
        self.logsize = 0
        self.last_removed_add_ms: int | None = None
        # Read-behind (docs/kestrel-compat.md §10): items past max_memory_size_bytes.
        self.behind_items = 0
        self.behind_bytes = 0
        self.refill_pending = False

    # --- time and expiry ---

    def _now_ms(self) -> int:
        return now_ms(self._collection.clock)

    def _cap_expiry(self, start_ms: int, expiry_ms: int | None) -> int | None:
        max_age_ms = self.config.max_age_ms
        if max_age_ms is None:
            return expiry_ms
        cap = start_ms + max_age_ms
        return cap if expiry_ms is None else min(expiry_ms, cap)

    def discard_expired(self, limit: int | None = None) -> int:
        """Drop expired items from the head only (spec §4); move them to expireToQueue if set."""
        sweep_max = self.config.max_expire_sweep if limit is None else limit
        has_limit = sweep_max < limits.java_int_max
        now = self._now_ms()
        expired: list[Item] = []
        while self.items and not (has_limit and len(expired) >= sweep_max):
            head = self.items[0]
            real_expiry = self._cap_expiry(head.add_ms, head.expiry_ms)
            if real_expiry is None or real_expiry >= now:
                break
            self.items.popleft()
            self.bytes -= len(head.data)
            self.expired_items += 1
            self._journal(JOURNAL_REMOVE_BYTES)
            self._gone(head)
            expired.append(head)
        target = self.expire_target
        if target is not None:
            for item in expired:
                entry = LogEntry(target.log, item.data, now, None)
                target.add(item.data, None, now, entry)
                self._collection.emit_entry(entry)
        return len(expired)

    # --- the durable ledger ---

    def _gone(self, item: Item) -> None:
        item.gone = True
        if item.seq is not None and not self.closed:
            self.ledger.gone(item.seq)
            self._collection.mark_dirty(self)

    def _journal(self, size_bytes: int) -> None:
        if self.config.keep_journal:
            self.logsize += size_bytes

    def _check_rotate_journal(self) -> None:
        # The two journal-maintenance rules that change what `stats` shows (spec §9): an empty
        # queue with a journal past defaultJournalSize is rewritten (open reads are kept), and a
        # journal past maxMemorySize is rotated to a fresh file.
        if not self.config.keep_journal:
            return
        if self.logsize >= self.config.default_journal_size_bytes and not self.items:
            self.logsize = sum(
                JOURNAL_ADD_OVERHEAD_BYTES + len(item.data) + JOURNAL_XID_RECORD_BYTES
                for item in self.open_reads.values()
            )
            self.journal_rewrites += 1
        elif self.logsize > self.config.max_memory_size_bytes:
            self.logsize = 0
            self.journal_rotations += 1

    # --- adding ---

    def add(self, data: bytes, expiry_ms: int | None, add_ms: int, entry: LogEntry) -> bool:
        """Kestrel's PersistentQueue.add: refused when closed, too large, or full (spec §4)."""
        if self.closed or len(data) > self.config.max_item_size_bytes:
            return False
        if self.config.fanout_only and not self.is_fanout:
            return True
        while (
            len(self.items) + self.behind_items >= self.config.max_items
            or self.bytes + self.behind_bytes >= self.config.max_size_bytes
        ):
            if not self.config.discard_old_when_full:
                return False
            if self._remove_head(transactional=False) is None:
                return False  # Nothing left to drop (a limit of zero): refuse, not spin.
            self.discarded += 1
            self._journal(JOURNAL_REMOVE_BYTES)
        item = Item(data, add_ms, self._cap_expiry(self._now_ms(), expiry_ms))
        self._check_rotate_journal()
        self.discard_expired()
        if self._goes_behind(len(data)):
            item.behind = True
            self.behind_items += 1
            self.behind_bytes += len(data)
        else:
            self.items.append(item)
            self.bytes += len(data)
        self.total_items += 1
        self.put_bytes += len(data)
        self._journal(JOURNAL_ADD_OVERHEAD_BYTES + len(data))
        entry.copies.append((self, item))
        self.trigger()
        return True

    def restore(self, item: Item) -> None:
        """Recovery: an item read back from the log, live for this group."""
        assert item.seq is not None
        self._journal(JOURNAL_ADD_OVERHEAD_BYTES + len(item.data))
        if self._goes_behind(len(item.data)):
            if not self.behind_items:
                self.ledger.behind_after = item.seq - 1
            self.behind_items += 1
            self.behind_bytes += len(item.data)
            return
        self.items.append(item)
        self.bytes += len(item.data)
        self.ledger.live(item.seq)

    # --- read-behind ---

    def _goes_behind(self, size_bytes: int) -> bool:
        """An item added now stays in the log only: the queue is behind already, or the item
        would take the memory part past maxMemorySize (which always holds at least one item)."""
        if self.behind_items:
            return True
        return bool(self.items) and self.bytes + size_bytes > self.config.max_memory_size_bytes

    def wants_refill(self) -> bool:
        """Ask the persister to page items in once the memory part is under half its bound."""
        if (
            not self.behind_items
            or self.refill_pending
            or self.closed
            or (self.items and self.bytes >= self.config.max_memory_size_bytes // 2)
        ):
            return False
        self.refill_pending = True
        self._collection.outbox.append(RefillOp(self))
        return True

    def page_in(self, items: list[Item], scanned_to: int, log_done: bool) -> None:
        """A refill read ``items`` (in seq order, live for this group) and every entry up to
        ``scanned_to``. ``log_done``: the log holds nothing more for this queue (no append in
        flight), so whatever the counters still say is behind was never stored."""
        self.refill_pending = False
        if self.closed:
            return
        for item in items:
            assert item.seq is not None
            self.items.append(item)
            self.bytes += len(item.data)
            self.ledger.live(item.seq)
            self.behind_items -= 1
            self.behind_bytes -= len(item.data)
        self.ledger.behind_after = scanned_to
        if self.behind_items <= 0 or log_done:
            self.behind_items = self.behind_bytes = 0
            self.ledger.behind_after = None
        for _ in items:
            self.trigger()
        self.wants_refill()

    # --- removing ---

    def _remove_head(self, *, transactional: bool) -> Item | None:
        self.discard_expired()
        if not self.items:
            return None
        item = self.items.popleft()
        self.bytes -= len(item.data)
        self.last_removed_add_ms = item.add_ms
        if transactional:
            item.xid = self._next_xid()
            self.open_reads[item.xid] = item
        else:
            self._gone(item)
        return item

    def _next_xid(self) -> int:
        while True:
            # Xids are Java ints, never 0, and skip those still open.
            wrapped = self._xid_counter >= limits.java_int_max
            self._xid_counter = 1 if wrapped else self._xid_counter + 1
            if self._xid_counter not in self.open_reads:
                return self._xid_counter

    def remove(self, *, transactional: bool) -> Item | None:
        """Take the head: for good, or as an open read (spec §3.3)."""
        if self.closed or self.paused or not self.items:
            return None
        if transactional:
            self.transactions += 1
        self._time_out_oldest_open_read()
        item = self._remove_head(transactional=transactional)
        if item is not None:
            timeout_ms = self.config.open_transaction_timeout_ms
            if transactional and timeout_ms is not None:
                item.open_deadline_ms = self._now_ms() + timeout_ms
            self._journal(JOURNAL_XID_RECORD_BYTES if transactional else JOURNAL_REMOVE_BYTES)
            self._check_rotate_journal()
        if self.behind_items:
            self.wants_refill()
        return item

    def peek(self) -> Item | None:
        if self.closed or self.paused or not self.items:
            return None
        self.discard_expired()
        return self.items[0] if self.items else None

    def _time_out_oldest_open_read(self) -> None:
        # openTransactionTimeout (spec §9): lazily, before each remove, the oldest open read past
        # its deadline goes back to the head.
        if self.config.open_transaction_timeout_ms is None:
            return
        for xid, item in self.open_reads.items():
            if item.open_deadline_ms is None:
                continue
            if item.open_deadline_ms < self._now_ms():
                self.unremove(xid)
            return

    def unremove(self, xid: int) -> None:
        """Abort an open read: the item goes back to the head (spec §3.3)."""
        if self.closed:
            return
        item = self.open_reads.pop(xid, None)
        if item is not None:
            item.xid = 0
            item.open_deadline_ms = None
            self.items.appendleft(item)
            self.bytes += len(item.data)
            self._journal(JOURNAL_XID_RECORD_BYTES)
            self.canceled_transactions += 1
        self.trigger()

    def confirm(self, xid: int) -> None:
        """Close an open read: the item is gone for good."""
        if self.closed:
            return
        item = self.open_reads.pop(xid, None)
        if item is not None:
            self._journal(JOURNAL_XID_RECORD_BYTES)
            self._gone(item)

    def flush(self) -> None:
        """Remove every queued item (open reads stay), one REMOVE each as Kestrel does; the items
        behind go at once (the group's hwm passes them)."""
        while self.remove(transactional=False) is not None:
            pass
        if self.behind_items:
            self.behind_items = self.behind_bytes = 0
            self.ledger.behind_after = None
            self._collection.mark_dirty(self)
        self.total_flushes += 1

    # --- waiters ---

    @property
    def waiter_count(self) -> int:
        return len(self._waiters)

    def add_waiter(self, waiter: Waiter) -> None:
        assert waiter not in self._waiters
        self._waiters[waiter] = None

    def remove_waiter(self, waiter: Waiter) -> bool:
        return self._waiters.pop(waiter, 0) is None

    def trigger(self) -> None:
        """Wake the oldest waiter, if any (one per add or abort, spec §3.5)."""
        waiter = next(iter(self._waiters), None)
        if waiter is not None:
            del self._waiters[waiter]
            waiter.wake()

    def trigger_all(self) -> None:
        waiters = list(self._waiters)
        self._waiters.clear()
        for waiter in waiters:
            waiter.wake()

    def close(self) -> None:
        self.closed = True
        self.trigger_all()

    # --- stats ---

    def age_ms(self) -> int:
        # Kestrel: 0 when the queue holds no bytes, else now minus the add time of the last item
        # removed. Kestrel starts that time at the epoch; Kayos reports 0 until a first removal.
        if self.bytes == 0 or self.last_removed_add_ms is None:
            return 0
        return self._now_ms() - self.last_removed_add_ms

    def is_ready_for_expiration(self) -> bool:
        max_queue_age_ms = self.config.max_queue_age_ms
        return (
            max_queue_age_ms is not None
            and not self.items
            and not self.behind_items
            and self._now_ms() > self.created_ms + max_queue_age_ms
        )

    def dump_stats(self) -> list[tuple[str, str | int]]:
        return [
            ("items", len(self.items) + self.behind_items),
            ("bytes", self.bytes + self.behind_bytes),
            ("total_items", self.total_items),
            ("logsize", self.logsize),
            ("expired_items", self.expired_items),
            ("mem_items", len(self.items)),
            ("mem_bytes", self.bytes),
            ("age", self.age_ms()),
            ("discarded", self.discarded),
            ("waiters", self.waiter_count),
            ("open_transactions", len(self.open_reads)),
            ("transactions", self.transactions),
            ("canceled_transactions", self.canceled_transactions),
            ("total_flushes", self.total_flushes),
            ("journal_rewrites", self.journal_rewrites),
            ("journal_rotations", self.journal_rotations),
        ]


class AliasQueue:
    """A configured alias (spec §8.3): sets go to every destination; reads find nothing."""

    def __init__(self, name: str, destinations: tuple[str, ...]) -> None:
        self.name = name
        self.destinations = destinations
        self.put_items = 0
        self.put_bytes = 0

    def dump_stats(self) -> list[tuple[str, str | int]]:
        return [
            ("put_items", self.put_items),
            ("put_bytes", self.put_bytes),
            ("children", ",".join(self.destinations)),
        ]


# --- server status -------------------------------------------------------------------------------

_STRICTNESS = {
    ServerStatus.UP: 1,
    ServerStatus.WRITEAVOID: 2,
    ServerStatus.READONLY: 3,
    ServerStatus.QUIESCENT: 4,
}
_BLOCKS_READS = {ServerStatus.QUIESCENT}
_BLOCKS_WRITES = {ServerStatus.READONLY, ServerStatus.QUIESCENT}


class StatusKeeper:
    """Kestrel's ServerStatus (spec §7): a stricter status is enforced after the grace period, a
    looser one at once; while a stricter change is pending, another stricter one is refused."""

    def __init__(
        self,
        clock: Clock,
        *,
        initial: ServerStatus,
        grace_period_ms: int,
        store: Callable[[ServerStatus], None] | None = None,
    ) -> None:
        self._clock = clock
        self._grace_period_ms = grace_period_ms
        self._store = store
        self.current = initial
        self._enforced = initial
        self._pending_since_ms: int | None = None

    def _operation_status(self) -> ServerStatus:
        pending_since_ms = self._pending_since_ms
        if pending_since_ms is not None and (
            now_ms(self._clock) >= pending_since_ms + self._grace_period_ms
        ):
            self._enforced = self.current
            self._pending_since_ms = None
        return self._enforced

    @property
    def blocks_reads(self) -> bool:
        return self._operation_status() in _BLOCKS_READS

    @property
    def blocks_writes(self) -> bool:
        return self._operation_status() in _BLOCKS_WRITES

    def set(self, status: ServerStatus) -> None:
        self._operation_status()
        old = self.current
        stricter = _STRICTNESS[status] > _STRICTNESS[old]
        if stricter and self._pending_since_ms is not None:
            return  # Kestrel rejects (and only logs) a stricter change while one is pending.
        self.current = status
        if stricter and self._grace_period_ms > 0:
            self._pending_since_ms = now_ms(self._clock)
        else:
            self._pending_since_ms = None
            self._enforced = status
        if self._store is not None:
            self._store(status)


# --- global stats --------------------------------------------------------------------------------


@dataclass(slots=True)
class GlobalStats:
    total_items: int = 0
    curr_connections: int = 0
    total_connections: int = 0
    cmd_get: int = 0
    cmd_set: int = 0
    cmd_peek: int = 0
    get_hits: int = 0
    get_misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    queue_creates: int = 0
    queue_deletes: int = 0
    queue_expires: int = 0


# --- the collection ------------------------------------------------------------------------------


class QueueCollection:
    """Every queue, fanout and alias of one server (Kestrel's QueueCollection)."""

    def __init__(self, settings: QueueSettings, clock: Clock) -> None:
        self.clock = clock
        self.settings = settings
        self.queues: dict[str, KestrelQueue] = {}
        self.fanouts: dict[str, dict[str, None]] = {}
        self.aliases: dict[str, AliasQueue] = {}
        self.stats = GlobalStats()
        self.shutting_down = False
        self.started_s = clock.now_s()
        self.outbox: list[PersistOp] = []
        self.log_tails: dict[str, int] = {}
        self._create_aliases()

    # --- persistence hooks ---

    def emit_entry(self, entry: LogEntry) -> None:
        if entry.copies:
            self.outbox.append(AppendOp(entry))

    def mark_dirty(self, queue: KestrelQueue) -> None:
        if not queue.ledger.commit_queued and not queue.closed:
            queue.ledger.commit_queued = True
            self.outbox.append(CommitOp(queue))

    def take_outbox(self) -> list[PersistOp]:
        ops, self.outbox = self.outbox, []
        return ops

    def assign_seqs(self, entry: LogEntry, seq: int) -> None:
        """An append returned: the entry's copies get their seq, and each group learns of it."""
        entry.seq = seq
        self.log_tails[entry.log] = max(self.log_tails.get(entry.log, 0), seq)
        for queue, item in entry.copies:
            item.seq = seq
            current = self.queues.get(queue.name)
            if current is not queue:
                # The copy's queue was deleted while the append was in flight; a re-created queue
                # of that name is named by the entry too and must never see it.
                if current is not None and seq > current.ledger.hwm:
                    current.ledger.gone(seq)
                    self.mark_dirty(current)
                continue
            if item.gone:
                queue.ledger.gone(seq)
            elif item.behind:
                # In the log only: live without a place in the ledger's live set, which would
                # otherwise grow with the queue. The first one marks where the behind part starts.
                if not queue.behind_items:
                    queue.ledger.gone(seq)  # flushed while its append was in flight
                elif queue.ledger.behind_after is None:
                    queue.ledger.behind_after = seq - 1
            else:
                queue.ledger.live(seq)
            self.mark_dirty(queue)

    def group_state(self, queue: KestrelQueue) -> GroupState:
        queue.ledger.commit_queued = False
        return queue.ledger.state(self.log_tails.get(queue.log, 0))

    # --- lookup and creation ---

    def _create_aliases(self) -> None:
        # As Kestrel's createAliases: configured aliases are updated or created; an alias dropped
        # from the config stays until restart.
        for name, alias_config in self.settings.aliases.items():
            alias = self.aliases.get(name)
            if alias is None:
                self.aliases[name] = AliasQueue(name, alias_config.destination_queues)
            else:
                alias.destinations = alias_config.destination_queues

    def queue(self, name: str, *, create: bool = True) -> KestrelQueue | None:
        """The queue ``name``, created on first reference unless ``create`` is false."""
        if self.shutting_down:
            return None
        queue = self.queues.get(name)
        if queue is not None or not create:
            return queue
        return self._build(name, hwm=self.log_tails.get(name.split("+", 1)[0], 0))

    def _build(self, name: str, *, hwm: int, removed: set[int] | None = None) -> KestrelQueue:
        if not queue_name_is_legal(name):
            raise IllegalQueueName(f"queue name {name!r} holds one of '. / ~' or is empty")
        self.stats.queue_creates += 1
        queue = KestrelQueue(
            name,
            self.settings.config_for(name),
            collection=self,
            created_ms=now_ms(self.clock),
            hwm=hwm,
            removed=removed,
        )
        self.queues[name] = queue
        if queue.is_fanout:
            self.fanouts.setdefault(queue.log, {})[name] = None
        target = queue.config.expire_to_queue
        if target is not None and target != name:
            queue.expire_target = self.queue(target)
        self.mark_dirty(queue)
        return queue

    def restore_queue(self, name: str, state: GroupState, removed: set[int]) -> KestrelQueue:
        """Recovery: a queue that existed (had a group) when the server last stopped."""
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        queue = self._build(name, hwm=state.hwm, removed=removed)
        queue.ledger.commit_queued = False
        self.outbox = [
            op for op in self.outbox if not (isinstance(op, CommitOp) and op.queue is queue)
        ]
        return queue

    def queue_names(self, *, include_aliases: bool = True) -> list[str]:
        names = sorted(self.queues)
        if include_aliases:
            names += sorted(name for name in self.aliases if name not in self.queues)
        return names

    # --- operations (spec §2) ---

    def add(self, name: str, data: bytes, expiry_ms: int | None) -> tuple[bool, list[LogEntry]]:
        """SET: through an alias or to a queue and its fanouts. Returns whether the reply is
        STORED and the appends to wait for before saying so."""
        entries: dict[str, list[LogEntry]] = {}
        add_ms = now_ms(self.clock)
        stored = self._add(name, data, expiry_ms, add_ms, entries)
        waits: list[LogEntry] = []
        for per_log in entries.values():
            for entry in per_log:
                self.emit_entry(entry)
                if entry.copies:
                    waits.append(entry)
        return stored, waits

    def _add(
        self,
        name: str,
        data: bytes,
        expiry_ms: int | None,
        add_ms: int,
        entries: dict[str, list[LogEntry]],
    ) -> bool:
        alias = self.aliases.get(name)
        if alias is not None and not self.shutting_down:
            alias.put_items += 1
            alias.put_bytes += len(data)
            # Every destination is tried, even after one refused (Kestrel's foldLeft).
            results = [
                self._add(destination, data, expiry_ms, add_ms, entries)
                for destination in alias.destinations
            ]
            return all(results)
        for child in list(self.fanouts.get(name, {})):
            self._add(child, data, expiry_ms, add_ms, entries)
        queue = self.queue(name)
        if queue is None:
            return False
        entry = self._entry_for(queue, data, expiry_ms, add_ms, entries)
        stored = queue.add(data, expiry_ms, add_ms, entry)
        if stored:
            self.stats.total_items += 1
        return stored

    @staticmethod
    def _entry_for(
        queue: KestrelQueue,
        data: bytes,
        expiry_ms: int | None,
        add_ms: int,
        entries: dict[str, list[LogEntry]],
    ) -> LogEntry:
        # Fanout copies of one SET share one entry (one seq); a queue reached twice (an alias
        # naming a master and its child) gets a second entry.
        per_log = entries.setdefault(queue.log, [])
        for entry in per_log:
            if all(copy_queue is not queue for copy_queue, _ in entry.copies):
                return entry
        entry = LogEntry(queue.log, data, add_ms, expiry_ms)
        per_log.append(entry)
        return entry

    def fetch(self, queue: KestrelQueue, *, transactional: bool, peek: bool) -> Item | None:
        """One immediate fetch attempt; the caller counts the hit or miss when it is final."""
        if peek:
            return queue.peek()
        return queue.remove(transactional=transactional)

    def count_result(self, item: Item | None) -> None:
        if item is None:
            self.stats.get_misses += 1
        else:
            self.stats.get_hits += 1

    def flush(self, name: str) -> None:
        queue = self.queues.get(name)
        if queue is not None:
            queue.flush()

    def flush_all(self) -> None:
        for name in self.queue_names():
            self.flush(name)

    def delete(self, name: str) -> None:
        """Drop a queue (spec §2): items, open reads, stats; a child is unregistered."""
        if self.shutting_down:
            return
        queue = self.queues.pop(name, None)
        if queue is not None:
            queue.close()
            self.stats.queue_deletes += 1
            self.outbox.append(DeleteGroupOp(queue.log, name))
            if not any(other.log == queue.log for other in self.queues.values()):
                self.outbox.append(DeleteLogOp(queue.log))
        if "+" in name:
            self.fanouts.setdefault(name.split("+", 1)[0], {}).pop(name, None)

    def flush_expired(self, name: str) -> int:
        if self.shutting_down:
            return 0
        queue = self.queues.get(name)
        return queue.discard_expired() if queue is not None else 0

    def flush_all_expired(self) -> int:
        return sum(self.flush_expired(name) for name in self.queue_names(include_aliases=False))

    def delete_expired_queues(self) -> None:
        for name in self.queue_names(include_aliases=False):
            queue = self.queues.get(name)
            if queue is not None and queue.is_ready_for_expiration():
                self.delete(name)
                self.stats.queue_expires += 1

    def sweep(self) -> None:
        """The expirationTimerFrequency tick: expired items, then expired queues."""
        self.flush_all_expired()
        self.delete_expired_queues()

    def reload(self, settings: QueueSettings) -> None:
        """New queue and alias config (spec §9); server settings are not touched."""
        self.settings = settings
        for name, queue in self.queues.items():
            queue.config = settings.config_for(name)
        self._create_aliases()

    def shutdown(self) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        for queue in self.queues.values():
            queue.close()

    # --- stats (spec §6) ---

    def current_items(self) -> int:
        return sum(len(queue.items) for queue in self.queues.values())

    def current_bytes(self) -> int:
        return sum(queue.bytes for queue in self.queues.values())

    def reserved_memory_bytes(self) -> int:
        return sum(queue.config.max_memory_size_bytes for queue in self.queues.values())

    def queue_stats(self, name: str) -> list[tuple[str, str | int]]:
        queue = self.queues.get(name)
        if queue is not None:
            stats = queue.dump_stats()
            children = self.fanouts.get(name)
            if children is not None:
                stats.append(("children", ",".join(children)))
            return stats
        alias = self.aliases.get(name)
        return alias.dump_stats() if alias is not None else []

    def iter_items(self) -> Iterator[tuple[KestrelQueue, Item]]:
        for queue in self.queues.values():
            for item in queue.items:
                yield queue, item
