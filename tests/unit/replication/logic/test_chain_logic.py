"""The pure chain decisions: commit progress, divergence, link flow control."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.replication.logic import chain
from kayos.replication.logic.chain import (
    Accepted,
    CommitPointAdvanced,
    Discarded,
    DownstreamAck,
    DownstreamCommitted,
    DownstreamLinked,
    Durable,
    LinkWindow,
    Progress,
    SendAck,
    SendCommitPoint,
    SendCommitted,
    UpstreamCommitPoint,
    UpstreamLinked,
    Violation,
    rollback_point,
)
from tests.support.replicas import run

pytestmark = pytest.mark.unit


def test_a_lone_head_commits_what_it_makes_durable() -> None:
    progress, actions = run(Progress(has_upstream=False, downstreams=()), Durable(5))
    assert (progress.committed, progress.commit_point) == (5, 5)
    assert actions == [CommitPointAdvanced(5)]


def test_a_tail_reports_committed_but_shows_only_the_commit_point_it_is_told() -> None:
    tail, actions = run(Progress(has_upstream=True, downstreams=()), Durable(7))
    assert actions == [SendCommitted(7)]
    assert (tail.committed, tail.commit_point) == (7, 0), "durable here is not committed"
    tail, actions = run(tail, UpstreamCommitPoint(5))
    assert actions == [CommitPointAdvanced(5)]
    tail, actions = run(tail, UpstreamCommitPoint(9))
    assert actions == [CommitPointAdvanced(7)], "never past what it holds itself"
    tail, actions = run(tail, Durable(12))
    assert actions == [SendCommitted(12), CommitPointAdvanced(9)]


def test_a_middle_acks_its_durable_seq_relays_committed_up_and_the_commit_point_down() -> None:
    middle = Progress(has_upstream=True, downstreams=("c",))
    middle, actions = run(middle, Accepted(10), Durable(10))
    assert actions == [SendAck(10)]
    assert middle.committed == 0, "nothing is committed until the tail says so"
    middle, actions = run(middle, DownstreamCommitted("c", 8))
    assert actions == [SendCommitted(8)]
    middle, actions = run(middle, DownstreamAck("c", 10), DownstreamCommitted("c", 8))
    assert actions == [], "repeating a report changes nothing"
    middle, actions = run(middle, UpstreamCommitPoint(8))
    assert actions == [CommitPointAdvanced(8), SendCommitPoint(8)]


def test_forward_then_persist_a_downstream_may_report_what_its_upstream_only_accepted() -> None:
    head = Progress(has_upstream=False, downstreams=("b",))
    head, _ = run(head, Durable(10), Accepted(20))
    head, actions = run(head, DownstreamAck("b", 20), DownstreamCommitted("b", 20))
    assert (head.committed, head.commit_point) == (10, 10), "committed waits for the head too"
    assert actions == [CommitPointAdvanced(10), SendCommitPoint(10)]
    head, actions = run(head, Durable(20))
    assert actions == [CommitPointAdvanced(20), SendCommitPoint(20)]


def test_a_head_with_fanout_waits_for_every_tail() -> None:
    head = Progress(has_upstream=False, downstreams=("t1", "t2"))
    head, _ = run(head, Durable(100), DownstreamCommitted("t1", 100))
    assert head.committed == 0
    head, actions = run(head, DownstreamCommitted("t2", 60))
    assert actions == [CommitPointAdvanced(60), SendCommitPoint(60)]
    head, actions = run(head, DownstreamCommitted("t2", 100))
    assert actions == [CommitPointAdvanced(100), SendCommitPoint(100)]


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ((DownstreamCommitted("c", 5), DownstreamCommitted("c", 4)), "went back"),
        ((DownstreamAck("c", 13),), "past"),
        ((DownstreamCommitted("x", 1),), "not a downstream"),
    ],
)
def test_a_downstream_that_breaks_the_rules_is_dropped(
    events: tuple[chain.Event, ...], reason: str
) -> None:
    head = Progress(has_upstream=False, downstreams=("c",), durable=10, accepted=12)
    head, actions = run(head, *events)
    assert isinstance(actions[-1], Violation)
    assert reason in actions[-1].reason


def test_what_was_discarded_can_no_longer_be_reported() -> None:
    middle = Progress(has_upstream=True, downstreams=("c",))
    middle, _ = run(middle, Durable(10), Accepted(15), Discarded())
    assert middle.accepted == 10
    middle, actions = run(middle, DownstreamAck("c", 12))
    assert isinstance(actions[-1], Violation)


def test_committed_never_decreases_and_a_new_link_starts_its_reports_afresh() -> None:
    head = Progress(has_upstream=False, downstreams=("c",))
    head, _ = run(head, Durable(10), DownstreamCommitted("c", 10))
    head, actions = run(head, DownstreamLinked("c"))
    assert actions == [SendCommitPoint(10, "c")], "a new link learns the commit point at once"
    head, actions = run(head, DownstreamCommitted("c", 4))
    assert actions == []
    assert head.committed == 10


def test_a_relinked_replica_tells_its_upstream_where_it_stands() -> None:
    middle = Progress(has_upstream=True, downstreams=("c",), durable=9, committed=7)
    assert run(middle, UpstreamLinked())[1] == [SendAck(9), SendCommitted(7)]
    tail = Progress(has_upstream=True, downstreams=(), durable=9, committed=9)
    assert run(tail, UpstreamLinked())[1] == [SendCommitted(9)]


def test_a_head_ignores_commit_points_and_a_commit_point_never_goes_back() -> None:
    head = Progress(has_upstream=False, downstreams=())
    head, actions = run(head, UpstreamCommitPoint(5))
    assert (head.commit_point, actions) == (0, [])
    tail = Progress(has_upstream=True, downstreams=(), durable=9)
    tail, _ = run(tail, UpstreamCommitPoint(8))
    tail, actions = run(tail, UpstreamCommitPoint(6))
    assert (tail.commit_point, actions) == (8, [])


X, Y, Z = b"X" * 16, b"Y" * 16, b"Z" * 16


@pytest.mark.parametrize(
    ("down", "up", "d", "u", "expected"),
    [
        # the worked example of docs/replication-protocol.md
        ([(X, 0)], [(X, 0), (Y, 2900)], 3000, 3400, 2900),
        ([(X, 0), (Z, 3000)], [(X, 0), (Y, 2900)], 3000, 3400, 2900),
        ([(X, 0)], [(X, 0), (Y, 2900)], 2800, 3400, None),  # a prefix: no rollback
        ([(X, 0)], [(X, 0)], 500, 400, 400),  # holds what its upstream lost: dropped
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
