"""The leader driver's choices (kayos/manager/member/plan.py ``plan_round``, ``sends_for``):
canned status replies in, events and messages out. No processes, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from kayos import limits
from kayos.manager import (
    CatchUpDone,
    Config,
    HeadTookOver,
    LatencyReport,
    ManagerView,
    NodeReturned,
    PublishTopology,
    ShardReport,
    SpliceChain,
    StartCatchUp,
    TimerTick,
    decide,
)
from kayos.manager.member.plan import (
    Answer,
    CatchUpOrder,
    FollowersNote,
    Memory,
    plan_round,
    sends_for,
    topology_of,
)
from kayos.topology import ShardChain, Topology
from tests.support.answers import NODES, answers, catching_up_b, down_b, everyone, status, view3

pytestmark = pytest.mark.unit


def test_a_round_ticks_with_every_node_that_answered() -> None:
    view = view3()
    plan = plan_round(view, answers(a=status(), c=status()), 1_200, everyone(view))
    assert plan.events == [TimerTick(1_200, (("a", 1_000), ("c", 1_000)))]
    assert plan.send_topology == []
    assert plan.memory.answered == frozenset({"a", "c"})


def test_a_node_that_answers_again_is_sent_the_topology() -> None:
    view = view3()
    plan = plan_round(view, answers(a=status(), b=status(), c=status()), 1_200, Memory())
    assert plan.send_topology == ["a", "b", "c"]
    again = plan_round(view, answers(a=status(), b=status(), c=status()), 1_400, plan.memory)
    assert again.send_topology == []


def test_a_node_behind_the_views_epoch_is_sent_it_again_at_most_once_per_interval() -> None:
    view = view3()
    memory = everyone(view)
    plan = plan_round(view, answers(a=status(epoch=0), b=status(), c=status()), 100, memory)
    assert plan.send_topology == ["a"]
    soon = plan_round(view, answers(a=status(epoch=0), b=status(), c=status()), 300, plan.memory)
    assert soon.send_topology == []
    later_ms = 100 + limits.manager_resend_interval_ms
    later = plan_round(
        view, answers(a=status(epoch=0), b=status(), c=status()), later_ms, soon.memory
    )
    assert later.send_topology == ["a"]


def test_a_down_node_that_answers_returns_with_its_shard_reports() -> None:
    view = down_b()
    reply = status(
        shards={0: {"durable_seq": 41, "last_seq": 40, "takeover": [["0a0b", 7]]}, 1: {}}
    )
    plan = plan_round(view, answers(5_200, a=status(), b=reply, c=status()), 5_200, everyone(view))
    returned = [e for e in plan.events if isinstance(e, NodeReturned)]
    assert returned == [
        NodeReturned(
            "b", 5_200, (ShardReport(0, 41, ((bytes.fromhex("0a0b"), 7),)), ShardReport(1, 0, ()))
        )
    ]
    # and the manager sends it to catch up on every shard it departed
    after = view
    for event in plan.events:
        after, actions = decide(after, event)
    assert {a.shard for a in actions if isinstance(a, StartCatchUp)} == {0, 1, 2}


def test_a_shard_with_a_malformed_takeover_table_is_left_out_of_the_return_not_fatal() -> None:
    # An empty table would read as a lost store (docs/manager.md rule 3): no report instead.
    view = down_b()
    reply = status(
        shards={
            0: {"last_seq": 3, "takeover": [["0a0b", 1], ["not hex", 1]]},
            1: {"last_seq": 5, "takeover": [["0a0b", -1]]},
            2: {"last_seq": 4, "takeover": [["0a0b", 2]]},
        }
    )
    plan = plan_round(view, answers(a=status(), b=reply, c=status()), 5_200, everyone(view))
    returned = [e for e in plan.events if isinstance(e, NodeReturned)]
    assert returned[0].reports == (ShardReport(2, 4, ((bytes.fromhex("0a0b"), 2),)),)


def latency(p99: float, window: int = 6_000, samples: int = 100) -> dict[str, Any]:
    return {"p99_ms": p99, "window_ms": window, "samples": samples}


def test_only_slow_measurements_over_a_long_enough_window_are_logged() -> None:
    view = view3()
    table = {
        "b": latency(900.2),  # slow: logged, rounded up
        "c": latency(3.0),  # healthy: not logged
        "zz": latency(999),  # unknown node: ignored
    }
    short = {"b": latency(900, window=100)}
    memory = everyone(view)
    plan = plan_round(
        view, answers(a=status(latency=table), b=status(), c=status(latency=short)), 9, memory
    )
    assert [e for e in plan.events if isinstance(e, LatencyReport)] == [
        LatencyReport("a", "b", 901, 6_000)
    ]


def test_a_healthy_measurement_of_a_slow_node_is_logged_so_it_can_recover() -> None:
    view = view3()
    view, _ = decide(view, LatencyReport("a", "b", 900, 6_000))
    assert view.node("b").state == "slow"  # type: ignore[union-attr]
    plan = plan_round(
        view,
        answers(a=status(latency={"b": latency(2)}), b=status(), c=status()),
        9,
        everyone(view),
    )
    assert LatencyReport("a", "b", 2, 6_000) in plan.events


def buckets(*values: float | None) -> dict[str, Any]:
    """A latency entry whose last buckets are ``values`` (oldest first), earlier ones empty."""
    recent = [None] * (limits.latency_buckets - len(values)) + list(values)
    return {
        "p99_ms": 1.0,  # the whole window's p99: not what the bucket rule reads
        "window_ms": limits.latency_window_ms,
        "samples": 5_000,
        "bucket_ms": limits.latency_bucket_ms,
        "recent_p99_ms": recent,
    }


SLOW_BUCKETS = -(-limits.manager_slow_window_ms // limits.latency_bucket_ms)


@pytest.mark.parametrize(
    ("recent", "logged"),
    [
        # the buckets with samples of the slow window over the bound (an empty one between: a
        # node running a moment between pauses): the smallest is reported
        ([400.0, None, 300.0], 300),
        # two thirds of them over: still slow
        ([400.0, 12.0, 900.0], 400),
        # one over, two under: no verdict
        ([400.0, 12.0, 13.0], None),
        # a single bucket with samples (one pause answered at once): too little to judge
        ([None, 5_000.0, None], None),
        # over the bound, but before the window: not logged
        ([900.0] * 4 + [None] * SLOW_BUCKETS, None),
        # quick: not logged for a node that is up
        ([3.0, 5.0, None], None),
        # junk in a bucket is ignored, the rest judged
        ([True, "x", 800.0, float("inf"), 700.0], 700),
    ],
)
def test_the_slow_rule_reads_the_buckets_of_the_slow_window(
    recent: list[Any], logged: int | None
) -> None:
    assert SLOW_BUCKETS == 3, "the cases above are written for a 1.5 s window of 0.5 s buckets"
    view = view3()
    plan = plan_round(
        view,
        answers(a=status(latency={"b": buckets(*recent)}), b=status(), c=status()),
        9,
        everyone(view),
    )
    found = [e for e in plan.events if isinstance(e, LatencyReport)]
    if logged is None:
        assert found == []
    else:
        window = SLOW_BUCKETS * limits.latency_bucket_ms
        assert found == [LatencyReport("a", "b", logged, window)]
        after, _ = decide(view, found[0])
        assert after.node("b").state == "slow"  # type: ignore[union-attr]


def test_a_node_that_answered_late_is_no_witness_for_the_slow_window() -> None:
    """A paused middle measures its own pauses in its round trips to the tail: while it answers
    the manager's polls late, its reports are not logged, and its upstream's report of it is."""
    view = view3()
    slow = buckets(900.0, 800.0, 700.0)
    replies = {"a": status(latency={"b": slow}), "b": status(latency={"c": slow}), "c": status()}
    late = {n: Answer(replies[n], 1_000, 400 if n == "b" else 5) for n in "abc"}
    plan = plan_round(view, late, 1_000, everyone(view))
    assert [e for e in plan.events if isinstance(e, LatencyReport)] == [
        LatencyReport("a", "b", 700, SLOW_BUCKETS * limits.latency_bucket_ms)
    ]
    assert plan.memory.late_answer_ms == {"b": 1_000}
    quick = {n: Answer(replies[n], 1_000, 5) for n in "abc"}
    window = view.config.slow_window_ms
    within = plan_round(view, quick, 1_000 + window, plan.memory)
    assert {e.reporter for e in within.events if isinstance(e, LatencyReport)} == {"a"}
    after = plan_round(view, quick, 1_001 + window, within.memory)
    assert {e.reporter for e in after.events if isinstance(e, LatencyReport)} == {"a", "b"}
    assert after.memory.late_answer_ms == {}
    unanswered = {**quick, "c": Answer(None, 1_000, 0)}
    assert plan_round(view, unanswered, 5_000, after.memory).memory.late_answer_ms == {"c": 5_000}


def test_a_kept_slow_node_recovers_when_every_bucket_of_the_window_is_under_the_bound() -> None:
    kept = ManagerView.bootstrap(
        Config(min_replicas=3), list("abc"), [list("abc"), list("bca"), list("cab")]
    )
    view, _ = decide(kept, LatencyReport("a", "b", 900, limits.manager_slow_window_ms))
    assert view.node("b").state == "slow"  # type: ignore[union-attr]
    assert "b" in view.shards[0].chain
    still = buckets(*([900.0] * SLOW_BUCKETS + [3.0, 400.0, 4.0]))
    healthy = buckets(*([900.0] * SLOW_BUCKETS + [3.0, 5.0, 4.0]))
    for entry, state in ((still, "slow"), (healthy, "up")):
        plan = plan_round(
            view,
            answers(a=status(latency={"b": entry}), b=status(), c=status()),
            9,
            everyone(view),
        )
        after = view
        for event in plan.events:
            if isinstance(event, LatencyReport):
                after, _ = decide(after, event)
        assert after.node("b").state == state  # type: ignore[union-attr]


def test_a_node_removed_as_slow_returns_after_enough_quick_answers_in_a_row() -> None:
    view = ManagerView.bootstrap(
        Config(min_replicas=1), list("abc"), [list("abc"), list("bca"), list("cab")]
    )
    view, _ = decide(view, LatencyReport("a", "b", 900, 6_000))
    assert all("b" not in s.chain for s in view.shards)
    memory = everyone(view)
    quick = {n: Answer(status(), 0, 5) for n in "abc"}
    for _ in range(limits.manager_slow_return_polls - 1):
        plan = plan_round(view, quick, 0, memory)
        assert not [e for e in plan.events if isinstance(e, NodeReturned)]
        memory = plan.memory
    slow_answer = {**quick, "b": Answer(status(), 0, view.config.slow_p99_ms + 1)}
    reset = plan_round(view, slow_answer, 0, memory)
    assert reset.memory.fast_answers["b"] == 0  # a slow answer starts the count over
    memory = reset.memory
    for _ in range(limits.manager_slow_return_polls):
        plan = plan_round(view, quick, 0, memory)
        memory = plan.memory
    assert next(e for e in plan.events if isinstance(e, NodeReturned)).node == "b"


def test_a_learner_near_the_tails_seq_is_caught_up() -> None:
    view = catching_up_b()
    tails = {s.id: s.tail for s in view.shards}
    assert tails == {0: "c", 1: "a", 2: "a"}
    lag = limits.manager_catchup_done_lag_seqs
    counts_b = {"last_seq": 5_000, "counted_followers": ["b"]}
    a = status(shards={1: counts_b, 2: counts_b})
    c = status(shards={0: counts_b})
    linked = {"role": "learner", "upstream_linked": True}
    b = status(
        shards={
            0: {**linked, "upstream": "c", "durable_seq": 5_000 - lag},  # close enough
            1: {**linked, "upstream": "a", "durable_seq": 5_000 - lag - 1},  # not yet
            2: {**linked, "upstream": "a", "durable_seq": 5_000},
        }
    )
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, everyone(view))
    orders = {s.id: s.order_of("b") for s in view.shards}
    assert [e for e in plan.events if isinstance(e, CatchUpDone)] == [
        CatchUpDone("b", 0, orders[0]),
        CatchUpDone("b", 2, orders[2]),
    ]
    assert plan.send_catch_up == []  # b learns shard 1 already: no order again


def test_a_learner_the_tail_does_not_count_in_its_commit_is_not_caught_up() -> None:
    """Level with the tail is not enough: until the tail counts the learner in its commit, the
    tail may commit seqs alone that the learner, made a member, would lead without (simulator
    seeds 58, 567; docs/replication-protocol.md, "Counting a catch-up follower")."""
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 5_000}, 2: {"last_seq": 5_000, "counted_followers": []}})
    c = status(shards={0: {"last_seq": 5_000, "counted_followers": ["b"]}})
    linked = {"role": "learner", "upstream_linked": True, "durable_seq": 5_000}
    b = status(
        shards={
            0: {**linked, "upstream": "c"},
            1: {**linked, "upstream": "a"},
            2: {**linked, "upstream": "a"},
        }
    )
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, everyone(view))
    done = [e for e in plan.events if isinstance(e, CatchUpDone)]
    assert done == [CatchUpDone("b", 0, view.shards[0].order_of("b"))]


def test_a_tail_counting_a_follower_off_the_catch_up_list_is_told_the_list() -> None:
    """Only the manager's word ends a count: a tail at the view's epoch counting a node the
    shard's catch-up list no longer holds (it went down) is sent the list; a tail at another
    epoch is not (the node may have joined the chain in the view's)."""
    view = catching_up_b()
    assert view.shards[0].tail == "c"
    view, _ = decide(view, TimerTick(20_000, (("a", 20_000), ("c", 20_000))))  # b away again
    assert view.shards[0].catching_up == ()
    c = status(epoch=view.epoch, shards={0: {"last_seq": 9, "counted_followers": ["b"]}})
    a = status(epoch=view.epoch, shards={1: {"last_seq": 9}, 2: {"last_seq": 9}})
    plan = plan_round(view, answers(a=a, c=c), 20_100, everyone(view))
    assert plan.send_followers == [FollowersNote("c", 0, view.epoch, ())]
    behind = status(epoch=view.epoch - 1, shards={0: {"counted_followers": ["b"]}})
    plan = plan_round(view, answers(a=a, c=behind), 20_100, everyone(view))
    assert plan.send_followers == []


def test_only_a_linked_learner_of_the_tail_counts_as_caught_up() -> None:
    """A returned node's old replica (divergent suffix and all) or a learner of an earlier tail,
    or one whose link handshake (where it rolls back) is not done, may show a seq at the tail's:
    none of them is caught up (it was reported done before rolling back: simulator seed 1523)."""
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 5_000}, 2: {"last_seq": 5_000}})
    c = status(shards={0: {"last_seq": 5_000}})
    b = status(
        shards={
            0: {"role": "tail", "durable_seq": 5_200},  # its old replica, not yet rolled back
            1: {"role": "learner", "upstream": "c", "upstream_linked": True, "durable_seq": 5_000},
            2: {"role": "learner", "upstream": "a", "upstream_linked": False, "durable_seq": 5_000},
        }
    )
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, everyone(view))
    assert [e for e in plan.events if isinstance(e, CatchUpDone)] == []


def test_a_late_catch_up_report_of_an_earlier_order_rejoins_nobody() -> None:
    view = catching_up_b()
    first = view.shards[0].order_of("b")
    assert first is not None
    view, _ = decide(view, TimerTick(20_000, (("a", 20_000), ("c", 20_000))))  # b away again
    assert "b" not in view.shards[0].catching_up
    view, actions = decide(view, NodeReturned("b", 20_100))
    again = next(a for a in actions if isinstance(a, StartCatchUp) and a.shard == 0)
    assert again.order > first
    view, actions = decide(view, CatchUpDone("b", 0, first))
    assert actions == []
    assert "b" not in view.shards[0].chain
    view, actions = decide(view, CatchUpDone("b", 0, again.order))
    assert view.shards[0].chain[-1] == "b"


def test_a_catch_up_order_not_acted_on_is_sent_again_after_the_interval() -> None:
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 9_000}, 2: {"last_seq": 9_000}})
    c = status(shards={0: {"last_seq": 9_000}})
    b = status(shards={0: {"role": "tail"}, 1: {"role": "head"}, 2: {"role": "middle"}})
    memory = everyone(view)
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, memory)
    assert plan.send_catch_up == [
        CatchUpOrder("b", 0, "c"),
        CatchUpOrder("b", 1, "a"),
        CatchUpOrder("b", 2, "a"),
    ]
    soon = plan_round(view, answers(a=a, b=b, c=c), 6_100, plan.memory)
    assert soon.send_catch_up == []
    interval = limits.manager_resend_interval_ms
    later = plan_round(view, answers(a=a, b=b, c=c), 6_000 + interval, soon.memory)
    assert len(later.send_catch_up) == 3


def test_a_node_holding_no_copy_of_the_shard_is_ordered_again() -> None:
    """A paused node that comes back still at the old epoch refuses the first order (it is a
    member there); once it learns the topology it closes its replicas and reports no shard: the
    order must go again (it used to be skipped for good, leaving the shard short a copy)."""
    view = catching_up_b()
    a = status(shards={1: {"last_seq": 9_000}, 2: {"last_seq": 9_000}})
    c = status(shards={0: {"last_seq": 9_000}})
    b = status(epoch=view.epoch)  # no shards at all
    plan = plan_round(view, answers(a=a, b=b, c=c), 6_000, everyone(view))
    assert plan.send_catch_up == [
        CatchUpOrder("b", 0, "c"),
        CatchUpOrder("b", 1, "a"),
        CatchUpOrder("b", 2, "a"),
    ]
    later = plan_round(
        view, answers(a=a, b=b, c=c), 6_000 + limits.manager_resend_interval_ms, plan.memory
    )
    assert len(later.send_catch_up) == 3


def test_chain_changes_send_the_topology_to_every_node_not_down_or_removed() -> None:
    view, actions = decide(view3(), TimerTick(5_000, (("a", 5_000), ("c", 5_000))))
    assert any(isinstance(a, SpliceChain) for a in actions)
    assert any(isinstance(a, PublishTopology) for a in actions)
    sends = sends_for(view, actions)
    assert sends.topology_to == ["a", "c"]
    assert sends.catch_ups == []
    assert sends_for(view, []).topology_to == []


def test_the_published_topology_is_the_views_chains_at_its_epoch() -> None:
    view, _ = decide(view3(), TimerTick(5_000, (("a", 5_000), ("c", 5_000))))
    topology = topology_of(view, NODES)
    assert topology.epoch == view.epoch == 2
    assert {s.id: s.chain for s in topology.shards.values()} == {
        0: ("a", "c"),
        1: ("c", "a"),
        2: ("c", "a"),
    }
    assert set(topology.to_json()["nodes"]) == {"a", "b", "c"}


def test_a_heads_new_takeover_entry_is_logged_once() -> None:
    view = view3()
    entry = {"role": "head", "last_seq": 9, "takeover": [["01", 0], ["02", 9]]}
    a = status(shards={0: entry})
    plan = plan_round(view, answers(a=a, b=status(), c=status()), 9, everyone(view))
    took = [e for e in plan.events if isinstance(e, HeadTookOver)]
    assert took == [HeadTookOver(0, "a", b"\x02", 9)]
    view, _ = decide(view, took[0])
    again = plan_round(view, answers(a=a, b=status(), c=status()), 9, everyone(view))
    assert not [e for e in again.events if isinstance(e, HeadTookOver)]
    # a node that is not the view's head, or does not act as head, is not asked
    b = status(shards={0: {**entry, "role": "middle"}})
    other = plan_round(view3(), answers(a=status(), b=b, c=status()), 9, everyone(view))
    assert not [e for e in other.events if isinstance(e, HeadTookOver)]


def test_the_published_topology_keeps_the_files_queue_shard_counts() -> None:
    # The view holds chains only; each queue's shard count comes from the topology file, so a
    # chain change never puts a queue over several shards back onto one.
    view, _ = decide(view3(), TimerTick(5_000, (("a", 5_000), ("c", 5_000))))
    base = Topology(
        1,
        dict(NODES),
        {i: ShardChain(i, ("a", "b", "c")) for i in range(3)},
        queue_shards=2,
        queues={"orders": 3},
    )
    topology = topology_of(view, NODES, base)
    assert (topology.queue_shards, topology.queues) == (2, {"orders": 3})
    assert topology.to_json()["queues"] == {"orders": {"shards": 3}}
    assert topology.shards_for("orders") == base.shards_for("orders")
    plain = topology_of(view, NODES).to_json()
    assert "queues" not in plain
