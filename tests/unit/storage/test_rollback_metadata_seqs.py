"""After a rollback that restored the replicated metadata, no key reports a seq past the store's
last one (``ShardStore.meta_written_at``; docs/storage-format.md, "Rollback"): a group's mark is
served only once the commit point covers the seq that last changed it (``chain.mark_servable``),
and the commit point of the history the store is now on cannot reach a dropped seq until the
shard takes that many writes again, so on an idle shard the tail would refuse every new snapshot
for good."""

from __future__ import annotations

from pathlib import Path

import pytest

from kayos.storage import Put, ShardStore

pytestmark = pytest.mark.unit


def _replicated(name: str) -> bool:
    return name.startswith("hwm/")


def test_a_key_the_rollback_left_unchanged_reports_no_dropped_seq(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        # A consumer's commit retried with the same mark (its first answer timed out): the same
        # value at a later seq, which the rollback then drops.
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        assert store.meta_written_at("hwm/q/g") == 3
        assert store.rollback_to(2, _replicated)
        assert store.meta == {"hwm/q/g": 1}
        assert store.meta_written_at("hwm/q/g") <= store.last_seq == 2
    finally:
        store.close()


def test_a_key_unchanged_since_the_store_opened_reports_no_dropped_seq(tmp_path: Path) -> None:
    """The common case: a tail killed with an uncommitted suffix restarts (every key then
    counts as written at the seq it opened at), and its new upstream orders a rollback."""
    store = ShardStore.open(str(tmp_path / "s"))
    try:
        store.commit([Put(b"k", b"v")])
        store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
        store.commit([Put(b"k", b"w")])
        store.commit([Put(b"k", b"x")])
    finally:
        store.close()
    reopened = ShardStore.open(str(tmp_path / "s"))
    try:
        assert reopened.meta_written_at("hwm/q/g") == 4  # the seq it opened at
        assert reopened.rollback_to(2, _replicated)
        assert reopened.meta == {"hwm/q/g": 1}
        assert reopened.meta_written_at("hwm/q/g") <= reopened.last_seq == 2
        assert reopened.meta_written_at("hwm/q/never") <= 2
    finally:
        reopened.close()
