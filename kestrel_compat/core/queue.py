"""One Kestrel queue (Kestrel's PersistentQueue, spec §3-§9), pure: ``KestrelQueue`` and its items.

A queue is FIFO with open reads (xids) put back at the head on abort, lazy head-only expiry with
expireToQueue, limits with discardOldWhenFull, read-behind past its memory bound, per-queue stats
and one FIFO of waiters of which each add or abort wakes exactly the oldest.

Waiting itself belongs to the session (``kestrel_compat.sessions.session_base``): a ``Waiter`` is
an object it registers on a queue; the queue calls its ``wake`` callback when it is the one woken,
and the session then re-runs its fetch and, if it lost the race, registers it again at the tail.

A queue knows its collection only as a ``QueueHost``: the clock, and where to record what the
backend must learn (an entry to append, its group state to commit, a refill to read).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kayos.clock import Clock
from kestrel_compat import limits
from kestrel_compat.core.config import QueueConfig
from kestrel_compat.core.ledger import GroupLedger
from kestrel_compat.core.now import now_ms
from kestrel_compat.core.persistence import NewEntry

# Kestrel's journal record sizes (spec §12), which `logsize` adds up: ADDX is an op byte, a 32-bit
# length, two 64-bit times and the data; REMOVE is the op byte; the xid records add a 32-bit xid.
JOURNAL_ADD_OVERHEAD_BYTES = 1 + 4 + 8 + 8
JOURNAL_REMOVE_BYTES = 1
JOURNAL_XID_RECORD_BYTES = 1 + 4


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


# --- waiters -------------------------------------------------------------------------------------


class Waiter:
    """A blocked fetch (GET ``t=``, peek ``t=``, MONITOR) registered on one queue.

    ``wake`` is called at most once per registration, when this waiter is the oldest and an add or
    abort happens, or when the queue closes.
    """

    __slots__ = ("wake",)

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake


# --- what a queue asks of its collection ---------------------------------------------------------


class QueueHost(Protocol):
    """The collection as one of its queues sees it (``kestrel_compat.core.collection``)."""

    clock: Clock

    def emit_entry(self, entry: LogEntry) -> None:
        """Record an append of ``entry`` (items an expiry moved to expireToQueue)."""

    def mark_dirty(self, queue: KestrelQueue) -> None:
        """Record that ``queue``'s group state changed and must be committed."""

    def request_refill(self, queue: KestrelQueue) -> None:
        """Record that ``queue``'s items in read-behind should be paged back in."""


# --- one queue -----------------------------------------------------------------------------------


class KestrelQueue:
    """One Kestrel queue (Kestrel's PersistentQueue), a group on log ``log``."""

    def __init__(
        self,
        name: str,
        config: QueueConfig,
        *,
        host: QueueHost,
        created_ms: int,
        hwm: int,
        removed: set[int] | None = None,
    ) -> None:
        self.name = name
        self.log = name.split("+", 1)[0]
        self.is_fanout = "+" in name
        self.config = config
        self._host = host
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
        return now_ms(self._host.clock)

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
                self._host.emit_entry(entry)
        return len(expired)

    # --- the durable ledger ---

    def _gone(self, item: Item) -> None:
        item.gone = True
        if item.seq is not None and not self.closed:
            self.ledger.gone(item.seq)
            self._host.mark_dirty(self)

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
        self._host.request_refill(self)
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
            self._host.mark_dirty(self)
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
