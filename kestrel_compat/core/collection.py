"""Every queue, fanout and alias of one server (Kestrel's QueueCollection), pure and deterministic.

``QueueCollection`` creates queues on first reference (refusing illegal names, spec §8.1), routes
a SET through aliases and fanouts (spec §8), serves fetches, flushes and deletes, sweeps expired
items and queues, reloads queue config and keeps the global stats (spec §6). The queues themselves
are ``kestrel_compat.core.queue``; this module is the only one that knows all of them.

Persistence is described, not done: every change the backend must learn about is put in
``outbox`` as an operation (append an entry, commit a group's state, delete a group or a log,
page a read-behind queue in), in the order it happened, and the driver carries them out
(``kestrel_compat.backends.persister``). Items are served from memory at once; their seq arrives
when their append returns (``assign_seqs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kayos.clock import Clock
from kayos.errors import InvalidRequest
from kestrel_compat.core.config import QueueSettings
from kestrel_compat.core.now import now_ms
from kestrel_compat.core.persistence import GroupState
from kestrel_compat.core.queue import Item, KestrelQueue, LogEntry


class IllegalQueueName(InvalidRequest):
    """A queue name holding ``.``, ``/`` or ``~`` was to be created (spec §8.1): close."""

    code = "kestrel_illegal_queue_name"


def queue_name_is_legal(name: str) -> bool:
    """Whether a queue may be created under ``name`` (spec §8.1).

    Kestrel refuses ``.``, ``/`` and ``~`` when it creates a queue, closing the connection with
    nothing sent; only commands that create queues check. Kayos also refuses the empty name.
    """
    return name != "" and not any(character in name for character in "./~")


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


# --- aliases -------------------------------------------------------------------------------------


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

    def request_refill(self, queue: KestrelQueue) -> None:
        self.outbox.append(RefillOp(queue))

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
            host=self,
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
