"""The shard digest of ``kayos ctl check`` (docs/node-api.md, "Operator requests"): two stores
that took the same entries give the same digest above their floors whatever their commit
grouping, value placement and compaction history; one differing entry changes it; the floor
rises with compaction; and the online store check passes a live store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kayos.clock import ManualClock
from kayos.node.http.operator_api import digest_entries, digest_floor, parse_compact
from kayos.storage.engine import Delete, Put, ShardStore, StoreOptions
from kayos.storage.maintenance.check import check_snapshot
from kayos.storage.maintenance.compact import compact
from tests.support.storage import TEST_STORE_UUID

if TYPE_CHECKING:
    from pathlib import Path

import pytest

from kayos.errors import InvalidRequest, Unauthenticated
from kayos.identity import ClusterIdentity
from kayos.signing import sign

pytestmark = pytest.mark.unit

WINDOW = 10


def open_store(path: Path) -> ShardStore:
    return ShardStore.open(
        str(path),
        clock=ManualClock(),
        options=StoreOptions(rollback_window_seqs=WINDOW, store_uuid=TEST_STORE_UUID),
    )


def ops(round_no: int) -> list[Put | Delete]:
    batch: list[Put | Delete] = [
        Put(f"q\x00k{i}".encode(), f"v{round_no}".encode() * (1 + 300 * (i == 0))) for i in range(8)
    ]
    batch.append(Put(b"q\x00h", b"x", expiry_ms=5, headers={"b": b"2", "a": b"1"}))
    batch.append(Delete(b"q\x00k7"))
    return batch


def test_same_entries_same_digest_whatever_the_grouping_and_compaction(tmp_path: Path) -> None:
    one = open_store(tmp_path / "one")
    two = open_store(tmp_path / "two")
    try:
        for round_no in range(10):
            one.commit(ops(round_no))
            # the same entries in two commits each on the other store
            batch = ops(round_no)
            two.commit(batch[:4])
            two.commit(batch[4:])
        assert one.last_seq == two.last_seq == 100
        compact(two)
        with one.snapshot() as a, two.snapshot() as b:
            assert digest_floor(a) == 0
            floor = digest_floor(b)
            assert floor == 100 - WINDOW  # superseded versions at or below it are gone
            assert digest_entries(a, floor, 100) == digest_entries(b, floor, 100)
            count, _ = digest_entries(a, floor, 100)
            assert count == WINDOW
            # below the floor the compacted store no longer holds every version
            assert digest_entries(a, 0, 100) != digest_entries(b, 0, 100)
            assert check_snapshot(a, one.path).ok
            assert check_snapshot(b, two.path).ok
        two.rollback_to(99)
        two.commit([Put(b"q\x00k1", b"other")])
        with one.snapshot() as a, two.snapshot() as b:
            assert digest_entries(a, 90, 99) == digest_entries(b, 90, 99)
            assert digest_entries(a, 90, 100) != digest_entries(b, 90, 100)
    finally:
        one.close()
        two.close()


def test_compact_requests_are_signed_and_checked() -> None:
    identity = ClusterIdentity.generate()
    body = {"epoch": 3, "shards": [0, 2]}
    assert parse_compact(identity, {"body": body, "mac": sign(identity, "compact", body)}) == (
        3,
        [0, 2],
    )
    with pytest.raises(Unauthenticated):
        parse_compact(identity, {"body": body, "mac": sign(identity, "catch-up", body)})
    bad = {"epoch": 3, "shards": "all"}
    with pytest.raises(InvalidRequest, match="shards must be a list"):
        parse_compact(identity, {"body": bad, "mac": sign(identity, "compact", bad)})
    extra = {"epoch": 3, "shards": [], "now": True}
    with pytest.raises(InvalidRequest, match="exactly the fields"):
        parse_compact(identity, {"body": extra, "mac": sign(identity, "compact", extra)})
