"""The Raft log under the manager: the ONLY module that imports pysyncobj (docs/manager.md).

``ManagerLog`` is a ``SyncObj`` whose one replicated method, ``apply`` (pysyncobj method version 0,
``apply_v0``), takes an encoded batch of events (``codec.encode_entry``) and applies each with
``kayos.manager.decide``. The replicated state is the view's canonical JSON (a string: what
pysyncobj pickles into its dump is plain data, never our objects); ``None`` means the first view,
which every member builds from the same topology file. The Raft transport binds to this member's
``host:raft_port`` only and encrypts under the cluster secret (``password``); the log and its dump
live in the member's data directory, so a whole-group restart keeps the view.

pysyncobj applies entries on its own thread; readers on other threads see whole views only
(one attribute assignment per applied entry).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, replicated

from kayos import limits
from kayos.errors import KayosError, OperationTimeoutError
from kayos.manager import Action, Event, ManagerView, decide
from kayos.manager.member.codec import decode_entry, encode_entry
from kayos.manager.member.config import ManagerSetup
from kayos.manager.view import canonical_bytes, view_hash

log = logging.getLogger("kayos.manager.raft")

JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"


@dataclass(frozen=True, slots=True)
class Applied:
    """What one entry did on this member: the view after it and the actions decided."""

    view: ManagerView
    actions: tuple[Action, ...]
    refused: str | None = None


class _Cache:
    """The decoded view of the last replicated string, and its hash (not replicated)."""

    def __init__(self, first: ManagerView) -> None:
        self.lock = threading.Lock()
        self.key: str | None = None
        self.view = first
        self.hash = view_hash(first)


class ManagerLog(SyncObj):  # type: ignore[misc]  # pysyncobj ships no types
    # The replicated state; a class default, so it is the first view until an entry is applied
    # and no race with pysyncobj's thread at start (it may load the dump before __init__ ends).
    _view_json: str | None = None
    # Entries applied since the first view (replicated too): members that applied the same
    # number of entries must hold the same view, which is what ``recent_hashes`` lets one check.
    _entries: int = 0

    def __init__(
        self,
        setup: ManagerSetup,
        member_id: str,
        data_dir: str,
        *,
        on_state_changed: Callable[[], None] | None = None,
    ) -> None:
        # Attributes set before SyncObj.__init__ are not replicated (pysyncobj records them).
        self._first = setup.first_view()
        self._cache = _Cache(self._first)
        self._history: collections.deque[tuple[int, str]] = collections.deque(
            maxlen=limits.manager_hash_history
        )
        # Every epoch this member's applied entries went through (not replicated: since start).
        self._changes: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=limits.manager_change_history_epochs
        )
        self._changes_seen = 0
        self._members = {m.raft_address: m.id for m in setup.members}
        me = setup.member(member_id)
        os.makedirs(data_dir, exist_ok=True)
        conf = SyncObjConf(
            password=setup.identity.secret.hex(),
            bindAddress=me.raft_address,
            journalFile=os.path.join(data_dir, JOURNAL_FILE),
            fullDumpFile=os.path.join(data_dir, DUMP_FILE),
            raftMinTimeout=limits.manager_raft_min_timeout_ms / 1000,
            raftMaxTimeout=limits.manager_raft_max_timeout_ms / 1000,
            appendEntriesPeriod=limits.manager_raft_heartbeat_ms / 1000,
            connectionRetryTime=limits.manager_raft_max_timeout_ms / 1000,
            logCompactionMinEntries=limits.manager_log_compaction_entries,
            dynamicMembershipChange=False,
            useFork=False,  # the process runs threads and an event loop: never fork
            onStateChanged=(lambda old, new: on_state_changed()) if on_state_changed else None,
        )
        others = [m.raft_address for m in setup.members if m.id != member_id]
        super().__init__(me.raft_address, others, conf)

    # --- the replicated method -----------------------------------------------------------------

    @replicated(ver=0)  # type: ignore[untyped-decorator]  # pysyncobj ships no types
    def apply(self, entry: bytes) -> Applied:
        """Applies one entry's events in order. A malformed entry changes nothing on any member
        (each refuses it the same way)."""
        view = self.view()
        try:
            events = decode_entry(entry)
        except KayosError as exc:
            log.warning("refused a log entry: %s", exc)
            self._entries += 1
            self._history.append((self._entries, self.view_hash()))
            return Applied(view, (), str(exc))
        actions: list[Action] = []
        for event in events:
            epoch = view.epoch
            view, more = decide(view, event)
            actions += more
            if view.epoch != epoch:
                # Each event's view, not only the entry's last: an entry of several events could
                # otherwise hide an epoch between them.
                self._changes.append(change_record(self._entries + 1, view))
                self._changes_seen += 1
        self._view_json = canonical_bytes(view).decode()
        self._entries += 1
        self._history.append((self._entries, view_hash(view)))
        return Applied(view, tuple(actions))

    # --- reading -------------------------------------------------------------------------------

    def view(self) -> ManagerView:
        return self._current()[0]

    def view_hash(self) -> str:
        return self._current()[1]

    def _current(self) -> tuple[ManagerView, str]:
        key = self._view_json
        cache = self._cache
        with cache.lock:
            if key is not None and key != cache.key:
                view = ManagerView.from_data(json.loads(key))
                cache.key, cache.view, cache.hash = key, view, view_hash(view)
            elif key is None and cache.key is not None:  # pragma: no cover - never goes back
                cache.key, cache.view, cache.hash = None, self._first, view_hash(self._first)
            return cache.view, cache.hash

    def applied_entries(self) -> int:
        return self._entries

    def recent_hashes(self) -> list[tuple[int, str]]:
        """(entries applied, view hash after it) for the last entries this member applied."""
        return list(self._history)

    def changes(self) -> tuple[list[dict[str, Any]], int]:
        """The chain changes this member applied since it started, oldest first (at most
        ``manager_change_history_epochs``), and how many older ones were dropped."""
        kept = list(self._changes)
        return kept, self._changes_seen - len(kept)

    def is_leader(self) -> bool:
        return bool(self._isLeader())

    def leader(self) -> str | None:
        """The member id this member believes leads, or None during an election."""
        node = self._getLeader()
        if node is None:
            return None
        return self._members.get(getattr(node, "address", str(node)))

    def term(self) -> int:
        return int(self._getTerm())

    def ready(self) -> bool:
        return bool(self.isReady())

    # --- logging from the event loop -----------------------------------------------------------

    def submit(
        self, events: list[Event], done: Callable[[Applied | None, str | None], None]
    ) -> None:
        """Logs one entry; ``done(applied, None)`` runs on pysyncobj's thread once this member
        applied it (leader only), ``done(None, reason)`` if it could not be committed."""

        def callback(result: Any, error: Any) -> None:
            if error == 0 and isinstance(result, Applied):
                done(result, result.refused)
            else:
                done(None, f"not committed (pysyncobj reason {error})")

        self.apply(encode_entry(events), callback=callback)

    def close(self) -> None:
        """Stops pysyncobj's thread (and with it the Raft port and the journal)."""
        self.destroy_synchronous()


def change_record(entry: int, view: ManagerView) -> dict[str, Any]:
    """One epoch as ``GET /v1/manager/changes`` shows it: the entry that made it (entries applied
    so far, this one included), the epoch, every shard's chain and pending moves, and the queue
    shard counts operators set."""
    return {
        "entry": entry,
        "epoch": view.epoch,
        "shards": [
            {"id": s.id, "chain": list(s.chain), "moves": [list(m) for m in s.moves]}
            for s in view.shards
        ],
        "queues": [list(q) for q in view.queues],
    }


def wait_applied(log_: ManagerLog, events: list[Event], timeout_s: float) -> Applied:
    """Blocking ``submit`` for tests and tools: the applied result or an error."""
    box: list[tuple[Applied | None, str | None]] = []
    done = threading.Event()

    def finished(applied: Applied | None, reason: str | None) -> None:
        box.append((applied, reason))
        done.set()

    log_.submit(events, finished)
    if not done.wait(timeout_s):
        raise OperationTimeoutError(f"log entry not applied within {timeout_s}s")
    applied, reason = box[0]
    if applied is None:
        raise OperationTimeoutError(reason or "log entry not applied")
    return applied
