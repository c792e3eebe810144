"""Retention on a real 3-node chain (docs/retention.md): each policy makes the head decide a floor,
every replica's file shrinks once it compacted with it, every replica then holds the same entries
(compared store against store after a clean stop), "until consumed" never drops what a group has
not read, and a consumer below the floor gets 410 retention_gap naming the floor."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.storage import ShardStore
from kayos.storage.maintenance.check import check_store
from tests.support.cluster import (
    PRODUCE_TIMEOUT_S,
    answered_status,
    commit_group,
    produce_ok,
    read_snapshot,
    wait_until,
)

pytestmark = pytest.mark.integration

VALUE = "v" * 200


def file_bytes(cluster: LocalCluster, node: str) -> int:
    with urllib.request.urlopen(f"{cluster.url(node)}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(r'^kayos_shard_file_bytes\{[^}]*shard="0"[^}]*\} (\S+)$', text, re.M)
    assert found, text
    return int(float(found.group(1)))


def set_policy(cluster: LocalCluster, queue: str, policy: dict[str, Any]) -> dict[str, Any]:
    status, reply = http_json(
        f"{cluster.url(cluster.head_of(queue))}/v1/queues/{queue}/retention",
        method="PUT",
        body=policy,
        timeout_s=PRODUCE_TIMEOUT_S,
    )
    assert status == 200, reply
    return dict(reply)


def floor_on(cluster: LocalCluster, node: str, queue: str) -> int:
    status, reply = http_json(f"{cluster.url(node)}/v1/queues/{queue}/retention")
    assert status == 200, reply
    return int(reply["floor"])


def fill(cluster: LocalCluster, queue: str, count: int, tag: str) -> tuple[int, int]:
    """``count`` messages in batches of 500; returns the first and last seq."""
    head = cluster.url(cluster.head_of(queue))
    first = last = 0
    for start in range(0, count, 500):
        batch = [(f"{tag}-{n}", f"{tag}-{n}-{VALUE}") for n in range(start, start + 500)]
        lo, last = produce_ok(head, queue, batch)
        first = first or lo
    return first, last


def wait_shrunk(cluster: LocalCluster, peak: dict[str, int], fraction: float) -> None:
    for node in cluster.ids:

        def shrank(node: str = node) -> bool:
            return file_bytes(cluster, node) < peak[node] * fraction

        wait_until(shrank, f"the store on {node} to be compacted below {fraction}", 60)


def wait_settled(cluster: LocalCluster, queue: str) -> int:
    """Waits until every replica knows the head's floor of ``queue`` and compacted with it;
    returns the floor."""

    def settled() -> int | None:
        floors = set()
        for node in cluster.ids:
            status = cluster.status(node)
            if status is None:  # no answer in time: ask again
                return None
            row = status["shards"]["0"]["retention"].get(queue)
            if row is None or row["compacted_floor"] != row["floor"]:
                return None
            floors.add(row["floor"])
        return floors.pop() if len(floors) == 1 else None

    return int(wait_until(settled, f"every replica to compact {queue} with one floor", 60))


def stores_after_stop(cluster: LocalCluster) -> dict[str, list[tuple[int, bytes, bytes | None]]]:
    """Every replica's entries of shard 0 once the cluster stopped cleanly; each store checks."""
    assert set(cluster.stop().values()) <= {0}
    out = {}
    for node in cluster.ids:
        path = str(cluster.data_dir(node) / "shards" / "0")
        with ShardStore.open(path) as store:
            out[node] = [(e.seq, e.key, e.value) for e in store.scan()]
        report = check_store(path)
        assert report.ok, (node, report.problem)
    return out


def queue_seqs(entries: list[tuple[int, bytes, bytes | None]], queue: str) -> list[int]:
    prefix = queue.encode() + b"\x00"
    return [seq for seq, key, _ in entries if key.startswith(prefix)]


def test_until_consumed_drops_what_every_group_read_and_nothing_else(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    tail = cluster.url(cluster.tails_of("work")[0])
    first, last = fill(cluster, "work", 4000, "w")
    other_first, other_last = fill(cluster, "other", 500, "o")
    # g1 read everything, g2 only the first half: the floor is g2's mark.
    half = first + 1999
    commit_group(tail, "work", "g1", last)
    commit_group(tail, "work", "g2", half)
    peak = {node: file_bytes(cluster, node) for node in cluster.ids}
    reply = set_policy(cluster, "work", {"until_consumed": True})
    assert reply["policy"] == {"until_consumed": True}
    for node in cluster.ids:
        wait_until(lambda n=node: floor_on(cluster, n, "work") == half, f"the floor on {node}")
    wait_shrunk(cluster, peak, 0.75)
    assert wait_settled(cluster, "work") == half
    # g2 still reads every message it has not consumed; the queue without a policy is whole.
    snap = read_snapshot(tail, "work", "g2")
    assert [m["seq"] for m in snap.messages] == list(range(half + 1, last + 1))
    assert len(read_snapshot(tail, "other", "x").messages) == other_last - other_first + 1
    # A group below the floor (a new one, mark 0) is told, never silently skipped.
    status, body = http_json(f"{tail}/v1/queues/work/consume?group=new")
    assert status == 410, body
    assert body["error"]["code"] == "retention_gap"
    assert body["error"]["floor"] == half
    status, page = http_json(f"{tail}/v1/queues/work/consume?group=new&after={half}")
    assert status == 200, page
    assert page["messages"][0]["seq"] == half + 1
    stores = stores_after_stop(cluster)
    entries = stores[cluster.ids[0]]
    assert all(stores[node] == entries for node in cluster.ids), "replicas differ"
    assert queue_seqs(entries, "work") == list(range(half + 1, last + 1))
    assert queue_seqs(entries, "other") == list(range(other_first, other_last + 1))


def test_max_bytes_keeps_the_queue_within_its_bound(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    """The policy is set once everything is committed, so the head counts the queue in one scan:
    buckets of 1,000 entries from the start, and one decision that is final."""
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    budget = 300_000
    first, last = fill(cluster, "logs", 6000, "l")  # ~1.3 MB of payload, 6 buckets
    peak = {node: file_bytes(cluster, node) for node in cluster.ids}
    set_policy(cluster, "logs", {"max_bytes": budget})
    floor = wait_settled(cluster, "logs")
    sizes = [len(f"logs\x00l-{n}") + len(f"l-{n}-{VALUE}") for n in range(6000)]
    buckets = [sum(sizes[i : i + 1000]) for i in range(0, 6000, 1000)]
    # Whole buckets go, oldest first, while what stays is still at least the budget.
    total, expected = sum(buckets), first - 1
    for bucket in buckets:
        if total - bucket < budget:
            break
        total -= bucket
        expected += 1000
    assert floor == expected
    wait_shrunk(cluster, peak, 0.5)
    tail = cluster.url(cluster.tails_of("logs")[0])
    status, body = http_json(f"{tail}/v1/queues/logs/consume?group=g")
    assert status == 410, body
    assert body["error"]["floor"] == floor
    stores = stores_after_stop(cluster)
    entries = stores[cluster.ids[0]]
    assert all(stores[node] == entries for node in cluster.ids), "replicas differ"
    kept = [(seq, key, value) for seq, key, value in entries if key.startswith(b"logs\x00")]
    kept_bytes = sum(len(key) + len(value or b"") for _, key, value in kept)
    assert budget <= kept_bytes <= budget + max(buckets), (kept_bytes, budget)
    assert [seq for seq, _, _ in kept] == list(range(floor + 1, last + 1))


def test_max_age_drops_old_entries_and_keeps_young_ones(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    set_policy(cluster, "ages", {"max_age_ms": 1500})
    _, old_last = fill(cluster, "ages", 2000, "old")
    peak = {node: file_bytes(cluster, node) for node in cluster.ids}
    head = cluster.url(cluster.head_of("ages"))
    ticks: list[int] = []

    def floor_passed_old() -> bool:
        # Keep writing (one message per poll) so the head's time index gets newer samples.
        ticks.append(produce_ok(head, "ages", [(f"tick-{len(ticks)}", "t")])[1])
        return all(floor_on(cluster, node, "ages") >= old_last for node in cluster.ids)

    wait_until(floor_passed_old, "the age floor to pass the old entries")
    # Keep-all again: the floor stays where it is (it never falls), so the replicas settle.
    assert set_policy(cluster, "ages", {})["policy"] is None
    floor = wait_settled(cluster, "ages")
    assert floor >= old_last
    wait_shrunk(cluster, peak, 0.5)
    stores = stores_after_stop(cluster)
    entries = stores[cluster.ids[0]]
    assert all(stores[node] == entries for node in cluster.ids), "replicas differ"
    # Everything at or below the floor went, everything above it stayed.
    assert queue_seqs(entries, "ages") == [t for t in ticks if t > floor]


def test_ctl_retention_sets_shows_and_clears_a_policy(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    """`kayos ctl retention` puts the policy at the head (asked of any node), every member shows
    it, --keep-all clears it, and a bad policy is refused with the node's error."""
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    not_head = next(node for node in cluster.ids if node != cluster.head_of("jobs"))
    runner = CliRunner()
    url = cluster.url(not_head)
    result = runner.invoke(
        cli,
        ["ctl", "retention", "jobs", "--cluster", url, "--max-bytes", "1000", "--until-consumed"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policy"] == {"max_bytes": 1000, "until_consumed": True}
    for node in cluster.ids:
        shown = runner.invoke(cli, ["ctl", "retention", "jobs", "--cluster", cluster.url(node)])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["policy"] == {"max_bytes": 1000, "until_consumed": True}
        status = answered_status(cluster, node)
        assert status["shards"]["0"]["retention"]["jobs"]["policy"] == {
            "max_bytes": 1000,
            "until_consumed": True,
        }
    cleared = runner.invoke(cli, ["ctl", "retention", "jobs", "--cluster", url, "--keep-all"])
    assert cleared.exit_code == 0, cleared.output
    assert json.loads(cleared.output)["policy"] is None
    status, body = http_json(
        f"{cluster.url(cluster.head_of('jobs'))}/v1/queues/jobs/retention",
        method="PUT",
        body={"max_age": 5},
    )
    assert status == 400, body
    assert "max_age" in body["error"]["message"]
