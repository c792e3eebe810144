"""Idempotent producers through failovers of the head (docs/node-api.md, "Idempotent
producers"), end to end: real `kayos node` processes and three manager members, threads sharing
one `kayos.Client` each writing numbered messages with acks=all, while the head is killed (-9)
and later frozen (SIGSTOP, then SIGCONT). Then everything is read back from the tail: every
acknowledged message is there exactly once, at the seq it was acknowledged with, and each
thread's messages are in its own order.

"Exactly once" is checked against every version the tail stores (the shard digest's count,
docs/node-api.md, "Operator requests"), not the consumer view alone: a message written twice is
one key with two versions, and a consumer snapshot shows only the newer one. Nothing here
measures how fast writes resume (the failover's speed is `kayos bench failover`'s business)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

import kayos
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.manager import Config
from tests.support.checked import chain_of
from tests.support.cluster import read_snapshot, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

QUEUE = "idem"
THREADS = 4
# Acks each thread gets before the first fault and after each one.
ACKS_BETWEEN = 8
# The manager's bounds of tests/integration/manager/test_manager_heals.py: a run of seconds.
CONFIG = Config(detection_window_ms=2_000, suspect_after_ms=1_000)
# A call stuck at a frozen head gives up after this (its outcome unknown), so the run stays
# bounded even before the client follows topology changes by itself.
CALL_TIMEOUT_S = 10.0
# Bound on the waits for a splice, a rejoin or acks after a fault: only a failure reaches it.
FAULT_WAIT_S = 90.0


@dataclass
class Writer:
    """One thread of the shared client: messages ``t<i>-<n>``, one call each, acks=all."""

    index: int
    acked: list[tuple[int, int]] = field(default_factory=list)  # (n, seq), in call order
    unknown: list[tuple[int, str]] = field(default_factory=list)  # (n, error): outcome unknown
    failure: BaseException | None = None  # anything but a Kayos error ends the thread

    def key(self, n: int) -> str:
        return f"t{self.index}-{n:06d}"

    def run(self, client: kayos.Client, stop: threading.Event) -> None:
        n = 0
        try:
            while not stop.is_set():
                try:
                    seq = client.produce(QUEUE, self.key(n), f"v{n}", acks="all")
                except KayosError as exc:
                    self.unknown.append((n, f"{type(exc).__name__}: {exc}"))
                else:
                    self.acked.append((n, seq))
                n += 1  # a failed call's message is never sent again: a new call is a new write
        except BaseException as exc:  # reported by the test
            self.failure = exc


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path, nodes=3, replicas=3, shards=1, managers=3, manager_config=CONFIG
    ) as started:
        print("\n".join(started.describe()))
        yield started


def test_producers_through_killed_and_frozen_heads_write_every_ack_exactly_once(
    cluster: LocalCluster,
) -> None:
    writers = [Writer(i) for i in range(THREADS)]
    stop = threading.Event()
    with kayos.Client(list(cluster.urls.values()), name="idem", timeout_s=CALL_TIMEOUT_S) as client:
        threads = [
            threading.Thread(target=w.run, args=(client, stop), name=f"writer-{w.index}")
            for w in writers
        ]
        for thread in threads:
            thread.start()
        try:
            _acks_after(writers, time.monotonic(), "acks before the first fault")
            _kill_9_the_head(cluster, writers)
            _freeze_the_head(cluster, writers)
        finally:
            stop.set()
            for thread in threads:
                thread.join(FAULT_WAIT_S)
        assert not any(thread.is_alive() for thread in threads), "a writer did not stop"
    for writer in writers:
        assert writer.failure is None, writer.failure
        # The client keeps its calls within the head's window: no resend is too old to tell.
        assert not [e for _n, e in writer.unknown if "producer_seq_too_old" in e], writer.unknown
        print(
            f"writer {writer.index}: {len(writer.acked)} acked, {len(writer.unknown)} unknown "
            f"{writer.unknown[:3]}"
        )
    _check_exactly_once(cluster, writers)


def _acks_after(writers: list[Writer], since: float, what: str) -> None:
    counts = [len(w.acked) for w in writers]

    def each_wrote_more() -> bool:
        return all(len(w.acked) >= c + ACKS_BETWEEN for w, c in zip(writers, counts, strict=True))

    wait_until(each_wrote_more, what, FAULT_WAIT_S)
    print(f"{what}: {time.monotonic() - since:.1f}s")


def _kill_9_the_head(cluster: LocalCluster, writers: list[Writer]) -> None:
    chain = _chain(cluster)
    head, rest = chain[0], chain[1:]
    killed = time.monotonic()
    cluster.kill(head, signal.SIGKILL)
    wait_until(
        lambda: chain_of(cluster, 0) == rest, f"the manager splicing {head} out", FAULT_WAIT_S
    )
    _acks_after(writers, killed, f"acks after kill -9 of head {head}")
    cluster.start(head)
    wait_until(
        lambda: chain_of(cluster, 0) == [*rest, head], f"{head} rejoining as tail", FAULT_WAIT_S
    )


def _freeze_the_head(cluster: LocalCluster, writers: list[Writer]) -> None:
    chain = _chain(cluster)
    head, rest = chain[0], chain[1:]
    pid = cluster.pid(head)
    assert pid is not None
    frozen = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: chain_of(cluster, 0) == rest, f"the manager splicing {head} out", FAULT_WAIT_S
        )
    finally:
        # Woken while calls still wait on it: it fails them once it learns the new topology,
        # and the client sends them again, with their producer_seqs, to the new head.
        os.kill(pid, signal.SIGCONT)
    _acks_after(writers, frozen, f"acks after SIGSTOP of head {head}")
    wait_until(
        lambda: chain_of(cluster, 0) == [*rest, head], f"{head} rejoining as tail", FAULT_WAIT_S
    )


def _chain(cluster: LocalCluster) -> list[str]:
    chain: list[str] = wait_until(lambda: chain_of(cluster, 0), "the manager's view")
    return chain


def _check_exactly_once(cluster: LocalCluster, writers: list[Writer]) -> None:
    # Every member at the manager's last chain, linked and agreeing on the seqs: the tail the
    # nodes' own topology names is the one to read.
    cluster.wait_replicated(FAULT_WAIT_S)
    tail = cluster.live_topology().shards[0].tails[0]
    snapshot = read_snapshot(cluster.url(tail), QUEUE, "check", limit=5000)
    seq_of = {m["key"]: m["seq"] for m in snapshot.messages}
    assert len(seq_of) == len(snapshot.messages)
    # Every version the tail stores up to the snapshot's boundary, superseded ones included: one
    # per message key when nothing was written twice (the shard holds this queue only).
    status, digest = http_json(
        f"{cluster.url(tail)}/v1/shards/0/digest?after=0&upto={snapshot.boundary}"
    )
    assert status == 200, digest
    assert digest["floor"] == 0, "compaction dropped versions: the count would prove nothing"
    print(
        f"tail {tail}: {len(snapshot.messages)} messages, {digest['entries']} versions stored "
        f"up to seq {snapshot.boundary}"
    )
    assert digest["entries"] == len(snapshot.messages), "a message was written twice"
    tried = {w.key(n) for w in writers for n, _ in [*w.acked, *w.unknown]}
    assert set(seq_of) <= tried, "the tail holds a message no writer sent"
    for writer in writers:
        missing = [writer.key(n) for n, _seq in writer.acked if writer.key(n) not in seq_of]
        assert not missing, f"writer {writer.index} lost acknowledged messages {missing[:5]}"
        moved = [(n, seq) for n, seq in writer.acked if seq_of[writer.key(n)] != seq]
        assert not moved, f"writer {writer.index}: messages at other seqs than acked {moved[:5]}"
        seqs = [seq for _n, seq in writer.acked]
        assert seqs == sorted(seqs), f"writer {writer.index}'s messages out of its order"
        assert len(set(seqs)) == len(seqs), f"writer {writer.index}: two calls at one seq"
