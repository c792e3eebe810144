"""A node killed during its catch-up restarts with no learner of the shard (its status lists
no entry for it): the driver must order it to catch up again, or it never rejoins. Found by the
real-process campaign (seed 7, ``rejoin_kill_self``: docs/campaigns.md "Findings")."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.manager.member.plan import CatchUpOrder, plan_round
from tests.support.answers import answers, catching_up_b, everyone, status

pytestmark = pytest.mark.unit


def test_a_catching_up_node_that_lists_no_entry_for_the_shard_is_ordered_again() -> None:
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 9_000}, 2: {"last_seq": 9_000}})
    c = status(shards={0: {"last_seq": 9_000}})
    b = status(epoch=view.epoch)  # restarted: a member of no chain, no learner yet
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, everyone(view))
    assert plan.send_catch_up == [
        CatchUpOrder("b", 0, "c"),
        CatchUpOrder("b", 1, "a"),
        CatchUpOrder("b", 2, "a"),
    ]
    soon = plan_round(view, answers(a=a, b=b, c=c), 6_100, plan.memory)
    assert soon.send_catch_up == []  # still at most one order per interval
    interval = limits.manager_resend_interval_ms
    later = plan_round(view, answers(a=a, b=b, c=c), 6_000 + interval, soon.memory)
    assert len(later.send_catch_up) == 3


def test_a_node_that_does_not_answer_is_not_ordered() -> None:
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 9_000}, 2: {"last_seq": 9_000}})
    c = status(shards={0: {"last_seq": 9_000}})
    plan = plan_round(view, answers(a=a, c=c), 6_000, everyone(view))
    assert plan.send_catch_up == []


def test_a_learner_of_another_upstream_is_ordered_to_the_tail() -> None:
    """A move's target still learning the shard from where an earlier, cancelled move sent it
    (another member, not the tail) has not acted on the new order: it must be sent again, or
    its catch-up is never done (only a learner of the tail is) and the move waits for good.
    Found by the campaign's move_under_fault (docs/testing.md "Moves under faults")."""
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 9_000}, 2: {"last_seq": 9_000}})
    c = status(shards={0: {"last_seq": 9_000}})
    learner = {"role": "learner", "upstream_linked": True, "durable_seq": 8_000}
    b = status(
        shards={
            0: {**learner, "upstream": "a"},  # the tail is c: an earlier upstream
            1: {**learner, "upstream": "a"},  # the tail: acting on its order
            2: {**learner, "upstream": "c"},  # the tail is a
        }
    )
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, everyone(view))
    assert plan.send_catch_up == [CatchUpOrder("b", 0, "c"), CatchUpOrder("b", 2, "a")]
    soon = plan_round(view, answers(a=a, b=b, c=c), 6_100, plan.memory)
    assert soon.send_catch_up == []  # at most one order per interval
