"""A takeover table's seqs never decrease (docs/replication-protocol.md, "Catch-up handshake"):
a member made head below entries it recorded from its upstream drops them. The case is the one
the simulator found (docs/campaigns.md, "Findings")."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.replication.logic import chain
from kayos.replication.logic.chain import rollback_point, with_takeover

pytestmark = pytest.mark.unit

A, B, M, E, N = (bytes([i]) * 16 for i in range(1, 6))


def test_a_takeover_drops_entries_past_its_seq() -> None:
    table = [(A, 0), (B, 31), (M, 51), (E, 69)]
    assert with_takeover(table, N, 55) == [(A, 0), (B, 31), (M, 51), (N, 55)]
    assert with_takeover(table, N, 69) == [*table, (N, 69)]
    assert with_takeover(table, N, 90) == [*table, (N, 90)]


def test_the_seqs_never_decrease_whatever_the_takeovers() -> None:
    table: chain.TakeoverTable = []
    for i, seq in enumerate([0, 40, 12, 12, 80, 3, 50]):
        table = with_takeover(table, bytes([i + 1]) * 16, seq)
        seqs = [entry[1] for entry in table]
        assert seqs == sorted(seqs), table


def test_a_member_that_recorded_its_upstreams_table_then_took_over() -> None:
    """n3 held seqs up to 55, recorded its upstream's table naming master E from 69, and was made
    head at 55. n1 holds 52-69 written under M. The divergence rule must roll n1 back to 55:
    seqs 56 on are the new master's, not M's."""
    recorded = [(A, 0), (B, 31), (M, 51), (E, 69)]
    head = with_takeover(recorded, N, 55)
    n1 = [(A, 0), (B, 31), (M, 51)]
    assert rollback_point(n1, head, 69, 60) == 55
    # The table as it was before the rule: the next entry after M says 69, and n1 would keep
    # 56-60 of M's history where the new master wrote other entries.
    assert rollback_point(n1, [*recorded, (N, 55)], 69, 60) == 60


def test_a_reset_the_upstreams_capped_table_explains_is_not_a_damaged_upstream() -> None:
    """Campaign seed 20261124 (with the manager, 520 chain changes): a node whose store a fault
    cut back to seq 12,636 returned; its table named only masters older than every entry of the
    tail's table, which the cap had trimmed to the newest 64, so the verdict was a full reset,
    which it refused as below its commit point: the link stayed down and the campaign never
    converged. The cap explains such a verdict; a damaged upstream does not look like it."""
    cap = limits.takeover_table_entries_max
    old = [(bytes([1, i]), i * 10) for i in range(5)]  # masters up to seq 40
    upstream = [(bytes([2, i]), 100 + i) for i in range(cap)]  # trimmed: from seq 100 on
    assert chain.rollback_point(old, upstream, 45, 500) == 0
    assert chain.reset_explained_by_cap(old, upstream, up_last=500, point=45)
    # Not when the table is not full (nothing was trimmed), when the upstream holds less than
    # the commit point the downstream knows, or when the downstream names a later master.
    assert not chain.reset_explained_by_cap(old, upstream[1:], up_last=500, point=45)
    assert not chain.reset_explained_by_cap(old, upstream, up_last=40, point=45)
    assert not chain.reset_explained_by_cap([*old, (b"x", 150)], upstream, up_last=500, point=45)
    assert not chain.reset_explained_by_cap([], upstream, up_last=500, point=45)
