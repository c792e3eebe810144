"""``chain.upstream_lacks_committed``: a head whose verdict for a subscribing downstream would drop
seqs the downstream knows committed lost them itself (docs/replication-protocol.md, "An upstream
that lacks committed entries"). The cases are transcripts of the handshake: the tables and last
seqs each side holds, the verdict the divergence rule gives, and whether the head must repair."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.replication.logic import chain

pytestmark = pytest.mark.unit

OLD, NEW, OTHER = (bytes([i]) * 16 for i in range(1, 4))


def _lacks(
    down: chain.TakeoverTable, down_last: int, point: int, up: chain.TakeoverTable, up_last: int
) -> tuple[int | None, bool]:
    verdict = chain.rollback_point(down, up, down_last, up_last)
    return verdict, chain.upstream_lacks_committed(
        down, up, verdict=verdict, up_last=up_last, point=point
    )


def test_a_head_cut_past_its_durable_mark_lacks_what_its_downstream_knows_committed() -> None:
    """Campaign seed 1115409774: c (master OLD from 0) committed through 900 with b, its store
    was cut to 600 (a whole header: nothing torn) after its last mark write, it restarted as head
    and added (NEW, 600). b holds 1000 and knows 900 committed: the verdict (roll b back to 600)
    would drop 601-900, committed. The head must repair instead."""
    head = chain.with_takeover([(OLD, 0)], NEW, 600)
    assert _lacks([(OLD, 0)], 1000, 900, head, 600) == (600, True)


def test_a_head_that_wrote_since_its_cut_still_lacks_them() -> None:
    """The same head took writes 601-950 (never committed: b refused their history) before b
    subscribed: it holds more than b's commit point, but its log agrees with b's only through
    600, so the verdict still drops committed seqs."""
    head = chain.with_takeover([(OLD, 0)], NEW, 600)
    assert _lacks([(OLD, 0)], 1000, 900, head, 950) == (600, True)


def test_a_head_with_an_empty_store_lacks_everything_committed() -> None:
    head = chain.with_takeover([], NEW, 0)
    assert _lacks([(OLD, 0)], 40, 5, head, 0) == (0, True)


def test_a_downstream_ahead_only_by_uncommitted_seqs_is_rolled_back_as_before() -> None:
    """Forward, then persist: the head lost seqs 901-1000 before they were durable on it, so they
    were never committed (b knows 900): b drops them, nothing is wrong with the head."""
    head = chain.with_takeover([(OLD, 0)], NEW, 900)
    assert _lacks([(OLD, 0)], 1000, 900, head, 900) == (900, False)


def test_a_downstream_diverged_above_its_commit_point_is_rolled_back_as_before() -> None:
    """b took over at 700 while the head was away and wrote 701-800, never committed (its commit
    point is 700); the head, back as head of a chain the manager restored, wrote 701-900. b rolls
    back to 700."""
    head = [(OLD, 0), (NEW, 700)]
    assert _lacks([(OLD, 0), (OTHER, 700)], 800, 700, head, 900) == (700, False)


def test_a_prefix_or_an_empty_downstream_gets_no_verdict() -> None:
    head = [(OLD, 0), (NEW, 600)]
    assert _lacks([(OLD, 0)], 500, 500, head, 900) == (None, False)
    assert _lacks([], 0, 0, head, 900) == (None, False)


def test_a_downstream_that_knows_no_commit_point_never_finds_a_head_short() -> None:
    """A peer's SUBSCRIBE without the field decodes nowhere (links need version 5), and a fresh
    downstream knows 0: the rule never fires on 0."""
    head = chain.with_takeover([(OLD, 0)], NEW, 600)
    assert _lacks([(OLD, 0)], 1000, 0, head, 600) == (600, False)


def test_a_reset_the_capped_table_explains_is_not_a_head_that_lacks() -> None:
    """The table cap trimmed the common master away, and the head holds at least the commit point
    the downstream knows: the downstream resets and copies everything, nothing committed is
    lost. Were the head shorter than that point, it lacks them."""
    cap = limits.takeover_table_entries_max
    old = [(bytes([1, i]), i * 10) for i in range(5)]
    upstream = [(bytes([2, i]), 100 + i) for i in range(cap)]
    assert _lacks(old, 45, 45, upstream, 500) == (0, False)
    assert _lacks(old, 45, 45, upstream, 40) == (0, True)


def test_a_head_drops_past_the_agreed_seq_only_what_it_never_knew_committed() -> None:
    """The cut head of the first case, back with commit point 0 (a head's starts there) or one
    at most the agreed seq, drops its own writes past 600 and re-fetches. A head that committed
    seqs past it alone (a chain of one) would destroy acknowledged entries: it keeps them."""
    assert chain.may_drop_past(600, 0)
    assert chain.may_drop_past(600, 600)
    assert not chain.may_drop_past(600, 601)


def test_a_remade_head_drops_nothing_its_durable_mark_knew_committed() -> None:
    """A head re-made or restarted with a downstream starts at commit point 0; its durable mark
    still names what it committed before (as a chain of one): past the agreed seq, it keeps it."""
    assert not chain.may_drop_past(100, 0, marked=110)
    assert not chain.may_drop_past(100, 101, marked=0)
    assert chain.may_drop_past(100, 0, marked=100)
    assert chain.may_drop_past(100, 90, marked=95)
