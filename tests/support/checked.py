"""Writes on a real cluster recorded for the chaos checker, and its verdict that nothing
acknowledged was lost: producers writing with acks=all one key at a time while the manager heals
the chain (with the manager leader's view), and batches written and snapshots read on a 3-node
chain whose stores are damaged."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import check
from chaos.history import Event, Produce, Snapshot
from chaos.history import Event as HistoryEvent
from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import WAIT_S, answered_status, produce_ok, read_snapshot, wait_until

# --- producers while the manager heals --------------------------------------------------------

PRODUCER_QUEUE = "healed"  # what each ``Producer`` writes to
PRODUCERS = 2
BEFORE = 20  # acks each producer gets before the fault
AFTER = 20  # ... and after the repair


@dataclass
class Producer:
    """Keys ``p<i>-<n>`` one at a time with acks=all, each recorded for the checker."""

    index: int
    urls: list[str]
    history: list[Produce] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)
    invoked_at: list[float] = field(default_factory=list)  # of each acked call, when it began
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self, client: Client | None = None) -> None:
        """Produces from a thread of its own, on ``client`` (a ``kayos.Client`` other threads
        share) or else on a client of its own."""
        self.thread = threading.Thread(
            target=self._run, args=(client,), name=f"producer-{self.index}"
        )
        self.thread.start()

    def _run(self, shared: Client | None) -> None:
        if shared is not None:
            self._produce_until_stopped(shared)
            return
        with Client(self.urls, name=f"producer-{self.index}") as client:
            self._produce_until_stopped(client)

    def _produce_until_stopped(self, client: Client) -> None:
        n = 0
        while not self.stop.is_set():
            key, value, op = self.call(n)
            n += 1
            began = time.monotonic()
            try:
                seq = client.produce(PRODUCER_QUEUE, key, value, acks="all")
            except KayosError as exc:
                self.failed(op, key, value, exc)
                continue
            self.acked(op, key, value, seq, began)

    def call(self, n: int) -> tuple[str, str, int]:
        """The key, value and history op of this producer's call number ``n`` (from 0)."""
        key = f"p{self.index}-{n:05d}"
        return key, f"v-{key}", self.index * 1_000_000 + n + 1

    def failed(self, op: int, key: str, value: str, error: KayosError) -> None:
        """Records a call that raised: its outcome is unknown."""
        item = ((key, value),)
        self.history.append(
            Produce(op, PRODUCER_QUEUE, item, False, "all", "unknown", error=str(error))
        )

    def acked(self, op: int, key: str, value: str, seq: int, began: float) -> None:
        """Records an acknowledged call, begun at ``began`` (time.monotonic())."""
        self.history.append(
            Produce(op, PRODUCER_QUEUE, ((key, value),), False, "all", "ok", seq, seq)
        )
        self.acked_at.append(time.monotonic())
        self.invoked_at.append(began)

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(WAIT_S * 2)
        assert not self.thread.is_alive(), f"producer {self.index} did not stop"


def manager_status(cluster: LocalCluster, member: str) -> dict[str, Any] | None:
    """The member's ``GET /v1/manager/status``, None when it gives no answer in time (a loaded
    box) or an error: for a condition polled by ``wait_until``."""
    try:
        code, body = http_json(
            cluster.manager_url(member) + "/v1/manager/status",
            timeout_s=2.0,
            cluster_secret=cluster.identity.secret,
        )
    except (OSError, ValueError):
        return None
    return body if code == 200 and isinstance(body, dict) else None


def manager_view(cluster: LocalCluster) -> dict[str, Any] | None:
    """The manager leader's status, None when it gives none: for a condition polled by
    ``wait_until`` (a read outside a wait uses ``answered_view``)."""
    leader = cluster.wait_manager_leader()
    assert leader is not None
    return manager_status(cluster, leader)


def answered_view(cluster: LocalCluster) -> dict[str, Any]:
    """The manager leader's status, asked again until it answers (within the bound)."""
    view: dict[str, Any] = wait_until(lambda: manager_view(cluster), "the manager leader's status")
    return view


def chain_of(cluster: LocalCluster, shard: int) -> list[str] | None:
    """The shard's chain in the leader's view, None when the leader gives no answer: for a
    condition polled by ``wait_until``."""
    view = manager_view(cluster)
    return None if view is None else view["view"]["shards"][shard]["chain"]


def node_states(cluster: LocalCluster) -> dict[str, str]:
    """Each node's state in the leader's view, once the leader answers."""
    return {n: s for n, s, *_ in answered_view(cluster)["view"]["nodes"]}


def check_nothing_lost(
    cluster: LocalCluster, tail: str, producers: list[Producer], queue: str = PRODUCER_QUEUE
) -> None:
    """The chaos checker's verdict over the producers' histories and one snapshot read at
    ``tail``: every acknowledged message delivered, nothing else violated."""
    snapshot = read_snapshot(cluster.url(tail), queue, "check")
    history: list[HistoryEvent] = [e for p in producers for e in p.history]
    messages = tuple((m["seq"], m["key"], m["value"]) for m in snapshot.messages)
    history.append(
        Snapshot(9_999_999, queue, "check", 0, snapshot.hwm, snapshot.boundary, messages, True)
    )
    verdict = check(history)
    print(f"acked {verdict.acked_versions}, delivered {verdict.delivered_messages}")
    assert verdict.ok, [v.to_json() for v in verdict.violations]


# --- batches and snapshots on a 3-node chain ---------------------------------------------------

RECORDED_QUEUE = "q"  # what ``produce_recorded`` writes to
BATCHES = 40
BATCH = 50


_ops = itertools.count(1)


def produce_recorded(cluster: LocalCluster, events: list[Event], tag: str, batches: int) -> None:
    """``batches`` batches of ``BATCH`` messages tagged ``tag`` at the head, each recorded in
    ``events`` as an acknowledged produce."""
    for batch in range(batches):
        items = tuple(
            (f"{tag}-{batch}-{i}", f"v-{tag}-{batch}-{i}-" + "x" * 80) for i in range(BATCH)
        )
        invoked = next(_ops)
        first, last = produce_ok(
            cluster.url(cluster.head_of(RECORDED_QUEUE)), RECORDED_QUEUE, list(items)
        )
        events.append(
            Produce(
                invoked,
                RECORDED_QUEUE,
                items,
                txn=False,
                acks="all",
                outcome="ok",
                first_seq=first,
                last_seq=last,
                invoked=invoked,
                completed=next(_ops),
            )
        )


def consume_recorded(cluster: LocalCluster, events: list[Event], group: str) -> None:
    """A snapshot of ``group`` read at every tail of ``RECORDED_QUEUE``, each recorded in
    ``events``."""
    for tail in cluster.tails_of(RECORDED_QUEUE):
        invoked = next(_ops)
        snap = read_snapshot(cluster.url(tail), RECORDED_QUEUE, group, limit=5000)
        events.append(
            Snapshot(
                invoked,
                RECORDED_QUEUE,
                group,
                0,
                snap.hwm,
                snap.boundary,
                tuple((m["seq"], m["key"], m["value"]) for m in snap.messages),
                finished=True,
                invoked=invoked,
                completed=next(_ops),
            )
        )


def assert_nothing_lost(cluster: LocalCluster, events: list[Event], acked: int) -> None:
    """No member rolled back a committed entry, and every tail serves every acknowledged message
    once, in order, at its seq (the chaos checker's verdict over ``events``)."""
    for node in cluster.ids:
        node_status = answered_status(cluster, node)
        assert node_status["shards"]["0"]["rolled_back_committed_entries"] == 0, node_status
    consume_recorded(cluster, events, "g")
    verdict = check(events)
    assert not verdict.violations, [v.to_json() for v in verdict.violations]
    assert verdict.acked_versions == acked


def store_dir(cluster: LocalCluster, node: str) -> str:
    """The directory of ``node``'s replica of shard 0."""
    return str(Path(cluster.data_dir(node)) / "shards" / "0")
