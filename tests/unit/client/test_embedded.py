"""Embedded mode (kayos/embedded.py): the client's produce / transaction / consume / commit /
group calls in-process over one real ShardStore in tmp_path."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

import kayos
from kayos.clock import ManualClock
from kayos.embedded import EmbeddedQueue, open_queue
from kayos.errors import InvalidRequest, LimitExceeded, StoreClosedError
from kayos.storage import ShardStore

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from kayos.client.types import Page


@pytest.fixture
def queue(tmp_path: Path, clock: ManualClock) -> Iterator[EmbeddedQueue]:
    with open_queue(str(tmp_path / "q"), clock=clock) as opened:
        yield opened


def drain(pages: Iterator[Page]) -> list[Page]:
    return list(pages)


def seqs_of(pages: list[Page]) -> list[int]:
    return [message.seq for page in pages for message in page.messages]


def test_open_queue_is_exported() -> None:
    assert kayos.open_queue is open_queue


def test_produce_and_consume_round_trip(queue: EmbeddedQueue) -> None:
    assert queue.produce("a", "1") == 1
    assert queue.produce_batch([("b", b"2"), kayos.Item("c", "3", headers={"h": "x"})]) == (2, 3)
    (page,) = drain(queue.consume("g"))
    assert (page.hwm, page.boundary, page.end, page.next) == (0, 3, True, 3)
    assert [(m.seq, m.key, m.value) for m in page.messages] == [
        (1, b"a", b"1"),
        (2, b"b", b"2"),
        (3, b"c", b"3"),
    ]
    assert page.messages[2].headers == {"h": b"x"}


def test_pages_end_with_the_boundary_marker(queue: EmbeddedQueue) -> None:
    queue.produce_batch([(f"k{i}", "v") for i in range(10)])
    pages = drain(queue.consume("g", page_size=4))
    assert [len(page.messages) for page in pages] == [4, 4, 2]
    assert [page.end for page in pages] == [False, False, True]
    assert [page.next for page in pages] == [4, 8, 10]
    assert seqs_of(pages) == list(range(1, 11))


def test_an_exact_multiple_of_the_page_size_has_no_empty_tail_page(queue: EmbeddedQueue) -> None:
    queue.produce_batch([(f"k{i}", "v") for i in range(8)])
    pages = drain(queue.consume("g", page_size=4))
    assert [(len(page.messages), page.end) for page in pages] == [(4, False), (4, True)]


def test_an_empty_snapshot_is_one_end_page(queue: EmbeddedQueue) -> None:
    (page,) = drain(queue.consume("g"))
    assert (page.messages, page.end, page.hwm, page.boundary) == ((), True, 0, 0)


def test_commit_moves_the_group_and_lag(queue: EmbeddedQueue) -> None:
    queue.produce_batch([("a", "1"), ("b", "2"), ("c", "3")])
    assert queue.group("g") == kayos.GroupInfo(0, 3, 3, None)
    info = queue.commit("g", 2, state=b"cursor")
    assert info.hwm == 2
    assert queue.group("g") == kayos.GroupInfo(2, 3, 1, b"cursor")
    (page,) = drain(queue.consume("g"))
    assert (page.hwm, seqs_of([page])) == (2, [3])
    assert seqs_of(drain(queue.consume("other"))) == [1, 2, 3], "groups are independent"


def test_consume_reads_one_pinned_snapshot(queue: EmbeddedQueue) -> None:
    queue.produce_batch([(f"k{i}", "v") for i in range(6)])
    pages = queue.consume("g", page_size=2)
    first = next(pages)
    queue.produce("k0", "newer")  # supersedes seq 1 after the snapshot was taken
    queue.produce("late", "v")
    rest = list(pages)
    assert first.boundary == 6
    assert seqs_of([first, *rest]) == [1, 2, 3, 4, 5, 6]
    assert seqs_of(drain(queue.consume("g"))) == [2, 3, 4, 5, 6, 7, 8], "k0's new version"


def test_deletes_are_tombstones(queue: EmbeddedQueue) -> None:
    queue.produce("a", "1")
    queue.produce("a", None)
    (page,) = drain(queue.consume("g"))
    (message,) = page.messages
    assert (message.seq, message.value, message.deleted) == (2, None, True)


def test_de_dup_keeps_the_newest_version(queue: EmbeddedQueue) -> None:
    queue.produce_batch([("a", "1"), ("b", "1")])
    queue.produce("a", "2")
    messages = [m for page in queue.consume("g") for m in page.messages]
    assert [(m.key, m.value) for m in messages] == [(b"b", b"1"), (b"a", b"2")]


def test_expired_messages_are_skipped(queue: EmbeddedQueue, clock: ManualClock) -> None:
    now_ms = int(clock.now_s() * 1000)
    queue.produce("short", "v", expiry_ms=now_ms + 1000)
    queue.produce("long", "v", expiry_ms=now_ms + 60_000)
    assert len(seqs_of(drain(queue.consume("g")))) == 2
    clock.advance(2.0)
    messages = [m for page in queue.consume("g") for m in page.messages]
    assert [m.key for m in messages] == [b"long"]
    assert messages[0].expiry_ms == now_ms + 60_000


def test_transaction_commits_on_a_clean_exit_only(queue: EmbeddedQueue) -> None:
    with queue.transaction() as txn:
        txn.put("a", "1")
        txn.put("b", "2")
        txn.delete("c")
    assert txn.result == (1, 3)

    def abandon() -> None:
        with queue.transaction() as failed:
            failed.put("d", "4")
            raise RuntimeError("abandon")

    with pytest.raises(RuntimeError):
        abandon()
    assert queue.last_seq == 3


def test_state_survives_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "q")
    with open_queue(path) as queue:
        queue.produce_batch([("a", "1"), ("b", "2")])
        queue.commit("g", 1)
    with open_queue(path) as queue:
        assert queue.group("g").hwm == 1
        assert seqs_of(drain(queue.consume("g"))) == [2]
    with ShardStore.open(path) as store:
        assert store.meta["hwm/g"] == 1, "the documented metadata key"
        assert store.get(b"a") is not None, "keys are stored as given"


@pytest.mark.parametrize("hwm", [-1, 3, True])
def test_commit_refuses_an_impossible_mark(queue: EmbeddedQueue, hwm: int) -> None:
    queue.produce_batch([("a", "1"), ("b", "2")])
    with pytest.raises(InvalidRequest):
        queue.commit("g", hwm)


def test_bad_input_is_refused(queue: EmbeddedQueue) -> None:
    with pytest.raises(InvalidRequest):
        queue.produce_batch([])
    with pytest.raises(LimitExceeded):
        queue.produce("k" * 300, "v")
    with pytest.raises(InvalidRequest):
        drain(queue.consume(""))
    with pytest.raises(InvalidRequest):
        drain(queue.consume("g", page_size=0))
    with pytest.raises(InvalidRequest):
        queue.produce("k", "v", acks=2)  # type: ignore[arg-type]
    with pytest.raises(LimitExceeded):
        queue.commit("g", 0, state=b"x" * (64 * 1024 + 1))
    assert queue.last_seq == 0


def test_closed_queue_refuses_work(tmp_path: Path) -> None:
    queue = open_queue(str(tmp_path / "q"))
    queue.close()
    with pytest.raises(StoreClosedError):
        queue.produce("a", "1")


def test_concurrent_producers_get_distinct_seqs(queue: EmbeddedQueue) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def produce(worker: int) -> None:
        for i in range(25):
            seq = queue.produce(f"w{worker}-{i}", "v")
            with lock:
                results.append(seq)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == list(range(1, 101))
    assert seqs_of(drain(queue.consume("g", page_size=7))) == list(range(1, 101))
