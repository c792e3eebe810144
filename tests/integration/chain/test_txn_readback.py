"""A live tail catching up by read-back never shows part of a transaction (issue 10).

The tail of a 3-node chain is stopped (SIGSTOP: it stays linked, and serves consumers as soon as it
runs again). Meanwhile the head takes transactions worth more than one frame
(`limits.batch_bytes_max`) and more than the middle's memory of recent batches
(`limits.replica_recent_bytes_max`), then a newer version of every transaction's last key: the
entry that ended each transaction is superseded. When the tail runs again, the middle reads the
range back from its store and must cut it into frames; version 1 of the read-back found no
visible commit end (every one was superseded) and cut at the frame bound, inside a transaction,
and the tail committed and served that part.

Two checks: a reader polling consumer snapshots at the tail while it catches up never gets a
boundary inside a transaction, nor a transaction with entries missing; and after the run the
tail's own store has no commit that ends inside a transaction (the cut it was sent). Should the stop
outlast `limits.peer_silence_ms_max` (a slow box), the middle drops the link and the tail catches
up on a new one instead, serving no consumers meanwhile; the check of its store still holds."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.storage import ShardStore
from kayos.storage.disk import format as fmt
from tests.support.cluster import PRODUCE_TIMEOUT_S, produce, shard_seqs, wait_until

pytestmark = pytest.mark.integration

StartCluster = Callable[..., LocalCluster]
QUEUE = "orders"
ENTRIES_PER_TXN = 128
VALUE_BYTES = 16 * 1024
# Enough transactions to pass both the middle's memory of recent batches and one frame.
TXNS = (limits.replica_recent_bytes_max + limits.batch_bytes_max // 4) // (
    ENTRIES_PER_TXN * VALUE_BYTES
) + 1
READ_BACK_WAIT_S = 180.0  # ~100 MB through a chain of Python nodes on 2 shared cores


@dataclass
class Txn:
    number: int
    first: int
    last: int
    superseded_at: int = 0  # seq of the newer version of its last key


class TailReader(threading.Thread):
    """Polls consumer snapshots at the tail; records every boundary and any partial view."""

    def __init__(self, url: str, txns: list[Txn]) -> None:
        super().__init__(name="tail-reader", daemon=True)
        self.url = url
        self.txns = txns
        self.stop = threading.Event()
        self.boundaries: list[int] = []
        self.partial: list[str] = []
        self.errors: list[object] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll()
            except OSError as exc:  # the tail is stopped or busy: no view, nothing to check
                self.errors.append(repr(exc))
                self.stop.wait(0.02)

    def poll(self) -> None:
        status, page = http_json(f"{self.url}/v1/queues/{QUEUE}/consume?group=g&limit=1")
        if status != 200:
            self.errors.append(page)
            self.stop.wait(0.02)  # 503 while catching up: the tail shows nothing then
            return
        boundary = int(page["boundary"])
        self.boundaries.append(boundary)
        txn = next((t for t in self.txns if t.first <= boundary <= t.last), None)
        if txn is None:
            txn = max((t for t in self.txns if t.last < boundary), key=_last, default=None)
        if txn is None:
            return
        if boundary < txn.last:
            self.partial.append(f"boundary {boundary} inside txn {txn.number} {txn}")
            return
        # The whole transaction as of this boundary: every entry but a superseded last one.
        status, page = http_json(
            f"{self.url}/v1/queues/{QUEUE}/consume?group=g&limit={ENTRIES_PER_TXN}"
            f"&after={txn.first - 1}&upto={boundary}"
        )
        if status != 200:
            self.errors.append(page)
            return
        seqs = [m["seq"] for m in page["messages"] if m["seq"] <= txn.last]
        expected = ENTRIES_PER_TXN - (
            1 if txn.superseded_at and txn.superseded_at <= boundary else 0
        )
        if len(seqs) != expected:
            self.partial.append(
                f"txn {txn.number} {txn}: {len(seqs)} of {expected} entries as of {boundary}"
            )


def _last(txn: Txn) -> int:
    return txn.last


def produce_ok(url: str, messages: list[tuple[str, str | None]]) -> tuple[int, int]:
    status, reply = produce(url, QUEUE, messages, acks="1", txn=True)
    assert status == 200, reply
    return int(reply["first_seq"]), int(reply["last_seq"])


def test_a_tail_catching_up_by_read_back_never_shows_part_of_a_transaction(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    chain = cluster.topology.chain_for(QUEUE)
    head, middle, tail = chain.members
    head_url, tail_url = cluster.url(head), cluster.url(tail)
    status, reply = produce(head_url, QUEUE, [("warm", "up")], acks="all")
    assert status == 200, reply
    print(f"{TXNS} transactions of {ENTRIES_PER_TXN} x {VALUE_BYTES} bytes while {tail} stops")

    process = cluster.processes[tail]
    process.send_signal(signal.SIGSTOP)
    txns: list[Txn] = []
    try:
        value = "v" * VALUE_BYTES
        for number in range(TXNS):
            first, last = produce_ok(
                head_url, [(f"t{number:03d}/{i:03d}", value) for i in range(ENTRIES_PER_TXN)]
            )
            assert last - first + 1 == ENTRIES_PER_TXN
            txns.append(Txn(number, first, last))
        for txn in txns:  # a newer version of each transaction's last key: its end superseded
            _, seq = produce_ok(head_url, [(f"t{txn.number:03d}/{ENTRIES_PER_TXN - 1:03d}", "new")])
            txn.superseded_at = seq
        wait_until(
            lambda: (
                (s := shard_seqs(cluster, middle, 0)) is not None and s[0] >= txns[-1].superseded_at
            ),
            f"{middle} holding every write",
            timeout_s=READ_BACK_WAIT_S,
        )
        reader = TailReader(tail_url, txns)
    finally:
        process.send_signal(signal.SIGCONT)
    reader.start()
    try:
        last_seq = txns[-1].superseded_at
        wait_until(
            lambda: (s := shard_seqs(cluster, tail, 0)) is not None and s[1] >= last_seq,
            f"{tail} committed through {last_seq}",
            timeout_s=READ_BACK_WAIT_S,
        )
        # One more look at the final state.
        deadline = time.monotonic() + 5.0
        seen = len(reader.boundaries)
        while len(reader.boundaries) == seen and time.monotonic() < deadline:
            reader.stop.wait(0.02)  # a bounded poll for one more reading
    finally:
        reader.stop.set()
        reader.join(timeout=PRODUCE_TIMEOUT_S)
    print(
        f"reader saw {len(reader.boundaries)} snapshots, boundaries "
        f"{sorted(set(reader.boundaries))[:20]}; {len(reader.errors)} refused"
    )
    assert reader.boundaries, "the reader saw the tail at least once"
    assert not reader.partial, reader.partial[:5]
    cluster.stop()

    # The tail's own store: every commit it made ends at a transaction's boundary.
    inside = {seq for t in txns for seq in range(t.first, t.last)}
    with (
        ShardStore.open(str(cluster.data_dir(tail) / "shards" / "0")) as store,
        store.snapshot() as snap,
    ):
        ends = [
            seq
            for leaf in snap.leaves(0, store.last_seq)
            for seq, flag in zip(leaf.seqs, leaf.flags, strict=True)
            if flag & fmt.FLAG_BATCH_END
        ]
    cut = sorted(inside.intersection(ends))
    assert not cut, f"{tail} committed pieces ending inside transactions at seqs {cut[:10]}"
