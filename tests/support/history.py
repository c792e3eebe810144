"""Writes and snapshots on a real 3-node chain recorded as a chaos history, and the checker's
verdict that nothing acknowledged was lost."""

from __future__ import annotations

import itertools
from pathlib import Path

from chaos.checker import check
from chaos.history import Event, Produce, Snapshot
from kayos.launcher import LocalCluster
from tests.support.cluster import answered_status, produce_ok, read_snapshot

QUEUE = "q"
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
        first, last = produce_ok(cluster.url(cluster.head_of(QUEUE)), QUEUE, list(items))
        events.append(
            Produce(
                invoked,
                QUEUE,
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
    """A snapshot of ``group`` read at every tail of ``QUEUE``, each recorded in ``events``."""
    for tail in cluster.tails_of(QUEUE):
        invoked = next(_ops)
        snap = read_snapshot(cluster.url(tail), QUEUE, group, limit=5000)
        events.append(
            Snapshot(
                invoked,
                QUEUE,
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
