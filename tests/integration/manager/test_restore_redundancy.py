"""Redundancy comes back by itself (docs/manager.md rule 10), on real processes: four nodes at
replication factor 3, four shards, three manager members, producers writing with acks=all. One
node is killed -9 for good; after the grace every shard holds three replicas again with nobody
acting, the copies landing on the node that held no replica of each shard, and every acknowledged
message is consumed from the restored chains' tails. The time from the kill to full redundancy
is printed beside the grace."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.manager import Config
from tests.support.checked import (
    PRODUCER_QUEUE,
    PRODUCERS,
    Producer,
    check_nothing_lost,
    manager_view,
)
from tests.support.cluster import produce_ok, read_snapshot, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GRACE_MS = 4_000
# Short bounds so the test runs in seconds (kill -9 closes the dead node's links at once).
CONFIG = Config(detection_window_ms=2_000, suspect_after_ms=1_000, replace_after_ms=GRACE_MS)
SHARDS = 4
PREFILL = 300  # messages written to each shard before the kill: what the copies must carry
RESTORE_WAIT_S = 150.0  # generous for two shared cores; only reached by a failure


@pytest.fixture
def cluster(tmp_path: Any) -> Any:
    with LocalCluster(
        tmp_path, nodes=4, replicas=3, shards=SHARDS, managers=3, manager_config=CONFIG
    ) as c:
        print("\n".join(c.describe()))
        yield c


def queue_per_shard(cluster: LocalCluster) -> dict[int, str]:
    """A queue name that lands on each shard (``q<n>``, the first found for each)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < SHARDS:
        name = f"q{n}"
        found.setdefault(cluster.topology.shard_for(name), name)
        n += 1
    return found


def restored(cluster: LocalCluster, victim: str, seen: list[dict[str, Any]]) -> bool:
    """Every shard's chain in the leader's view holds three members, none of them ``victim``;
    each replacement the leader's status shows on the way is recorded in ``seen``."""
    status = manager_view(cluster)
    if status is None:
        return False
    for entry in status.get("restore", {}).get("restoring", []):
        if (entry["shard"], entry["target"]) not in {(s["shard"], s["target"]) for s in seen}:
            seen.append(entry)
    chains = [s["chain"] for s in status["view"]["shards"]]
    return all(len(c) == 3 and victim not in c for c in chains)


def test_a_node_killed_for_good_is_replaced_and_nothing_acked_is_lost(
    cluster: LocalCluster,
) -> None:
    queues = queue_per_shard(cluster)
    for queue in queues.values():
        for start in range(0, PREFILL, 100):
            batch = [(f"k{i}", f"v{i}-" + "x" * 200) for i in range(start, start + 100)]
            produce_ok(cluster.url(cluster.head_of(queue)), queue, batch)
    producers = [Producer(i, list(cluster.urls.values())) for i in range(PRODUCERS)]
    victim = cluster.head_of(PRODUCER_QUEUE)
    held = [s for s, chain in cluster.topology.shards.items() if victim in chain.chain]
    seen: list[dict[str, Any]] = []
    for producer in producers:
        producer.start()
    try:
        wait_until(lambda: all(len(p.acked_at) >= 20 for p in producers), "acks before")
        killed = time.monotonic()
        cluster.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: restored(cluster, victim, seen),
            f"every shard back to 3 replicas without {victim}",
            timeout_s=RESTORE_WAIT_S,
        )
        full_s = time.monotonic() - killed
        acked_at_full = sum(len(p.acked_at) for p in producers)
        wait_until(
            lambda: sum(len(p.acked_at) for p in producers) >= acked_at_full + 20,
            "acks after the restore",
        )
    finally:
        for producer in producers:
            producer.finish()
    print(
        f"kill -9 of {victim} (in shards {held}): every shard back to 3 replicas "
        f"{full_s:.2f}s after the kill (grace {GRACE_MS / 1000:.1f}s, detection window "
        f"{CONFIG.detection_window_ms / 1000:.1f}s); replacements seen: {seen}"
    )
    assert full_s >= GRACE_MS / 1000, "nothing may be copied before the grace is over"
    # The one node outside each of the victim's shards took its copy; the others kept theirs.
    final = manager_view(cluster)
    assert final is not None
    chains = {s["id"]: s["chain"] for s in final["view"]["shards"]}
    spare = {n for n in cluster.ids if n != victim}
    for shard in held:
        original = set(cluster.topology.shards[shard].chain) - {victim}
        assert set(chains[shard]) == original | (spare - original), chains
    for shard in set(chains) - set(held):
        assert chains[shard] == list(cluster.topology.shards[shard].chain), chains
    assert not final["restore"]["short"], final["restore"]

    # Every acknowledged message is consumed at the restored tails (the chaos checker for the
    # producers' queue; every prefilled key on every shard).
    check_nothing_lost(cluster, chains[cluster.topology.shard_for(PRODUCER_QUEUE)][-1], producers)
    for shard, queue in queues.items():
        tail = chains[shard][-1]
        keys = {m["key"] for m in read_snapshot(cluster.url(tail), queue, "check").messages}
        assert {f"k{i}" for i in range(PREFILL)} <= keys, (shard, tail)
