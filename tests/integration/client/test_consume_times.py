"""Append times on real nodes (docs/node-api.md, "Append times"): a consume page asked for with
``times=1`` carries the tail's time-index samples its messages land on, bracketing the page
(the floor sample of its first message, none past its last), with times inside the produce's
window less one sampling interval; without the flag the reply has no such field; the clients
turn the samples into ``Message.append_ms``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from kayos import limits
from kayos.client import Client
from kayos.local.http import http_json
from tests.support.cluster import produce_ok, wait_until

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    from collections.abc import Callable

    from kayos.local.cluster import LocalCluster

QUEUE = "stamped"
INTERVAL_MS = limits.time_index_interval_ms


def page(tail: str, query: str) -> dict[str, Any]:
    status, reply = http_json(f"{tail}/v1/queues/{QUEUE}/consume?group=_read&{query}")
    assert status == 200, reply
    return dict(reply)


def within(ms: int | None, window: tuple[float, float]) -> bool:
    """``ms`` is a time the floor rule may give a message produced within ``window`` (wall-clock
    seconds before the request and after its acks=all answer): never after the tail took it in
    (before the answer), at most one interval before."""
    before, after = window
    return ms is not None and before * 1000 - INTERVAL_MS < ms <= after * 1000


def test_times_bracket_the_page_and_the_client_expands_them(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    head = cluster.url(cluster.head_of(QUEUE))
    tail = cluster.url(cluster.tails_of(QUEUE)[0])

    start_a = time.time()
    first_a, last_a = produce_ok(head, QUEUE, [("a1", "x"), ("a2", "x"), ("a3", "x")])
    end_a = time.time()
    # The next batch must fall in a later sampling interval at the tail: wait (polling the clock,
    # bounded) until one interval has passed since batch a was acknowledged.
    wait_until(lambda: time.time() >= end_a + INTERVAL_MS / 1000 + 0.05, "one interval")
    start_b = time.time()
    first_b, last_b = produce_ok(head, QUEUE, [("b1", "y"), ("b2", "y")])
    end_b = time.time()
    cluster.wait_replicated()

    whole = page(tail, "after=0&limit=100&times=1")
    seqs = [m["seq"] for m in whole["messages"]]
    assert seqs == [*range(first_a, last_a + 1), *range(first_b, last_b + 1)], whole
    samples = whole["times"]
    print(f"samples {samples} for seqs {seqs}")
    assert [seq for seq, _ in samples] == [first_a, first_b], "one sample per interval"
    assert within(samples[0][1], (start_a, end_a)), samples
    assert within(samples[1][1], (start_b, end_b)), samples
    assert samples[0][1] < samples[1][1]

    # A page that starts inside batch a: its floor sample is a's, below the page's first seq.
    middle = page(tail, f"after={first_a}&limit=2&times=1")
    assert [m["seq"] for m in middle["messages"]] == [first_a + 1, first_a + 2]
    assert middle["times"] == [samples[0]], "only the sample its messages land on"
    # Columnar, of batch b only: b's sample, nothing past the page's last message.
    later = page(tail, f"after={last_a}&limit=100&times=1&columns=1")
    assert later["seqs"] == list(range(first_b, last_b + 1))
    assert later["times"] == [samples[1]]

    plain = page(tail, "after=0&limit=100&columns=1")
    assert "times" not in plain, "not asked: the reply is as before"
    status, refused = http_json(f"{tail}/v1/queues/{QUEUE}/consume?group=_read&times=2")
    assert status == 400, refused
    assert "times" in refused["error"]["message"], refused

    with Client(list(cluster.urls.values())) as client:
        read = client.read(QUEUE, after=0, limit=100, times=True)
        stamps = {m.key: m.append_ms for m in read.messages}
        assert all(within(stamps[k], (start_a, end_a)) for k in (b"a1", b"a2", b"a3")), stamps
        assert all(within(stamps[k], (start_b, end_b)) for k in (b"b1", b"b2")), stamps
        assert list(read.columns.append_ms or []) == list(stamps.values())
        consumed = [m for p in client.consume(QUEUE, "g", times=True) for m in p.messages]
        assert {m.key: m.append_ms for m in consumed} == stamps
        untimed = client.read(QUEUE, after=0, limit=100)
        assert untimed.columns.append_ms is None
        assert {m.append_ms for m in untimed.messages} == {None}
