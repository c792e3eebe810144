"""The checker (chaos/checker.py): a good history passes, and each property fails on a history
built to break it. Histories are written by hand: a producer, one group, one queue."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from chaos import checker
from chaos.history import Commit, Event, Note, Produce, Snapshot, dump_jsonl, load_jsonl

pytestmark = pytest.mark.chaos

Q = "q"
G = "g"


class Builder:
    """Appends events in the order given; each one completes before the next is invoked."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.tick = 0

    def _points(self) -> tuple[int, int, int]:
        self.tick += 2
        return len(self.events) + 1, self.tick - 1, self.tick

    def produce(
        self,
        items: list[tuple[str, str | None]],
        first_seq: int,
        *,
        txn: bool = False,
        outcome: str = "ok",
    ) -> None:
        op, invoked, completed = self._points()
        last = first_seq + len(items) - 1 if outcome == "ok" else 0
        self.events.append(
            Produce(
                op,
                Q,
                tuple(items),
                txn,
                "all",
                outcome,  # type: ignore[arg-type]
                first_seq if outcome == "ok" else 0,
                last,
                invoked,
                completed,
            )
        )

    def snapshot(
        self,
        hwm: int,
        boundary: int,
        messages: list[tuple[int, str, str | None]],
        *,
        finished: bool = True,
        group: str = G,
    ) -> None:
        op, invoked, completed = self._points()
        self.events.append(
            Snapshot(op, Q, group, 0, hwm, boundary, tuple(messages), finished, invoked, completed)
        )

    def commit(self, hwm: int, *, outcome: str = "ok", group: str = G) -> None:
        op, invoked, completed = self._points()
        self.events.append(Commit(op, Q, group, hwm, outcome, invoked, completed))  # type: ignore[arg-type]


def good_history() -> Builder:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1"), ("c", "c1")], 2, txn=True)
    b.snapshot(0, 3, [(1, "a", "a1"), (2, "b", "b1"), (3, "c", "c1")])
    b.commit(3)
    b.produce([("a", "a2")], 4)
    b.produce([("a", "a3")], 5)  # supersedes a2 before anyone reads it
    b.produce([("d", "d1")], 0, outcome="unknown")  # in doubt: may or may not be there
    b.produce([("b", None)], 6)  # a delete: consumers see a tombstone
    b.snapshot(3, 6, [(5, "a", "a3"), (6, "b", None)])
    b.commit(6)
    b.snapshot(6, 6, [])
    return b


def props(events: list[Event]) -> set[str]:
    return {violation.prop for violation in checker.check(events).violations}


def test_a_good_history_passes() -> None:
    verdict = checker.check(good_history().events)
    assert verdict.ok, verdict.violations
    assert verdict.acked_versions == 6
    assert verdict.lost_versions == 0
    assert verdict.by_property() == dict.fromkeys(checker.PROPERTIES, 0)


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    events = [*good_history().events, Note(99, "fault", {"kind": "kill9", "node": "a"}, 99, 99)]
    path = tmp_path / "history.jsonl"
    dump_jsonl(events, path)
    assert load_jsonl(path) == events
    assert checker.check(load_jsonl(path)).ok


def test_lost_acknowledged_version() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1")], 2)
    b.snapshot(0, 2, [(2, "b", "b1")])  # seq 1 vanished
    verdict = checker.check(b.events)
    assert "lost" in props(b.events)
    assert verdict.lost_versions == 1


def test_lost_when_a_group_never_read_far_enough() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.snapshot(0, 0, [])  # the drain stopped short: unseen counts as lost
    assert checker.check(b.events).lost_versions == 1


def test_superseded_version_is_not_lost() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("a", "a2")], 2)
    b.snapshot(0, 2, [(2, "a", "a2")])
    assert checker.check(b.events).ok


def test_order_within_a_snapshot() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1")], 2)
    b.snapshot(0, 2, [(2, "b", "b1"), (1, "a", "a1")])
    assert props(b.events) == {"order"}


def test_order_outside_the_snapshot_range() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1")], 2)
    b.snapshot(0, 1, [(1, "a", "a1"), (2, "b", "b1")])
    assert "order" in props(b.events)


def test_order_redelivery_after_an_acknowledged_commit() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.snapshot(0, 1, [(1, "a", "a1")])
    b.commit(1)
    b.snapshot(0, 1, [(1, "a", "a1")])  # the committed mark forgotten: delivered again
    assert "order" in props(b.events)


def test_redelivery_after_an_unknown_commit_is_allowed() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.snapshot(0, 1, [(1, "a", "a1")])
    b.commit(1, outcome="unknown")
    b.snapshot(0, 1, [(1, "a", "a1")])
    assert checker.check(b.events).ok


def test_torn_transaction() -> None:
    b = Builder()
    b.produce([("a", "a1"), ("b", "b1"), ("c", "c1")], 1, txn=True)
    b.snapshot(0, 3, [(1, "a", "a1"), (3, "c", "c1")])
    assert "atomic" in props(b.events)


def test_torn_transaction_of_unknown_outcome() -> None:
    # Never acknowledged, so only the snapshot shows where it landed (its values say which call).
    b = Builder()
    b.produce([("a", "a1"), ("b", "b1")], 0, txn=True, outcome="unknown")
    b.snapshot(0, 7, [(6, "a", "a1")])
    assert props(b.events) == {"atomic"}


def test_transaction_entry_superseded_inside_the_snapshot_is_fine() -> None:
    b = Builder()
    b.produce([("a", "a1"), ("b", "b1")], 1, txn=True)
    b.produce([("b", "b2")], 3)
    b.snapshot(0, 3, [(1, "a", "a1"), (3, "b", "b2")])
    assert checker.check(b.events).ok


def test_dedup_superseded_version_delivered() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("a", "a2")], 2)
    b.snapshot(0, 2, [(1, "a", "a1")])
    assert "dedup" in props(b.events)


def test_dedup_key_twice_in_a_snapshot() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("a", "a2")], 2)
    b.snapshot(0, 2, [(1, "a", "a1"), (2, "a", "a2")])
    assert "dedup" in props(b.events)


def test_dedup_phantom_value() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.snapshot(0, 1, [(1, "a", "zzz")])
    assert "dedup" in props(b.events)


def test_dedup_latest_version_missing_from_a_snapshot() -> None:
    # Not lost overall (a later snapshot has it), but the snapshot that covered it left it out.
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1")], 2)
    b.snapshot(0, 2, [(2, "b", "b1")])
    b.snapshot(0, 2, [(1, "a", "a1"), (2, "b", "b1")], group="other")
    b.snapshot(0, 2, [(1, "a", "a1"), (2, "b", "b1")])
    assert props(b.events) == {"dedup"}


def test_hwm_moves_backwards() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1")], 2)
    b.snapshot(0, 1, [(1, "a", "a1")])
    b.commit(1)
    b.snapshot(1, 2, [(2, "b", "b1")])
    b.commit(2)
    b.snapshot(1, 2, [])  # back to 1 (de-dup also sees seq 2 missing from (1, 2])
    assert "hwm" in props(b.events)


def test_hwm_from_nowhere() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.snapshot(0, 1, [(1, "a", "a1")])
    b.snapshot(5, 5, [])
    assert props(b.events) == {"hwm"}


def test_atomic_snapshot_range_splits_a_transaction() -> None:
    b = Builder()
    b.produce([("a", "a1"), ("b", "b1")], 1, txn=True)
    b.snapshot(0, 1, [(1, "a", "a1")])  # a boundary inside the transaction
    b.commit(1)
    b.snapshot(1, 2, [(2, "b", "b1")])
    violations = checker.check_atomic(b.events)
    assert props(b.events) == {"atomic"}
    assert "splits the transaction" in violations[0].detail["examples"][0]["why"]


def test_dedup_not_what_was_acknowledged_at_the_seq() -> None:
    # a2 was produced (in doubt), but seq 1 was acknowledged to a1's call.
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("a", "a2")], 0, outcome="unknown")
    b.snapshot(0, 1, [(1, "a", "a2")])
    violations = checker.check_dedup(b.events)
    assert props(b.events) == {"dedup"}
    assert violations[0].detail["examples"][0]["why"] == "not what was acknowledged at this seq"


def test_hwm_starts_below_an_acknowledged_commit() -> None:
    b = Builder()
    b.produce([("a", "a1")], 1)
    b.produce([("b", "b1")], 2)
    b.snapshot(0, 1, [(1, "a", "a1")])
    b.commit(1)
    b.snapshot(0, 2, [(2, "b", "b1")])  # the group committed 1, and is served from 0
    violations = checker.check_hwm(b.events)
    assert "hwm" in props(b.events)
    assert any(
        "below the acknowledged commit" in example["why"]
        for violation in violations
        for example in violation.detail["examples"]
    )


@pytest.mark.parametrize("prop", checker.PROPERTIES)
def test_each_property_is_checked(prop: str) -> None:
    """Every property named has a function, and the good history is clean for it."""
    events = good_history().events
    function = getattr(checker, f"check_{prop}")
    result = function(events)
    violations = result[0] if isinstance(result, tuple) else result
    assert violations == []
    # A history with one corrupted snapshot is flagged by at least one property.
    broken = [
        dataclasses.replace(e, messages=(*e.messages, (99, "zz", "zz")))
        if isinstance(e, Snapshot) and e.messages
        else e
        for e in events
    ]
    assert not checker.check(broken).ok
