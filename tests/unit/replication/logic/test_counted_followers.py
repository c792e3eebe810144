"""Counting a catch-up follower in a tail's commit, the deterministic parts
(docs/replication-protocol.md, "Counting a catch-up follower"): the chain event, what a replica
keeps of a recorded count when it opens, and the signed followers message's checks."""

from __future__ import annotations

import pytest

from kayos.errors import InvalidRequest, Unauthenticated
from kayos.node.replicas.learners import FollowersOrder, parse_followers
from kayos.replication.logic import chain, followers
from kayos.replication.logic.chain import (
    CommitPointAdvanced,
    DownstreamCommitted,
    DownstreamsChanged,
    Durable,
    Progress,
    SendAck,
    SendCommitted,
    UpstreamCommitPoint,
)
from kayos.signing import sign
from tests.support.links import TEST_IDENTITY
from tests.support.replicas import run

pytestmark = pytest.mark.unit


def test_a_lone_head_counting_a_follower_commits_only_what_the_follower_holds() -> None:
    head, _ = run(Progress(has_upstream=False, downstreams=()), Durable(10))
    assert head.commit_point == 10
    # Counted from its first COMMITTED at the head's commit point: nothing goes back.
    head, actions = run(head, DownstreamsChanged(("d",)), DownstreamCommitted("d", 10))
    assert head.commit_point == 10
    assert actions == []
    head, actions = run(head, Durable(15))
    assert head.commit_point == 10, "seq 15 waits for the follower"
    head, actions = run(head, DownstreamCommitted("d", 15))
    assert actions == [CommitPointAdvanced(15), chain.SendCommitPoint(15)]
    # The manager's word ends the count: the commit goes on alone, and d's reports are dropped.
    head, actions = run(head, Durable(20), DownstreamsChanged(()))
    assert head.commit_point == 20
    assert head.downstream_committed == {}
    assert CommitPointAdvanced(20) in actions


def test_a_tail_counting_a_follower_reports_upstream_only_what_the_follower_holds() -> None:
    tail, _ = run(Progress(has_upstream=True, downstreams=()), Durable(7), UpstreamCommitPoint(7))
    tail, actions = run(tail, DownstreamsChanged(("d",)), DownstreamCommitted("d", 7))
    assert actions == []
    tail, actions = run(tail, Durable(9))
    assert actions == [SendAck(9)], "no COMMITTED past what d holds"
    tail, actions = run(tail, DownstreamCommitted("d", 9))
    assert actions == [SendCommitted(9)]


def test_what_a_replica_keeps_of_a_recorded_count() -> None:
    raw = followers.record("c", ("e", "d"))
    assert raw == {"node": "c", "followers": ["d", "e"]}
    assert followers.record("c", ()) is None
    members = ("a", "b", "c")
    assert followers.kept(raw, "c", members, ()) == ("d", "e")
    # A new chain gave it a downstream, or made the follower a member: that count is over.
    assert followers.kept(raw, "c", members, ("d",)) == ()
    assert followers.kept(raw, "c", (*members, "d"), ()) == ("e",)
    # A record made by another node (a store copied by snapshot), or malformed: nothing.
    assert followers.kept(raw, "b", members, ()) == ()
    for bad in (None, [], {"node": "c"}, {"node": "c", "followers": "d"}):
        assert followers.kept(bad, "c", members, ()) == ()
    assert followers.kept({"node": "c", "followers": ["c", 5, "d"]}, "c", members, ()) == ("d",)


def test_followers_message_checks() -> None:
    body = {"epoch": 4, "shard": 0, "followers": ["d"]}
    signed = {"body": body, "mac": sign(TEST_IDENTITY, "followers", body)}
    assert parse_followers(TEST_IDENTITY, signed) == FollowersOrder(4, 0, frozenset({"d"}))
    for mac in (sign(TEST_IDENTITY, "catch-up", body), "", None, "0" * 64):
        with pytest.raises(Unauthenticated):
            parse_followers(TEST_IDENTITY, {"body": body, "mac": mac})
    with pytest.raises(Unauthenticated):
        parse_followers(None, signed)
    for bad in (
        {"epoch": 4, "shard": 0},
        {"epoch": 4, "shard": 0, "followers": [], "extra": 1},
        {"epoch": -1, "shard": 0, "followers": []},
        {"epoch": 4, "shard": 2**32, "followers": []},
        {"epoch": 4, "shard": 0, "followers": "d"},
        {"epoch": 4, "shard": 0, "followers": [7]},
    ):
        with pytest.raises(InvalidRequest):
            parse_followers(
                TEST_IDENTITY, {"body": bad, "mac": sign(TEST_IDENTITY, "followers", bad)}
            )
    for shape in (None, [], {"body": body}):
        with pytest.raises(InvalidRequest):
            parse_followers(TEST_IDENTITY, shape)
