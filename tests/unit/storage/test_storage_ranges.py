"""Commits that cover a log range wider than their entries: replica ranges and claimed seqs."""

from __future__ import annotations

import pytest

from kayos.errors import InvalidRequest
from kayos.storage import Put, ShardStore

pytestmark = pytest.mark.unit


def test_replica_range_ends_past_its_last_entry_and_survives_reopen(tmp_path: str) -> None:
    path = f"{tmp_path}/s"
    with ShardStore.open(path) as store:
        result = store.commit([Put(b"a", b"1"), Put(b"b", b"2")], seqs=[3, 5], last_seq=9)
        assert (result.first_seq, result.last_seq) == (3, 9)
        assert store.last_seq == 9
        empty = store.commit([], last_seq=12, meta={"hwm/q/g": 4})
        assert (empty.first_seq, empty.last_seq) == (10, 12)
    with ShardStore.open(path) as store:
        assert store.last_seq == 12
        assert store.meta == {"hwm/q/g": 4}
        assert [e.seq for e in store.scan()] == [3, 5]
        assert store.commit([Put(b"c", b"3")]).first_seq == 13


def test_claimed_seq_gives_a_metadata_only_commit_a_range(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1")])
    result = tmp_store.commit([], meta={"hwm/q/g": 1}, claim_seq=True)
    assert (result.first_seq, result.last_seq) == (2, 2)
    assert tmp_store.last_seq == 2
    assert tmp_store.commit([], meta={"x": 1}).last_seq == 2, "without a claim no seq is taken"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ops": [Put(b"a", b"1")], "seqs": [5], "last_seq": 4}, "below the explicit seq"),
        ({"ops": [Put(b"a", b"1")], "claim_seq": True}, "claim_seq"),
        ({"ops": [], "last_seq": 2}, "not above last seq"),
    ],
)
def test_bad_ranges_are_refused_and_change_nothing(
    tmp_store: ShardStore, kwargs: dict[str, object], match: str
) -> None:
    tmp_store.commit([Put(b"a", b"1"), Put(b"b", b"1")])
    ops = kwargs.pop("ops")
    with pytest.raises(InvalidRequest, match=match):
        tmp_store.commit(ops, **kwargs)  # type: ignore[arg-type]
    assert tmp_store.last_seq == 2
    assert [e.key for e in tmp_store.scan()] == [b"a", b"b"]


def test_pages_as_of_an_earlier_seq_show_the_versions_current_then(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(b"a", b"1"), Put(b"b", b"1")])  # 1, 2
    tmp_store.commit([Put(b"a", b"2")])  # 3 supersedes 1
    with tmp_store.snapshot() as snap:
        as_of_2 = [(e.seq, e.value) for page in snap.pages(0, 2, as_of=2) for e in page]
        latest = [(e.seq, e.value) for page in snap.pages(0, 3) for e in page]
    assert as_of_2 == [(1, b"1"), (2, b"1")]
    assert latest == [(2, b"1"), (3, b"2")]
