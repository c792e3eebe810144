"""A recorded history: every operation a campaign's clients invoked, and what came back.

Events are plain dataclasses, one JSON object a line when written (``dump_jsonl``), so a run's
history can be kept and checked again later (``kayos chaos check FILE`` is not there yet; the
checker takes ``load_jsonl``'s list as it is). Keys and values are text: the campaign produces
UTF-8 keys and values only. ``None`` as a value is a delete (a tombstone).

Order: a ``Recorder`` hands out one counter shared by every thread, so ``invoked`` and
``completed`` of different events compare (event A completed before B was invoked iff
``A.completed < B.invoked``). ``at_s`` is seconds since the recording started, for reports.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

# An operation either succeeded ("ok"), or its outcome is unknown ("unknown": an error, a
# timeout; it may or may not have taken effect). The checker never assumes an unknown one failed.
Outcome: TypeAlias = Literal["ok", "unknown"]


@dataclass(frozen=True, slots=True)
class Produce:
    """A produce call: ``items`` as (key, value-or-None) in order; ``txn`` all-or-nothing.
    When ok, item i got seq ``first_seq + i``."""

    op: int
    queue: str
    items: tuple[tuple[str, str | None], ...]
    txn: bool
    acks: str
    outcome: Outcome
    first_seq: int = 0
    last_seq: int = 0
    invoked: int = 0
    completed: int = 0
    at_s: float = 0.0
    error: str = ""
    kind: Literal["produce"] = "produce"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consumer snapshot ``(hwm, boundary]`` of a group, as delivered page after page:
    ``messages`` are (seq, key, value-or-None). ``finished`` says the last page (``end``) came;
    an unfinished snapshot broke off with an error part way."""

    op: int
    queue: str
    group: str
    shard: int
    hwm: int
    boundary: int
    messages: tuple[tuple[int, str, str | None], ...]
    finished: bool
    invoked: int = 0
    completed: int = 0
    at_s: float = 0.0
    error: str = ""
    kind: Literal["snapshot"] = "snapshot"


@dataclass(frozen=True, slots=True)
class Commit:
    """A group commit of ``hwm``."""

    op: int
    queue: str
    group: str
    hwm: int
    outcome: Outcome
    invoked: int = 0
    completed: int = 0
    at_s: float = 0.0
    error: str = ""
    kind: Literal["commit"] = "commit"


@dataclass(frozen=True, slots=True)
class Note:
    """Anything else worth keeping in the record (a fault, the queue-to-shard map); the checker
    ignores notes."""

    op: int
    what: str
    detail: dict[str, Any] = field(default_factory=dict)
    invoked: int = 0
    completed: int = 0
    at_s: float = 0.0
    kind: Literal["note"] = "note"


Event: TypeAlias = Produce | Snapshot | Commit | Note
_KINDS: dict[str, type[Event]] = {
    "produce": Produce,
    "snapshot": Snapshot,
    "commit": Commit,
    "note": Note,
}
_TUPLE_FIELDS = {"items", "messages"}


def to_json(event: Event) -> str:
    return json.dumps(asdict(event), sort_keys=True)


def from_json(line: str) -> Event:
    raw: Any = json.loads(line)
    if not isinstance(raw, dict) or raw.get("kind") not in _KINDS:
        raise ValueError(f"not a history event: {line[:200]!r}")
    fields: dict[str, Any] = {
        name: tuple(tuple(row) for row in value) if name in _TUPLE_FIELDS else value
        for name, value in raw.items()
    }
    return _KINDS[raw["kind"]](**fields)


def dump_jsonl(events: Iterable[Event], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for event in events:
            out.write(to_json(event) + "\n")


def load_jsonl(path: str | Path) -> list[Event]:
    with open(path, encoding="utf-8") as source:
        return [from_json(line) for line in source if line.strip()]


class Recorder:
    """Thread-safe: hands out op ids and the shared order counter, and keeps the events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tick = 0
        self._start = time.monotonic()
        self.events: list[Event] = []

    def tick(self) -> int:
        """The next point of the shared order (an op's ``invoked``, then its ``completed``)."""
        with self._lock:
            self._tick += 1
            return self._tick

    def now_s(self) -> float:
        return time.monotonic() - self._start

    def add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def note(self, what: str, **detail: Any) -> None:
        point = self.tick()
        self.add(Note(point, what, detail, point, point, self.now_s()))

    def snapshot_of_events(self) -> list[Event]:
        with self._lock:
            return sorted(self.events, key=lambda event: (event.invoked, event.op))
