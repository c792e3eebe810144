"""The pure chain decisions: commit progress, divergence, link flow control."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.replication import chain
from kayos.replication.chain import (
    CommittedAdvanced,
    DownstreamAck,
    DownstreamCommitted,
    DownstreamLinked,
    Durable,
    LinkWindow,
    Progress,
    SendAck,
    SendCommitted,
    UpstreamLinked,
    Violation,
    rollback_point,
    step,
)


def run(progress: Progress, *events: chain.Event) -> tuple[Progress, list[chain.Action]]:
    actions: list[chain.Action] = []
    for event in events:
        progress, more = step(progress, event)
        actions.extend(more)
    return progress, actions


def test_a_lone_head_commits_what_it_makes_durable() -> None:
    progress, actions = run(Progress(has_upstream=False, downstreams=()), Durable(5))
    assert progress.committed == 5
    assert actions == [CommittedAdvanced(5)]


def test_a_tail_reports_committed_not_ack() -> None:
    progress, actions = run(Progress(has_upstream=True, downstreams=()), Durable(7))
    assert actions == [CommittedAdvanced(7), SendCommitted(7)]
    assert progress.committed == 7


def test_a_middle_acks_its_durable_seq_and_relays_the_tails_committed() -> None:
    middle = Progress(has_upstream=True, downstreams=("c",))
    middle, actions = run(middle, Durable(10))
    assert actions == [SendAck(10)]
    assert middle.committed == 0, "nothing is committed until the tail says so"
    middle, actions = run(middle, DownstreamCommitted("c", 8))
    assert actions == [CommittedAdvanced(8), SendCommitted(8)]
    middle, actions = run(middle, DownstreamAck("c", 10), DownstreamCommitted("c", 8))
    assert actions == [], "repeating a report changes nothing"


def test_a_head_with_fanout_waits_for_every_tail() -> None:
    head = Progress(has_upstream=False, downstreams=("t1", "t2"))
    head, _ = run(head, Durable(100), DownstreamCommitted("t1", 100))
    assert head.committed == 0
    head, actions = run(head, DownstreamCommitted("t2", 60))
    assert actions == [CommittedAdvanced(60)]
    head, actions = run(head, DownstreamCommitted("t2", 100))
    assert actions == [CommittedAdvanced(100)]


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ((DownstreamCommitted("c", 5), DownstreamCommitted("c", 4)), "went back"),
        ((DownstreamAck("c", 11),), "past"),
        ((DownstreamCommitted("x", 1),), "not a downstream"),
    ],
)
def test_a_downstream_that_breaks_the_rules_is_dropped(
    events: tuple[chain.Event, ...], reason: str
) -> None:
    head = Progress(has_upstream=False, downstreams=("c",), durable=10)
    head, actions = run(head, *events)
    assert isinstance(actions[-1], Violation)
    assert reason in actions[-1].reason


def test_committed_never_decreases_and_a_new_link_starts_its_reports_afresh() -> None:
    head = Progress(has_upstream=False, downstreams=("c",))
    head, _ = run(head, Durable(10), DownstreamCommitted("c", 10), DownstreamLinked("c"))
    head, actions = run(head, DownstreamCommitted("c", 4))
    assert actions == []
    assert head.committed == 10


def test_a_relinked_replica_tells_its_upstream_where_it_stands() -> None:
    middle = Progress(has_upstream=True, downstreams=("c",), durable=9, committed=7)
    assert run(middle, UpstreamLinked())[1] == [SendAck(9), SendCommitted(7)]
    tail = Progress(has_upstream=True, downstreams=(), durable=9, committed=9)
    assert run(tail, UpstreamLinked())[1] == [SendCommitted(9)]


X, Y, Z = b"X" * 16, b"Y" * 16, b"Z" * 16


@pytest.mark.parametrize(
    ("down", "up", "d", "u", "expected"),
    [
        # the worked example of docs/replication-protocol.md
        ([(X, 0)], [(X, 0), (Y, 2900)], 3000, 3400, 2900),
        ([(X, 0), (Z, 3000)], [(X, 0), (Y, 2900)], 3000, 3400, 2900),
        ([(X, 0)], [(X, 0), (Y, 2900)], 2800, 3400, None),  # a prefix: no rollback
        ([(X, 0)], [(X, 0)], 500, 400, 400),  # cannot be ahead of its upstream
        ([(Z, 0)], [(X, 0)], 10, 400, 0),  # nothing in common: full reset
        ([(Z, 0)], [(X, 0)], 0, 400, None),  # empty downstream
    ],
)
def test_rollback_point(
    down: chain.TakeoverTable, up: chain.TakeoverTable, d: int, u: int, expected: int | None
) -> None:
    assert rollback_point(down, up, d, u) == expected


def test_takeover_table_is_capped_by_dropping_the_oldest() -> None:
    table: chain.TakeoverTable = []
    for seq in range(limits.takeover_table_entries_max + 3):
        table = chain.with_takeover(table, seq.to_bytes(16, "big"), seq)
    assert len(table) == limits.takeover_table_entries_max
    assert table[0][1] == 3


def test_link_window_bounds_batches_but_always_lets_one_through() -> None:
    window = LinkWindow()
    window.sent(10, limits.link_in_flight_bytes_max + 1)
    assert not window.can_send()
    window.acknowledged(10)
    assert window.can_send()
    for seq in range(limits.link_in_flight_batches_max):
        window.sent(seq + 11, 1)
    assert not window.can_send()
    window.acknowledged(11)
    assert window.can_send()
