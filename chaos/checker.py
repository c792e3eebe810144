"""The checker: pure functions over a recorded history (``chaos.history``) that say whether it
breaks a property Kayos promises. No I/O, no clock: the same history always gets the same verdict.

What the history must hold for the verdicts to mean what they say (the campaign's workload keeps
to it): every produced value is unique to its produce call (a retried call may land twice, at two
seqs, and that is allowed), a batch names each key at most once (item i of a batch gets seq
``first_seq + i``), no expiries, and each consumer group is read by one consumer at a time (its
snapshots and commits are sequential).

"Known committed" versions of a key are those the history proves committed: acknowledged under
``acks=all``, or delivered to any consumer (consumers read only what every replica holds).

Properties (each has a test feeding it a history that breaks it, tests/chaos/test_chaos_checker.py):

- ``lost``: every acknowledged (acks=all) version was delivered to every group of its queue,
  unless a later committed version of its key superseded it.
- ``order``: within a snapshot seqs strictly increase and lie in ``(hwm, boundary]``; across a
  group's snapshots nothing at or below a high-water mark already committed is delivered again.
- ``atomic``: a finished snapshot holds all of a transaction's surviving entries or none
  (surviving: not superseded by a later version at or below the boundary).
- ``dedup``: a finished snapshot holds each key at most once, with a value some call produced for
  that key, and exactly the latest known committed version of each key in ``(hwm, boundary]``.
- ``hwm``: a group's high-water mark never moves backwards: each snapshot starts at or past every
  commit acknowledged before it was asked for, at or below some commit asked for, and snapshots of
  a group start at non-decreasing marks.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Commit, Event, Produce, Snapshot

PROPERTIES = ("lost", "order", "atomic", "dedup", "hwm")
# Examples of a violation quoted in its detail; the count is always whole.
examples_max = 10

QueueKey = tuple[str, str]


@dataclass(frozen=True)
class Violation:
    prop: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"property": self.prop, "message": self.message, "detail": self.detail}


@dataclass
class Verdict:
    violations: list[Violation]
    acked_versions: int  # versions acknowledged under acks=all
    lost_versions: int  # of them, not delivered to some group and not superseded
    delivered_messages: int
    snapshots: int

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_property(self) -> dict[str, int]:
        counts = dict.fromkeys(PROPERTIES, 0)
        for violation in self.violations:
            counts[violation.prop] = counts.get(violation.prop, 0) + 1
        return counts


# --- what a history proves ------------------------------------------------------------------------


def _produces(events: Iterable[Event]) -> list[Produce]:
    return [event for event in events if isinstance(event, Produce)]


def _snapshots(events: Iterable[Event]) -> list[Snapshot]:
    return sorted(
        (event for event in events if isinstance(event, Snapshot)),
        key=lambda event: (event.invoked, event.op),
    )


def _commits(events: Iterable[Event]) -> list[Commit]:
    return [event for event in events if isinstance(event, Commit)]


def acked_versions(events: Iterable[Event]) -> list[tuple[str, str, int, str | None]]:
    """(queue, key, seq, value) of every version acknowledged under acks=all."""
    found = []
    for produce in _produces(events):
        if produce.outcome == "ok" and produce.acks == "all":
            for index, (key, value) in enumerate(produce.items):
                found.append((produce.queue, key, produce.first_seq + index, value))
    return found


def known_committed(events: Sequence[Event]) -> dict[QueueKey, list[int]]:
    """Each (queue, key)'s versions the history proves committed, as sorted seqs."""
    seqs: dict[QueueKey, set[int]] = defaultdict(set)
    for queue, key, seq, _value in acked_versions(events):
        seqs[(queue, key)].add(seq)
    for snapshot in _snapshots(events):
        for seq, key, _value in snapshot.messages:
            seqs[(snapshot.queue, key)].add(seq)
    return {queue_key: sorted(found) for queue_key, found in seqs.items()}


def _later_than(sorted_seqs: list[int], seq: int, upto: int | None = None) -> int | None:
    """The greatest seq in ``sorted_seqs`` above ``seq`` (and at most ``upto``), if any. By
    bisection, without copying: a key's versions run to tens of thousands in a long campaign,
    and this is asked once per delivered message."""
    index = len(sorted_seqs) if upto is None else bisect.bisect_right(sorted_seqs, upto)
    if index and sorted_seqs[index - 1] > seq:
        return sorted_seqs[index - 1]
    return None


def _groups(events: Sequence[Event]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = defaultdict(set)
    for snapshot in _snapshots(events):
        groups[snapshot.queue].add(snapshot.group)
    return groups


def _violation(prop: str, message: str, examples: list[Any], count: int) -> Violation:
    return Violation(prop, message, {"count": count, "examples": examples[:examples_max]})


# --- the properties -------------------------------------------------------------------------------


def check_lost(events: Sequence[Event]) -> tuple[list[Violation], int]:
    """Returns the violations and the number of acknowledged versions lost."""
    committed = known_committed(events)
    groups = _groups(events)
    seen: dict[tuple[str, str], set[int]] = defaultdict(set)
    for snapshot in _snapshots(events):
        seen[(snapshot.queue, snapshot.group)].update(seq for seq, _k, _v in snapshot.messages)
    lost: list[dict[str, Any]] = []
    for queue, key, seq, value in acked_versions(events):
        if _later_than(committed.get((queue, key), []), seq) is not None:
            continue  # superseded by a later committed version of the key
        missing = sorted(
            group for group in groups.get(queue, ()) if seq not in seen[(queue, group)]
        )
        if missing or queue not in groups:
            lost.append({"queue": queue, "key": key, "seq": seq, "value": value, "groups": missing})
    if not lost:
        return [], 0
    return [
        _violation("lost", f"{len(lost)} acknowledged versions never delivered", lost, len(lost))
    ], len(lost)


def _ok_commits_by_group(events: Sequence[Event]) -> dict[tuple[str, str], list[Commit]]:
    commits: dict[tuple[str, str], list[Commit]] = defaultdict(list)
    for commit in _commits(events):
        commits[(commit.queue, commit.group)].append(commit)
    return commits


class _GroupCommits:
    """One group's commits, indexed so that each snapshot's questions take a bisection rather
    than a pass over every commit (a long campaign has hundreds of thousands of both)."""

    def __init__(self, commits: list[Commit]) -> None:
        acked = sorted((c.completed, c.hwm) for c in commits if c.outcome == "ok")
        self._completed = [completed for completed, _hwm in acked]
        self._best: list[int] = list(itertools.accumulate((hwm for _c, hwm in acked), max))
        # Each mark some commit asked for, with the earliest point one was invoked.
        self._first_asked: dict[int, int] = {}
        for commit in commits:
            known = self._first_asked.get(commit.hwm)
            if known is None or commit.invoked < known:
                self._first_asked[commit.hwm] = commit.invoked

    def acked_mark_before(self, point: int) -> int:
        """The highest mark of a commit acknowledged before ``point`` in the shared order."""
        index = bisect.bisect_left(self._completed, point)
        return self._best[index - 1] if index else 0

    def asked_before(self, hwm: int, point: int) -> bool:
        """Whether ``hwm`` is 0 or a mark some commit invoked before ``point`` asked for."""
        first = self._first_asked.get(hwm)
        return hwm == 0 or (first is not None and first < point)


def _indexed_commits(events: Sequence[Event]) -> dict[tuple[str, str], _GroupCommits]:
    by_group = _ok_commits_by_group(events)
    return defaultdict(
        lambda: _GroupCommits([]), {g: _GroupCommits(c) for g, c in by_group.items()}
    )


def check_order(events: Sequence[Event]) -> list[Violation]:
    commits = _indexed_commits(events)
    bad: list[dict[str, Any]] = []
    for snapshot in _snapshots(events):
        seqs = [seq for seq, _k, _v in snapshot.messages]
        where = {"queue": snapshot.queue, "group": snapshot.group, "op": snapshot.op}
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            bad.append({**where, "why": "seqs not strictly increasing", "seqs": seqs[:50]})
        outside = [s for s in seqs if not snapshot.hwm < s <= snapshot.boundary]
        if outside:
            bad.append(
                {
                    **where,
                    "why": f"seqs outside ({snapshot.hwm}, {snapshot.boundary}]",
                    "seqs": outside[:50],
                }
            )
        mark = commits[(snapshot.queue, snapshot.group)].acked_mark_before(snapshot.invoked)
        again = [s for s in seqs if s <= mark]
        if again:
            bad.append(
                {
                    **where,
                    "why": f"delivered again at or below committed {mark}",
                    "seqs": again[:50],
                }
            )
    if not bad:
        return []
    return [_violation("order", f"{len(bad)} snapshots delivered out of order", bad, len(bad))]


def check_atomic(events: Sequence[Event]) -> list[Violation]:
    # (queue, key, value) -> (the transaction's items, index): values are unique per call.
    member: dict[tuple[str, str, str], tuple[tuple[tuple[str, str | None], ...], int]] = {}
    for produce in _produces(events):
        if produce.txn and len(produce.items) > 1:
            for index, (key, value) in enumerate(produce.items):
                if value is not None:
                    member[(produce.queue, key, value)] = (produce.items, index)
    bad: list[dict[str, Any]] = []
    for snapshot in _snapshots(events):
        if not snapshot.finished:
            continue
        by_seq = {seq: (key, value) for seq, key, value in snapshot.messages}
        latest: dict[str, int] = {}
        for seq, key, _value in snapshot.messages:
            latest[key] = max(seq, latest.get(key, 0))
        checked: set[int] = set()
        for seq, key, value in snapshot.messages:
            if value is None or (snapshot.queue, key, value) not in member:
                continue
            items, index = member[(snapshot.queue, key, value)]
            start = seq - index
            if start in checked:
                continue
            checked.add(start)
            for offset, (item_key, item_value) in enumerate(items):
                at = start + offset
                where = {
                    "queue": snapshot.queue,
                    "group": snapshot.group,
                    "op": snapshot.op,
                    "txn_first_seq": start,
                    "seq": at,
                    "key": item_key,
                }
                if not snapshot.hwm < at <= snapshot.boundary:
                    bad.append({**where, "why": "the snapshot's range splits the transaction"})
                elif by_seq.get(at) == (item_key, item_value):
                    continue
                elif latest.get(item_key, 0) > at:
                    continue  # superseded inside the snapshot by a later version
                else:
                    bad.append({**where, "why": "entry missing from a snapshot holding others"})
    if not bad:
        return []
    return [_violation("atomic", f"{len(bad)} transaction entries torn", bad, len(bad))]


def check_dedup(events: Sequence[Event]) -> list[Violation]:
    committed = known_committed(events)
    produced: dict[QueueKey, set[str | None]] = defaultdict(set)
    acked_at: dict[tuple[str, int], tuple[str, str | None]] = {}
    for produce in _produces(events):
        for key, value in produce.items:
            produced[(produce.queue, key)].add(value)
    for queue, key, seq, value in acked_versions(events):
        acked_at[(queue, seq)] = (key, value)
    by_queue: dict[str, list[QueueKey]] = defaultdict(list)
    for queue_key in committed:
        by_queue[queue_key[0]].append(queue_key)
    bad: list[dict[str, Any]] = []
    for snapshot in _snapshots(events):
        if not snapshot.finished:
            continue
        queue = snapshot.queue
        where = {
            "queue": queue,
            "group": snapshot.group,
            "op": snapshot.op,
            "hwm": snapshot.hwm,
            "boundary": snapshot.boundary,
        }
        held: dict[str, int] = {}
        for seq, key, value in snapshot.messages:
            if key in held:
                bad.append(
                    {**where, "why": "key delivered twice", "key": key, "seqs": [held[key], seq]}
                )
            held[key] = seq
            if value not in produced.get((queue, key), set()):
                bad.append(
                    {
                        **where,
                        "why": "a value nobody produced for the key",
                        "key": key,
                        "seq": seq,
                        "value": value,
                    }
                )
            expected = acked_at.get((queue, seq))
            if expected is not None and expected != (key, value):
                bad.append(
                    {
                        **where,
                        "why": "not what was acknowledged at this seq",
                        "seq": seq,
                        "got": [key, value],
                        "acked": list(expected),
                    }
                )
            newer = _later_than(committed.get((queue, key), []), seq, snapshot.boundary)
            if newer is not None:
                bad.append(
                    {
                        **where,
                        "why": "a superseded version delivered",
                        "key": key,
                        "seq": seq,
                        "newer": newer,
                    }
                )
        bad += _latest_missing(snapshot, held, by_queue.get(queue, []), committed, where)
    if not bad:
        return []
    return [_violation("dedup", f"{len(bad)} de-dup faults in snapshots", bad, len(bad))]


def _latest_missing(
    snapshot: Snapshot,
    held: dict[str, int],
    queue_keys: list[QueueKey],
    committed: dict[QueueKey, list[int]],
    where: dict[str, Any],
) -> list[dict[str, Any]]:
    """The keys of the snapshot's queue whose latest version committed in ``(hwm, boundary]`` the
    snapshot does not hold (``held``: key -> the seq it delivered)."""
    bad: list[dict[str, Any]] = []
    for queue_key in queue_keys:
        seqs = committed[queue_key]
        index = bisect.bisect_right(seqs, snapshot.boundary)
        if index and seqs[index - 1] > snapshot.hwm:
            latest = seqs[index - 1]
            if held.get(queue_key[1], 0) < latest:
                bad.append(
                    {
                        **where,
                        "why": "the latest committed version is missing",
                        "key": queue_key[1],
                        "latest": latest,
                        "delivered": held.get(queue_key[1]),
                    }
                )
    return bad


def check_hwm(events: Sequence[Event]) -> list[Violation]:
    commits = _indexed_commits(events)
    last_start: dict[tuple[str, str], int] = {}
    bad: list[dict[str, Any]] = []
    for snapshot in _snapshots(events):
        group = (snapshot.queue, snapshot.group)
        where = {
            "queue": snapshot.queue,
            "group": snapshot.group,
            "op": snapshot.op,
            "hwm": snapshot.hwm,
        }
        acked = commits[group].acked_mark_before(snapshot.invoked)
        if snapshot.hwm < acked:
            bad.append({**where, "why": f"starts below the acknowledged commit {acked}"})
        if not commits[group].asked_before(snapshot.hwm, snapshot.completed):
            bad.append({**where, "why": "starts at a mark no commit asked for"})
        if snapshot.hwm < last_start.get(group, 0):
            bad.append({**where, "why": f"moved back from {last_start[group]}"})
        last_start[group] = max(snapshot.hwm, last_start.get(group, 0))
    if not bad:
        return []
    return [_violation("hwm", f"{len(bad)} high-water marks moved backwards", bad, len(bad))]


def check(events: Sequence[Event]) -> Verdict:
    """Every property over one history."""
    events = list(events)
    violations, lost = check_lost(events)
    violations += check_order(events)
    violations += check_atomic(events)
    violations += check_dedup(events)
    violations += check_hwm(events)
    snapshots = _snapshots(events)
    return Verdict(
        violations=violations,
        acked_versions=len(acked_versions(events)),
        lost_versions=lost,
        delivered_messages=sum(len(s.messages) for s in snapshots),
        snapshots=len(snapshots),
    )
