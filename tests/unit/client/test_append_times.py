"""Append times of consumed messages (docs/node-api.md, "Append times"): the floor rule that
expands a page's time-index samples to one time per message, the node's choice of samples
(``TimeIndex.covering``) giving back exactly the index's own lookup, and the client decoding a
reply's ``times`` in both page shapes."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from kayos import limits
from kayos.client.times import samples_from_reply, times_of
from kayos.client.types import Message, page_from_reply
from kayos.errors import ProtocolError
from kayos.node.http.bodies import page_payload
from kayos.node.pages import Page as NodePage
from kayos.replication.logic.timeindex import TimeIndex

pytestmark = pytest.mark.unit


def test_each_message_takes_the_time_of_the_last_sample_at_or_below_its_seq() -> None:
    samples = [(10, 1_000), (20, 2_000), (30, None), (40, 4_000)]
    seqs = [5, 10, 11, 19, 20, 29, 30, 35, 40, 99]
    assert times_of(seqs, samples) == [
        None,  # below every sample: unknown
        1_000,  # on a sample: its time
        1_000,
        1_000,  # up to the next sample: the earlier one's (never later than the real time)
        2_000,
        2_000,
        None,  # a null sample: unknown from there on
        None,
        4_000,
        4_000,  # past the last sample: the last one's
    ]


def test_no_samples_or_no_messages() -> None:
    assert times_of([1, 2, 3], []) == [None, None, None]
    assert times_of([], [(1, 5)]) == []
    assert times_of([7], [(8, 5)]) == [None]


def test_the_rule_is_never_later_and_at_most_one_interval_earlier_than_intake() -> None:
    """Batches taken in at known times through a real index: the expanded time of each seq is at
    or before its intake, by less than one interval."""
    seed = int(os.environ.get("KAYOS_TEST_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    interval_ms = 1000
    index = TimeIndex(interval_ms=interval_ms, samples_max=1024)
    intake_ms: dict[int, int] = {}
    seq, now_ms = 0, 1_700_000_000_000
    for _ in range(400):
        now_ms += rng.choice((1, 50, 300, 999, 1000, 2500))
        size = rng.randint(1, 5)
        index.note(seq + 1, seq + size, now_ms / 1000)
        for s in range(seq + 1, seq + size + 1):
            intake_ms[s] = now_ms
        seq += size
    seqs = sorted(rng.sample(range(1, seq + 1), 200))
    for s, ms in zip(seqs, times_of(seqs, index.covering(seqs)), strict=True):
        assert ms is not None
        assert intake_ms[s] - interval_ms < ms <= intake_ms[s], (s, ms, intake_ms[s])


@pytest.mark.parametrize("trial", range(30))
def test_the_samples_a_node_sends_give_back_the_index_lookup_exactly(trial: int) -> None:
    seed = int(os.environ.get("KAYOS_TEST_SEED", random.randrange(2**32))) + trial
    print(f"seed {seed}")
    rng = random.Random(seed)
    index = TimeIndex(interval_ms=rng.choice((1, 10, 1000)), samples_max=rng.choice((4, 8, 64)))
    seq, now_s = 0, 1_700_000_000.0
    for _ in range(rng.randint(0, 200)):
        now_s += rng.choice((0.0, 0.004, 0.5, 2.0))
        size = rng.randint(1, 8)
        if rng.random() < 0.1:
            index.unknown_from(seq + 1, seq + size)  # a catch-up
        else:
            index.note(seq + 1, seq + size, now_s)
        seq += size
        if rng.random() < 0.03:
            seq = rng.randint(0, seq)
            index.truncate_after(seq)  # a rollback
    top = seq + rng.randint(0, 5)  # a page may hold seqs the index does not cover
    seqs = sorted(rng.sample(range(1, top + 2), rng.randint(0, min(top + 1, 40))))
    samples = index.covering(seqs)
    assert len(samples) <= len(seqs) + 1
    assert times_of(seqs, samples) == [index.time_of(s) for s in seqs]
    assert samples_from_reply([list(pair) for pair in samples]) == samples


def test_a_sparse_page_gets_only_the_samples_its_messages_land_on() -> None:
    index = TimeIndex(interval_ms=1, samples_max=4096)
    for seq in range(1, 1001):
        index.note(seq, seq, seq / 1000)
    assert index.covering([100, 500, 900]) == [(100, 100), (500, 500), (900, 900)]
    assert index.covering([10, 11, 12]) == [(10, 10), (11, 11), (12, 12)]
    assert index.covering([999, 1000, 1002]) == [(999, 999), (1000, 1000), (1001, None)]
    assert index.covering([]) == []


def columnar_reply(seqs: list[int], times: object) -> dict[str, object]:
    return {
        "shard": 1,
        "group": "g",
        "hwm": 0,
        "boundary": 50,
        "seqs": seqs,
        "keys": [b"k%d" % s for s in seqs],
        "values": [b"v"] * len(seqs),
        "expiries_ms": None,
        "headers": None,
        "deleted": None,
        "times": times,
        "next": 50,
        "end": True,
    }


def test_a_columnar_page_with_times_gives_each_message_its_append_time() -> None:
    page = page_from_reply(columnar_reply([3, 7, 12], [[2, 100], [10, 200]]))
    assert page.columns.append_ms == [100, 100, 200]
    assert [m.append_ms for m in page.messages] == [100, 100, 200]
    assert page.messages[0] == Message(3, b"k3", b"v", append_ms=100)


def test_a_page_without_times_or_with_none_known_has_no_append_times() -> None:
    plain = columnar_reply([3, 7], None)
    del plain["times"]
    for reply in (plain, columnar_reply([3, 7], None), columnar_reply([3, 7], [[3, None]])):
        page = page_from_reply(reply)
        assert page.columns.append_ms is None
        assert [m.append_ms for m in page.messages] == [None, None]


def test_a_message_list_page_with_times_gives_each_message_its_append_time() -> None:
    reply = {
        "shard": 1,
        "group": "g",
        "hwm": 0,
        "boundary": 9,
        "messages": [{"seq": 4, "key": "a", "value": "x"}, {"seq": 9, "key": "b", "value": "y"}],
        "times": [[1, 5_000], [8, 6_000]],
        "next": 9,
        "end": True,
    }
    page = page_from_reply(reply)
    assert [m.append_ms for m in page.messages] == [5_000, 6_000]
    assert page.columns.append_ms == (5_000, 6_000)


@pytest.mark.parametrize(
    "times",
    [
        "soon",
        [[1]],
        [[1, 2, 3]],
        [[-1, 5]],
        [[1, -5]],
        [[1, 1.5]],
        [[True, 5]],
        [["1", 5]],
        [[2, 5], [2, 6]],  # not strictly increasing
        [[3, 5], [2, 6]],
        [[s, 1] for s in range(limits.consume_page_time_samples_max + 1)],
    ],
)
def test_a_malformed_times_field_is_a_protocol_error(times: object) -> None:
    with pytest.raises(ProtocolError, match="malformed consume reply"):
        page_from_reply(columnar_reply([3], times))


@pytest.mark.parametrize("columns", [True, False])
def test_the_node_reply_carries_times_only_when_asked(columns: bool) -> None:
    page = NodePage(1, "g", 0, 9, [3, 8], [b"a", b"b"], [b"v", b"w"], None, None, None, 9, True)
    assert "times" not in page_payload(page, columns=columns)
    timed = dataclasses.replace(page, times=[(1, 5_000), (8, 6_000)])
    decoded = page_from_reply(page_payload(timed, columns=columns))
    assert [m.append_ms for m in decoded.messages] == [5_000, 6_000]
