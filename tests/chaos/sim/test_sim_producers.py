"""The simulator's idempotent producers (chaos/sim/producers.py, docs/testing.md "The
simulator"): the head's producer window decides as the design says, the store keeps it as a
function of its log (a lost write leaves it), and the exactly-once and producer-order checks fail
on logs that break them."""

from __future__ import annotations

import pytest

from chaos.sim.producers import CallRecord, check_logs, window_decision
from chaos.sim.store import Entry, Store

pytestmark = pytest.mark.chaos

P = "aa" * 16


def call(op: int, pseq: int, first: int, last: int, outcome: str = "ok") -> CallRecord:
    return CallRecord(op, P, pseq, 0, last - first + 1 if first else 1, outcome, first, last, op)


def test_the_window_answers_a_resend_refuses_the_too_old_and_writes_the_rest() -> None:
    window = {5: (10, 11), 6: (12, 12)}
    assert window_decision(window, 6, 2) == ("duplicate", (12, 12))
    assert window_decision(window, 4, 2) == ("too_old", None)
    assert window_decision(window, 4, 3) == ("write", None)  # not full: it may be new
    assert window_decision(window, 7, 2) == ("write", None)
    assert window_decision(None, 1, 2) == ("write", None)


def test_the_store_window_follows_its_log() -> None:
    store = Store(window_entries=2)
    for pseq, seq in ((1, 1), (2, 2), (3, 3)):
        store.add_pending((Entry(seq, "k", "v", producer=P, pseq=pseq),))
    assert store.producers[P] == {2: (2, 2), 3: (3, 3)}  # the oldest forgotten
    store.batches, store.pending = store.pending[:2], store.pending[2:]
    store.crash()  # the unsynced write of pseq 3 is lost, and the window with it
    assert store.producers[P] == {1: (1, 1), 2: (2, 2)}
    store.truncate(1)
    assert store.producers[P] == {1: (1, 1)}


def test_a_clean_log_passes() -> None:
    log = [(1, P, 1), (2, P, 1), (3, "", 0), (4, P, 2)]
    assert check_logs({0: log}, [call(1, 1, 1, 2), call(2, 2, 4, 4)]) == []


def test_a_call_written_twice_is_found() -> None:
    log = [(1, P, 1), (2, P, 2), (3, P, 1)]
    found = check_logs({0: log}, [call(1, 1, 1, 1), call(2, 2, 2, 2)])
    assert [v["property"] for v in found] == ["exactly_once"]
    assert found[0]["detail"]["examples"][0]["in_log"] == [1, 3]


def test_an_unknown_call_written_twice_is_found() -> None:
    log = [(1, P, 1), (2, P, 1)]
    found = check_logs({0: log}, [call(1, 1, 0, 0, "unknown")])
    assert [v["property"] for v in found] == ["exactly_once"]


def test_an_acknowledged_call_missing_or_elsewhere_is_found() -> None:
    found = check_logs({0: [(5, P, 1)]}, [call(1, 1, 4, 4)])
    assert [v["property"] for v in found] == ["exactly_once"]
    assert check_logs({0: []}, [call(1, 1, 4, 4)])[0]["property"] == "exactly_once"


def test_acknowledged_calls_out_of_the_producers_order_are_found() -> None:
    log = [(1, P, 2), (2, P, 1)]
    found = check_logs({0: log}, [call(1, 1, 2, 2), call(2, 2, 1, 1)])
    assert [v["property"] for v in found] == ["producer_order"]
