"""A head whose store was cut short only past its last durable-mark write must not lead with it
(docs/campaigns.md, Findings, "a store cut short by truncation became head"; docs/replication-
protocol.md, "An upstream that lacks committed entries"): real ``kayos node`` processes a -> b -> c.

Made deterministic: the head's data file is append-only, so its size once ``total1`` entries are
durable there (and nothing is written meanwhile) ends a whole header. After ``total2`` more are
committed, a is killed with -9, its file is cut back to that size (nothing torn: recovery cuts no
byte) and its durable mark is set to ``total1`` (the mark is written now and then, not on the
commit path: the cut removed only what came after its last write). Nothing on a's own disk says
it lost anything; b's ``SUBSCRIBE`` names the commit point b knows, so a sees it and re-fetches
from b before it leads. Every acks=all message is then served from every tail and no seq is
reused with another value (the chaos checker's verdict over the recorded history). In the second
case the cut head takes acks=1 writes before b comes back (seqs b holds with committed values):
it drops them, and only them, before it repairs."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from chaos.history import Event
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.replication.logic import durablemark
from kayos.signing import sign
from kayos.storage.maintenance.check import data_file_of
from tests.support.checked import (
    BATCH,
    RECORDED_QUEUE,
    assert_nothing_lost,
    produce_recorded,
    store_dir,
)
from tests.support.cluster import produce, read_snapshot, wait_until

pytestmark = pytest.mark.integration

BEFORE = 10
CUT_AWAY = 10
AFTER = 2


def _commit_in_two_parts(cluster: LocalCluster, events: list[Event]) -> tuple[int, int, int]:
    """Commits ``BEFORE`` batches, notes a's file size once its mark holds them, commits
    ``CUT_AWAY`` more. Returns (total1, total2, a's file size at total1)."""
    produce_recorded(cluster, events, "before", BEFORE)
    total1 = cluster.wait_replicated()[0]
    path = store_dir(cluster, "a")
    wait_until(lambda: durablemark.read(path) >= total1, "a's durable mark reaching the commit")
    size1 = os.path.getsize(data_file_of(path))
    produce_recorded(cluster, events, "cut-away", CUT_AWAY)
    total2 = cluster.wait_replicated()[0]
    assert total2 > total1
    return total1, total2, size1


def _cut_head_past_its_mark(cluster: LocalCluster, events: list[Event]) -> tuple[int, int]:
    """Commits in two parts, kills a and cuts its file and mark back to the first part.
    Returns (total1, total2)."""
    total1, total2, size1 = _commit_in_two_parts(cluster, events)
    path = store_dir(cluster, "a")
    data_path = data_file_of(path)

    def b_knows_total2() -> bool:
        found = cluster.status("b")
        return bool(found) and found["shards"]["0"]["committed_seq"] >= total2

    wait_until(b_knows_total2, "b knowing the commit point")
    cluster.kill("a", signal.SIGKILL)
    assert os.path.getsize(data_path) > size1
    os.truncate(data_path, size1)
    durablemark.write(path, total1)
    print(f"a cut back from seq {total2} to {total1} ({size1} bytes), its mark at {total1}")
    return total1, total2


def _repaired(cluster: LocalCluster) -> dict[str, Any] | None:
    found = cluster.status("a")
    replica = found["shards"].get("0") if found else None
    if replica and replica["repair"] and replica["repair"]["state"] == "repaired":
        return dict(replica)
    return None


def test_a_head_cut_past_its_durable_mark_refetches_before_it_leads(start_cluster: Any) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    assert cluster.topology.shards[0].chain == ("a", "b", "c")
    events: list[Event] = []
    total1, total2 = _cut_head_past_its_mark(cluster, events)
    cluster.start("a")

    replica = wait_until(lambda: _repaired(cluster), "a to find the cut and repair it")
    print(f"a after the cut: {replica}")
    assert f"below its durable mark {total2}" in replica["repair"]["problem"], replica
    assert replica["refetched_entries"] >= total2 - total1, replica
    assert cluster.wait_replicated(60)[0] >= total2

    produce_recorded(cluster, events, "after", AFTER)
    cluster.wait_replicated(60)
    assert_nothing_lost(cluster, events, (BEFORE + CUT_AWAY + AFTER) * BATCH)


def test_a_cut_head_drops_what_it_took_before_its_downstream_returned(start_cluster: Any) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    events: list[Event] = []
    total1, total2 = _cut_head_past_its_mark(cluster, events)

    def b_persisted_total2() -> bool:
        found = cluster.status("b")
        return bool(found) and found["shards"]["0"]["commit_point_persisted"] >= total2

    # b comes back only after a took writes at its cut seqs, knowing the commit point it wrote
    # down before it stopped.
    wait_until(b_persisted_total2, "b writing the commit point down")
    cluster.kill("b", signal.SIGKILL)
    cluster.start("a")
    items = [(f"acks1-{i}", f"stray-{i}") for i in range(BATCH)]
    status, reply = produce(cluster.url("a"), RECORDED_QUEUE, items, acks="1")
    assert status == 200, reply
    print(f"a took acks=1 writes at {reply['first_seq']}..{reply['last_seq']}")
    assert reply["first_seq"] == total1 + 1, reply  # seqs b holds with committed values

    cluster.start("b")
    replica = wait_until(lambda: _repaired(cluster), "a to find the cut and repair it")
    print(f"a after the cut: {replica}")
    assert f"below its durable mark {total2}" in replica["repair"]["problem"], replica
    log = cluster.log_path("a").read_text(errors="replace")
    assert "it lost committed entries" in log
    assert cluster.wait_replicated(60)[0] >= total2

    produce_recorded(cluster, events, "after", AFTER)
    cluster.wait_replicated(60)
    # Every acks=all message is served at its seq; the stray acks=1 writes are gone (never
    # committed: their seqs were committed with other values).
    assert_nothing_lost(cluster, events, (BEFORE + CUT_AWAY + AFTER) * BATCH)
    for tail in cluster.tails_of(RECORDED_QUEUE):
        served = read_snapshot(cluster.url(tail), RECORDED_QUEUE, "strays", limit=5000).messages
        assert served
        assert not [m for m in served if m["key"].startswith("acks1-")]


@pytest.mark.parametrize("mark", ["below", "past"])
def test_a_head_alone_refetches_from_a_learner_before_it_leads(
    start_cluster: Any, mark: str
) -> None:
    """Shard 0 is a alone (a chain of one: the manager spliced the others out), b a learner of
    it. a's store is cut back from ``total2`` to ``total1``: with its mark left at ``total2``
    (``below``: a finds the cut itself on open) or set to ``total1`` (``past``: only b's
    SUBSCRIBE shows it). a has no member to re-fetch from: it must re-fetch from b's learner
    before it leads, never take writes at seqs b holds with committed values (campaign seed
    1115409774: such a head led at once with the short log)."""
    cluster = start_cluster(nodes=2, replicas=1, shards=1)
    assert cluster.topology.shards[0].chain == ("a",)
    events: list[Event] = []
    total1, total2, size1 = _commit_in_two_parts(cluster, events)
    path = store_dir(cluster, "a")
    data_path = data_file_of(path)
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "a"}
    assert cluster.identity is not None
    signed = {"body": body, "mac": sign(cluster.identity, "catch-up", body)}
    code, reply = http_json(f"{cluster.url('b')}/v1/admin/catch-up", method="POST", body=signed)
    assert code == 200, reply

    def learned() -> bool:
        found = cluster.status("b")
        shard = found["shards"].get("0") if found else None
        return bool(shard) and shard["durable_seq"] == total2 and shard["committed_seq"] == total2

    wait_until(learned, "b's learner holding and knowing every committed seq")
    wait_until(lambda: durablemark.read(path) >= total2, "a's durable mark reaching the commit")
    cluster.kill("a", signal.SIGKILL)
    os.truncate(data_path, size1)
    if mark == "past":
        durablemark.write(path, total1)
    print(f"a cut back from seq {total2} to {total1}, its mark at {durablemark.read(path)}")
    cluster.start("a")

    replica = wait_until(lambda: _repaired(cluster), "a to repair from b's learner", 60)
    print(f"a after the cut: {replica}")
    assert replica["last_seq"] >= total2, replica
    assert f"below its durable mark {total2}" in replica["repair"]["problem"], replica
    produce_recorded(cluster, events, "after", AFTER)
    assert events[-1].first_seq > total2, events[-1]  # type: ignore[union-attr]
    cluster.wait_replicated(60)
    assert_nothing_lost(cluster, events, (BEFORE + CUT_AWAY + AFTER) * BATCH)
