"""The pure retention rule (kayos/storage/maintenance/retention.py, docs/retention.md "The
floor")."""

from __future__ import annotations

import pytest

from kayos.client.policy import error_from_http
from kayos.errors import InvalidRequest, RetentionGapError
from kayos.storage.maintenance.retention import (
    Bucket,
    RetentionPolicy,
    age_floor,
    bytes_floor,
    decide_floor,
    encode_policy,
    floors_in,
    group_marks,
    parse_policy,
    policies_in,
    prefix_floors,
)

pytestmark = pytest.mark.unit


def test_parse_policy_accepts_the_documented_fields_and_refuses_the_rest() -> None:
    assert parse_policy({}) == RetentionPolicy()
    assert parse_policy({}).keeps_all
    policy = parse_policy({"max_age_ms": 5, "max_bytes": 10, "until_consumed": True})
    assert policy == RetentionPolicy(5, 10, until_consumed=True)
    assert parse_policy(policy.to_meta()) == policy
    for bad in (
        [],
        {"max_age": 5},
        {"max_age_ms": 0},
        {"max_age_ms": -1},
        {"max_age_ms": 2**64},
        {"max_bytes": "10"},
        {"max_bytes": True},
        {"until_consumed": 1},
    ):
        with pytest.raises(InvalidRequest):
            parse_policy(bad)


def test_age_floor_never_drops_an_entry_younger_than_the_age() -> None:
    samples: list[tuple[int, int | None]] = [(1, 1000), (50, 2000), (80, None), (120, 3000)]
    # now 3500, age 1000: cutoff 2500; sample (50, 2000) is at or before it: seqs < 50 came
    # before 2000 -> floor 49. Sample (120, 3000) is after the cutoff.
    assert age_floor(samples, 3500, 1000) == 49
    assert age_floor(samples, 4000, 1000) == 119
    assert age_floor(samples, 1500, 1000) == 0
    assert age_floor([], 10**12, 1) == 0


def test_bytes_floor_drops_whole_buckets_while_the_rest_stays_over() -> None:
    buckets = [Bucket(10, 100), Bucket(20, 100), Bucket(30, 100)]
    assert bytes_floor(buckets, 300) == 0
    assert bytes_floor(buckets, 250) == 0  # dropping 10 would leave 200 < 250: keep
    assert bytes_floor(buckets, 200) == 10
    assert bytes_floor(buckets, 100) == 20
    assert bytes_floor(buckets, 1) == 20  # the newest bucket always stays


def test_decide_floor_only_rises_and_never_passes_the_commit_point() -> None:
    consumed = RetentionPolicy(until_consumed=True)
    common = {"now_ms": 0, "samples": [], "buckets": []}
    assert decide_floor(consumed, old_floor=0, commit_point=100, marks=[40, 70], **common) == 40
    assert decide_floor(consumed, old_floor=50, commit_point=100, marks=[40], **common) == 50
    assert decide_floor(consumed, old_floor=0, commit_point=30, marks=[40, 70], **common) == 30
    # No group registered: nothing is consumed, nothing goes.
    assert decide_floor(consumed, old_floor=0, commit_point=100, marks=[], **common) == 0
    # Keep-all never moves.
    assert decide_floor(RetentionPolicy(), old_floor=0, commit_point=100, marks=[90], **common) == 0
    # Any set limit may drop: bytes over until_consumed.
    both = RetentionPolicy(max_bytes=100, until_consumed=True)
    assert (
        decide_floor(
            both,
            old_floor=0,
            commit_point=100,
            now_ms=0,
            samples=[],
            buckets=[Bucket(10, 100), Bucket(20, 100)],
            marks=[5],
        )
        == 10
    )


def test_a_group_registered_after_a_tick_does_not_lower_the_floor() -> None:
    """CI's interleaving in the pure rule: entries 2 and 3 committed, "jobs" commits mark 2 while
    it is the only group, a tick runs, then "jobs+audit" registers at 0. The floor stays 2: a
    reader starting at 0 gets ``RetentionGapError`` (the Kestrel backend goes on from 2)."""
    consumed = RetentionPolicy(until_consumed=True)
    common = {"now_ms": 0, "samples": [], "buckets": []}
    assert decide_floor(consumed, old_floor=0, commit_point=4, marks=[], **common) == 0
    after_jobs = decide_floor(consumed, old_floor=0, commit_point=4, marks=[2], **common)
    assert after_jobs == 2
    assert decide_floor(consumed, old_floor=after_jobs, commit_point=5, marks=[2, 0], **common) == 2
    # Registered before the tick, the late group holds the floor at its mark.
    assert decide_floor(consumed, old_floor=0, commit_point=5, marks=[2, 0], **common) == 0


def test_metadata_readers() -> None:
    meta = {
        "retain/q": encode_policy(RetentionPolicy(until_consumed=True)),
        "retain/bad": b"\x81\xa4nope\x01",
        "retain/junk": b"\xc1",
        "floor/q": 12,
        "floor/zero": 0,
        "hwm/q/g1": 5,
        "hwm/q/g2": 9,
        "hwm/qq/g": 1,
    }
    assert policies_in(meta) == {"q": RetentionPolicy(until_consumed=True)}
    assert floors_in(meta) == {"q": 12}
    assert sorted(group_marks(meta, "q")) == [5, 9]
    assert prefix_floors({"q": 12, "z": 0}) == {b"q\x00": 12}


def test_the_client_reads_retention_gap_with_its_floor() -> None:
    body = {"error": {"code": "retention_gap", "message": "below", "floor": 41, "epoch": 1}}
    error = error_from_http(410, body)
    assert isinstance(error, RetentionGapError)
    assert error.floor == 41
    assert isinstance(error_from_http(410, "gone"), RetentionGapError)
