"""``kayos bench grow``'s verdict after the moves: every acknowledged message consumed, each
producer's in the order it sent them (kayos.bench.membership.consumed)."""

from __future__ import annotations

import pytest

from kayos.bench.membership.consumed import order_verdict

pytestmark = pytest.mark.unit


def test_everything_consumed_in_order_passes() -> None:
    acked = [("q0", "p0-1"), ("q1", "p0-2"), ("q0", "p1-1"), ("q0", "p0-3")]
    consumed = {"q0": ["p0-1", "p1-1", "p0-3"], "q1": ["p0-2"]}
    verdict = order_verdict(acked, consumed)
    assert verdict["consumed_in_order"] is True
    assert (verdict["lost"], verdict["out_of_order"]) == (0, 0)
    assert (verdict["acked_messages"], verdict["consumed_messages"]) == (4, 4)


def test_an_acknowledged_message_never_consumed_is_lost() -> None:
    acked = [("q0", "p0-1"), ("q0", "p0-3")]
    verdict = order_verdict(acked, {"q0": ["p0-1"]})
    assert verdict["consumed_in_order"] is False
    assert verdict["lost"] == 1
    assert verdict["lost_examples"] == ["p0-3"]


def test_a_thread_s_messages_swapped_in_one_queue_are_out_of_order() -> None:
    acked = [("q0", "p0-1"), ("q0", "p0-3"), ("q0", "p1-1")]
    # p1 interleaving is fine; p0-3 before p0-1 is not.
    verdict = order_verdict(acked, {"q0": ["p1-1", "p0-3", "p0-1"]})
    assert verdict["consumed_in_order"] is False
    assert verdict["out_of_order"] == 1
    assert verdict["out_of_order_examples"] == ["p0-3"]


def test_order_is_judged_per_queue_and_unacknowledged_extras_are_allowed() -> None:
    # p0-2 went to q1 and came out "before" p0-1 of q0 there: other queue, no order between
    # them. p0-4 failed (not acknowledged) but landed: consumed, not counted.
    acked = [("q0", "p0-1"), ("q1", "p0-2"), ("q0", "p0-3")]
    consumed = {"q0": ["p0-1", "p0-4", "p0-3"], "q1": ["p0-2"]}
    verdict = order_verdict(acked, consumed)
    assert verdict["consumed_in_order"] is True
    assert verdict["consumed_messages"] == 4


def test_a_key_in_the_wrong_queue_is_lost() -> None:
    verdict = order_verdict([("q0", "p0-1")], {"q1": ["p0-1"]})
    assert verdict["lost"] == 1
