"""A cluster the manager heals, seen from outside: producers writing with acks=all throughout
(each write recorded for the chaos checker), and the manager leader's view."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from chaos.checker import check
from chaos.history import Event as HistoryEvent
from chaos.history import Produce, Snapshot
from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.launcher import LocalCluster, http_json
from tests.support.cluster import WAIT_S, read_snapshot, wait_until

QUEUE = "healed"
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

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"producer-{self.index}")
        self.thread.start()

    def _run(self) -> None:
        with Client(self.urls, name=f"producer-{self.index}") as client:
            n = 0
            while not self.stop.is_set():
                key = f"p{self.index}-{n:05d}"
                value = f"v-{key}"
                n += 1
                op = self.index * 1_000_000 + n
                began = time.monotonic()
                try:
                    seq = client.produce(QUEUE, key, value, acks="all")
                except KayosError as exc:
                    item = ((key, value),)
                    self.history.append(
                        Produce(op, QUEUE, item, False, "all", "unknown", error=str(exc))
                    )
                    continue
                self.history.append(
                    Produce(op, QUEUE, ((key, value),), False, "all", "ok", seq, seq)
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
        code, body = http_json(cluster.manager_url(member) + "/v1/manager/status", timeout_s=2.0)
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
    return {n: s for n, s, _ in answered_view(cluster)["view"]["nodes"]}


def check_nothing_lost(
    cluster: LocalCluster, tail: str, producers: list[Producer], queue: str = QUEUE
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
