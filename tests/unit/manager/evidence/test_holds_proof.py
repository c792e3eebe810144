"""The new head's write hold when the old head's lease is proven over
(kayos/manager/member/holds.py; docs/manager.md, "The new head's write hold"): grants are kept
per incarnation, none of a process whose lease is over counts, and a head whose last process's
lease is over holds nothing back, not even older leaders' grants."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.manager.member.holds import (
    counted_grants,
    hold_ms,
    record_incarnation_grants,
)

pytestmark = pytest.mark.unit

LEASE_MS = limits.head_lease_ms
A1, A2, C1 = "00000000000000a1", "00000000000000a2", "00000000000000c1"


def test_grants_are_kept_per_incarnation_and_forgotten_with_their_lease() -> None:
    times = record_incarnation_grants({}, [("a", A1, 4, 1_000), ("a", A2, 4, 1_100)], 1_100)
    assert times == {"a": {A1: {4: 1_000}, A2: {4: 1_100}}}
    times = record_incarnation_grants(times, [("a", A2, 5, 1_200)], 1_200)
    assert times == {"a": {A1: {4: 1_000}, A2: {4: 1_100, 5: 1_200}}}
    assert record_incarnation_grants(times, [], 1_000 + LEASE_MS) == {
        "a": {A2: {4: 1_100, 5: 1_200}}
    }
    assert record_incarnation_grants(times, [], 1_200 + LEASE_MS) == {}


def test_only_grants_of_processes_not_proven_gone_count() -> None:
    times = record_incarnation_grants(
        {}, [("a", A1, 4, 1_000), ("a", A2, 4, 1_100), ("c", C1, 4, 1_050)], 1_100
    )
    assert counted_grants(times, set()) == {"a": {4: 1_100}, "c": {4: 1_050}}
    assert counted_grants(times, {("a", A2)}) == {"a": {4: 1_000}, "c": {4: 1_050}}
    assert counted_grants(times, {("a", A1), ("a", A2)}) == {"c": {4: 1_050}}


def test_a_head_gone_with_proof_costs_no_hold() -> None:
    # The leader was elected at 900 and began at epoch 4; a (head) was granted at 1_000, killed,
    # and its supervisor reported the exit at 1_050; b heads from epoch 5, told at 1_100.
    heads = [(4, "a"), (5, "b")]
    grants = {"a": {4: 1_000.0}}
    assert hold_ms("b", heads, grants, 900, 1_100) == 1_000 + LEASE_MS - 1_100  # no proof
    assert hold_ms("b", heads, grants, 900, 1_100, gone={"a"}) == 0
    # Without proof the election still counts for older leaders' grants; with it, nothing does.
    assert hold_ms("b", heads, {}, 900, 1_100) == 900 + LEASE_MS - 1_100
    assert hold_ms("b", heads, {}, 900, 1_100, gone={"a"}) == 0


def test_every_earlier_head_must_be_gone_for_no_hold() -> None:
    # a -> c -> b between two rounds: a is proven gone, c is not (removed as slow, say).
    heads = [(4, "a"), (5, "c"), (6, "b")]
    grants = {"a": {4: 1_000.0}, "c": {4: 1_050.0}}
    assert hold_ms("b", heads, grants, 0, 1_100, gone={"a"}) == 1_050 + LEASE_MS - 1_100
    assert hold_ms("b", heads, grants, 0, 1_100, gone={"a", "c"}) == 0
    # A head change before this leader began (unknown old head) holds from the election still.
    assert hold_ms("b", [(9, "b")], {}, 1_000, 1_100, gone={"a"}) == LEASE_MS - 100
    assert hold_ms("b", None, grants, 0, 1_100, gone={"a", "c"}) == LEASE_MS
