"""A store cut short by truncation (the chaos fault ``corrupt_down``'s ``truncate``) must not come
back as a full member (docs/campaigns.md, Findings): real ``kayos node`` processes a -> b -> c. The
tail is killed with -9 after its durable mark was written, its data file is cut to a ninth with the
chaos fault's own function, so its recovery finds an older valid header and only a few torn bytes.
On restart it must see it lost entries (its durable mark), repair from its upstream, and report
it; every acknowledged message is served from every tail and no seq is ever reused."""

from __future__ import annotations

import random
import signal
from pathlib import Path
from typing import Any

import pytest

from chaos.history import Event
from chaos.procs.membership import damage_stores
from kayos.replication.logic import durablemark
from tests.support.checked import BATCH, BATCHES, assert_nothing_lost, produce_recorded, store_dir
from tests.support.cluster import wait_until

pytestmark = pytest.mark.integration


class _CutToANinth(random.Random):
    """Makes ``damage_stores`` cut each file to a ninth of its size (a deep cut that still leaves
    an older valid header, the case recovery alone cannot tell from a torn commit)."""

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:  # type: ignore[override]
        assert stop is not None
        return max(start, stop // 9)


def test_truncated_tail_repairs_before_it_counts(start_cluster: Any) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    assert cluster.topology.shards[0].chain == ("a", "b", "c")
    events: list[Event] = []
    produce_recorded(cluster, events, "before", BATCHES)
    total = cluster.wait_replicated()[0]
    path = store_dir(cluster, "c")
    wait_until(lambda: durablemark.read(path) >= total, "c's durable mark reaching the commit")

    cluster.kill("c", signal.SIGKILL)
    done = damage_stores(Path(cluster.data_dir("c")), _CutToANinth(), "truncate")
    print(f"truncated: {done}")
    assert done
    assert done[0]["truncated_to"] < done[0]["was"] // 2
    cluster.start("c")

    def repaired() -> dict[str, Any] | None:
        found = cluster.status("c")
        replica = found["shards"].get("0") if found else None
        if replica and replica["repair"] and replica["repair"]["state"] == "repaired":
            return dict(replica)
        return None

    replica = wait_until(repaired, "c to report the cut and repair it")
    print(f"c after the truncation: {replica}")
    assert "durable mark" in replica["repair"]["problem"], replica
    assert replica["refetched_entries"] > 0, replica
    assert cluster.wait_replicated(60)[0] >= total

    produce_recorded(cluster, events, "after", 2)
    cluster.wait_replicated(60)
    assert_nothing_lost(cluster, events, (BATCHES + 2) * BATCH)
