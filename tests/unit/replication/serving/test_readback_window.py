"""A store a link filled by read-back answers as its upstream does for every seq of the rollback
window: a consumer snapshot below the piece's end, and a rollback into the piece.

The finding (campaign seed 20261124, op 62614, docs/campaigns.md "Findings"): learner ``a`` copied
``(10843, 11565]`` of shard 0 from ``c`` in one read-back piece, the state as of 11565. ``c``'s
commit point was 11563; 11564 and 11565 (keys k14 and k13) were accepted but not yet committed,
and they superseded k14@11559 and k13@11548, so the piece left those two versions out. ``a`` then
became the tail with commit point 11563 and served a snapshot ``(10842, 11563]`` as of 11563:
k13 and k14 had no version there at all (the ones above 11563 are not visible as of 11563), so
both keys were missing, and the transactions holding 11544 and 11559 looked torn. A read-back
piece now leaves out only versions superseded at or below its upstream's rollback window floor
(``last_seq - rollback_window_seqs``), as compaction does, so every state the window promises
(consumer snapshots as of a commit point, rollbacks) is whole on the copy too.

Real stores and the link's own read-back and batch builder; no peers, no timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.clock import ManualClock
from kayos.replication.link.sender import build_batch, read_range
from kayos.storage.engine import Put, ShardStore, StoreOptions
from tests.support.storage import TEST_STORE_UUID

pytestmark = pytest.mark.unit

K13, K14, K0 = b"q\x00k13", b"q\x00k14", b"q\x00k0"


def open_store(directory: Path, window: int = 100_000) -> ShardStore:
    return ShardStore.open(
        str(directory),
        clock=ManualClock(),
        options=StoreOptions(rollback_window_seqs=window, store_uuid=TEST_STORE_UUID),
    )


def copy(upstream: ShardStore, downstream: ShardStore) -> None:
    """What a link behind its upstream's memory does: reads the range back piece by piece and
    the downstream commits each ``BATCH`` as one store commit (kayos.replication.link.upstream)."""
    while downstream.last_seq < upstream.last_seq:
        entries, covered, meta, _ = read_range(upstream, downstream.last_seq, upstream.last_seq)
        batch = build_batch(0, downstream.last_seq + 1, covered, entries, meta or None)
        downstream.commit_columns(
            batch.keys,
            batch.values,
            batch.expiries_ms,
            batch.headers,
            seqs=batch.seqs,
            last_seq=batch.last_seq,
            meta=batch.meta,
        )


def as_of(store: ShardStore, after: int, boundary: int) -> list[tuple[int, bytes, bytes | None]]:
    with store.snapshot() as snap:
        return [
            (e.seq, e.key, e.value)
            for page in snap.pages(after, boundary, as_of=boundary, include_expired=True)
            for e in page
        ]


def diverging_history(tmp_path: Path, window: int = 100_000) -> tuple[ShardStore, ShardStore]:
    """Upstream and a downstream that shares its first two seqs; then k13 and k14 get a version
    each, the commit point reaches 5, and two uncommitted writes supersede both keys."""
    upstream = open_store(tmp_path / "up", window)
    downstream = open_store(tmp_path / "down", window)
    upstream.commit([Put(K13, b"old"), Put(K14, b"old")])  # seqs 1, 2
    copy(upstream, downstream)
    upstream.commit([Put(K13, b"v1")])  # 3
    upstream.commit([Put(K14, b"v1")])  # 4
    upstream.commit([Put(K0, b"x")])  # 5: the commit point
    upstream.commit([Put(K14, b"v2"), Put(K13, b"v2")])  # 6, 7: accepted, not committed
    copy(upstream, downstream)
    assert downstream.last_seq == upstream.last_seq == 7
    return upstream, downstream


def test_a_snapshot_below_the_pieces_end_holds_every_key(tmp_path: Path) -> None:
    upstream, downstream = diverging_history(tmp_path)
    expected = [(3, K13, b"v1"), (4, K14, b"v1"), (5, K0, b"x")]
    assert as_of(upstream, 2, 5) == expected
    # Before the fix the copy held only 5, 6 and 7 past seq 2: k13 and k14 were missing.
    assert as_of(downstream, 2, 5) == expected
    # As of the piece's end both agree as well (nothing extra shows).
    assert (
        as_of(downstream, 2, 7)
        == as_of(upstream, 2, 7)
        == [
            (5, K0, b"x"),
            (6, K14, b"v2"),
            (7, K13, b"v2"),
        ]
    )
    upstream.close()
    downstream.close()


def test_a_rollback_into_the_piece_restores_the_upstreams_versions(tmp_path: Path) -> None:
    """The uncommitted 6 and 7 are dropped (the head that accepted them died): the copy must
    come back to 3 and 4, not to the versions it held before the piece (seqs 1 and 2)."""
    upstream, downstream = diverging_history(tmp_path)
    upstream.rollback_to(5)
    downstream.rollback_to(5)
    for store in (upstream, downstream):
        newest = [store.get(K13), store.get(K14)]
        assert [(e.seq, e.value) if e else None for e in newest] == [(3, b"v1"), (4, b"v1")]
    assert as_of(downstream, 0, 5) == as_of(upstream, 0, 5)
    upstream.close()
    downstream.close()


def test_versions_superseded_below_the_window_floor_are_still_left_out(tmp_path: Path) -> None:
    """Past the rollback window a piece is still the compact state (a link far behind on a shard
    that overwrites a few keys does not send every version): only what the window promises is
    kept, the versions superseded above ``last_seq - rollback_window_seqs``."""
    upstream = open_store(tmp_path / "up", window=10)
    downstream = open_store(tmp_path / "down", window=10)
    for round_no in range(20):  # seqs 1..40: k13 and k14 overwritten in turn
        upstream.commit([Put(K13, b"a%d" % round_no)])
        upstream.commit([Put(K14, b"b%d" % round_no)])
    copy(upstream, downstream)
    with downstream.snapshot() as snap:
        held = [e.seq for page in snap.pages(0, 40, as_of=40) for e in page]
    # Superseded at or below the floor 30: left out. Superseded above it (by 31..40): kept.
    with downstream.snapshot() as snap:
        versions = [s for leaf in snap.leaves(0, 40) for s in leaf.seqs]
    assert versions == list(range(29, 41))
    assert held == [39, 40]
    # Every state the window promises reads as it does upstream.
    for boundary in range(30, 41):
        assert as_of(downstream, 0, boundary) == as_of(upstream, 0, boundary), boundary
    upstream.close()
    downstream.close()
