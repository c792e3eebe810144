"""The driver's part of rule 9 (docs/manager.md, "A full disk"): a node's ``disk`` status in, the
``DiskFull`` and ``NodeReturned`` events out, and what ``decide`` makes of them. Canned status
replies; no processes, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from kayos import limits
from kayos.manager import (
    DiskFull,
    Event,
    ManagerView,
    NodeReturned,
    ShardReport,
    SpliceChain,
    StartCatchUp,
    TimerTick,
    decide,
)
from kayos.manager.member.plan import plan_round, sends_for
from kayos.manager.view import MEMBER_DISK_FULL, AlertKey
from tests.support.answers import answers, everyone, status, view3

pytestmark = pytest.mark.unit

RESERVE = limits.disk_reserve_bytes


def disk(full: bool, room: int) -> dict[str, Any]:
    """A status's ``disk``: ``room`` bytes free beyond the reserve."""
    return {"full": full, "free_bytes": RESERVE + room, "reserve_bytes": RESERVE}


def apply(view: ManagerView, events: list[Event]) -> ManagerView:
    for event in events:
        view, _ = decide(view, event)
    return view


def full_b() -> ManagerView:
    """view3 (a>b>c, b>c>a, c>a>b) after b reported its disk full."""
    view = view3()
    plan = plan_round(
        view,
        answers(a=status(), b=status(disk=disk(True, 0)), c=status()),
        1_000,
        everyone(view),
    )
    assert plan.events[1:] == [DiskFull("b")]
    return apply(view, plan.events)


def test_a_node_reporting_its_disk_full_leaves_every_chain_but_where_it_leads() -> None:
    view = full_b()
    assert {n.id: n.state for n in view.nodes}["b"] == "full"
    # Middle of shard 0 and tail of shard 2: spliced out; head of shard 1: kept (it refuses
    # writes with disk_full itself).
    assert [s.chain for s in view.shards] == [("a", "c"), ("b", "c", "a"), ("c", "a")]
    assert {a for a in view.alerts if a.kind == MEMBER_DISK_FULL} == {
        AlertKey(MEMBER_DISK_FULL, 0, "b"),
        AlertKey(MEMBER_DISK_FULL, 1, "b"),
        AlertKey(MEMBER_DISK_FULL, 2, "b"),
    }


def test_a_full_node_is_sent_the_topology_so_it_learns_it_left() -> None:
    view, actions = decide(view3(), DiskFull("b"))
    assert any(isinstance(a, SpliceChain) for a in actions)
    assert sends_for(view, actions).topology_to == ["a", "b", "c"]


def test_a_full_node_returns_only_with_the_return_margin_free() -> None:
    view = full_b()
    margin = limits.manager_disk_return_margin_bytes
    for reply in (disk(True, margin * 2), disk(False, margin - 1)):
        plan = plan_round(
            view, answers(a=status(), b=status(disk=reply), c=status()), 1_200, everyone(view)
        )
        assert plan.events[1:] == [], reply  # still full, or not room enough: it stays out
    reply = status(disk=disk(False, margin), shards={0: {"durable_seq": 40}})
    plan = plan_round(view, answers(a=status(), b=reply, c=status()), 1_400, everyone(view))
    assert plan.events[1:] == [NodeReturned("b", 1_000, (ShardReport(0, 40, ()),))]
    after = view
    for event in plan.events:
        after, actions = decide(after, event)
    assert {a.shard for a in actions if isinstance(a, StartCatchUp)} == {0, 2}
    assert not [a for a in after.alerts if a.kind == MEMBER_DISK_FULL]


def test_a_down_node_answering_with_its_disk_full_is_full_not_returned() -> None:
    view, _ = decide(view3(), DiskFull("b"))
    view, _ = decide(view, TimerTick(5_000, (("a", 5_000), ("c", 5_000))))
    assert {n.id: n.state for n in view.nodes}["b"] == "down"
    plan = plan_round(
        view,
        answers(5_200, a=status(), b=status(disk=disk(True, 0)), c=status()),
        5_200,
        everyone(view),
    )
    assert plan.events[1:] == [DiskFull("b")]
    # Free space unreadable (null), a commit failed: full all the same.
    unreadable = status(disk={"full": True, "free_bytes": None, "reserve_bytes": RESERVE})
    again = plan_round(
        view, answers(5_200, a=status(), b=unreadable, c=status()), 5_200, everyone(view)
    )
    assert again.events[1:] == [DiskFull("b")]
    after = apply(view, plan.events)
    assert {n.id: n.state for n in after.nodes}["b"] == "full"
    assert all(not s.catching_up for s in after.shards)


def test_a_node_without_a_disk_report_is_judged_as_before() -> None:
    view = view3()
    for reply in (status(), status(disk={"full": "yes"}), status(disk=None)):
        plan = plan_round(view, answers(a=status(), b=reply, c=status()), 1_000, everyone(view))
        assert plan.events[1:] == []
