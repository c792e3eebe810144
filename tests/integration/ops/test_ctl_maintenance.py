"""``kayos ctl compact`` and ``kayos ctl check`` run as their own processes against real node
processes: compact asks every store (or one node's, one shard's) to compact and reports bytes
before and after; check compares each shard's members over their committed entries and walks every
live store, exits 0 on a healthy cluster, 1 naming a killed node, 2 when nothing answers; bad
arguments are refused with a reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.ports import free_ports
from tests.support.cluster import ctl, produce_ok, wait_until

pytestmark = pytest.mark.integration


def fill(cluster: LocalCluster) -> dict[int, int]:
    """Writes (and overwrites) keys on every shard; returns the replicated last seq per shard."""
    for shard in range(3):
        queue = next(
            q for q in (f"q{i}" for i in range(1000)) if cluster.topology.shard_for(q) == shard
        )
        head = cluster.url(cluster.head_of(queue))
        for round_no in range(4):
            produce_ok(head, queue, [(f"k{i}", f"v{round_no}-{i}" * 20) for i in range(50)])
    return cluster.wait_replicated()


def test_compact_every_store_then_one_and_refusals(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    fill(cluster)
    topology = str(cluster.topology_path)

    code, result, err = ctl("compact", "--topology", topology, "--json")
    print(json.dumps(result, indent=1))
    assert code == 0, (result, err)
    assert result["ok"] is True
    stores = {(s["node"], s["shard"]): s for s in result["stores"]}
    assert set(stores) == {(n, s) for n in "abc" for s in range(3)}
    for store in stores.values():
        assert store["state"] == "done", store
        assert store["bytes_before"] > 0
        assert store["bytes_after"] > 0
        assert store["generation"] >= 1
    assert result["bytes_before"] == sum(s["bytes_before"] for s in stores.values())

    code, text, err = ctl("compact", "--topology", topology, "--node", "b", "--shard", "1")
    assert code == 0, (text, err)
    assert "b shard 1: done" in text
    assert "1 of 1 stores compacted" in text

    code, _, err = ctl("compact", "--topology", topology, "--node", "zz")
    assert code == 1
    assert "unknown node(s) zz" in err
    code, _, err = ctl("compact", "--topology", topology, "--shard", "7")
    assert code == 1
    assert "unknown shard(s) 7" in err


def test_check_passes_then_names_a_killed_node_and_an_unreachable_cluster(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    seqs = fill(cluster)
    topology = str(cluster.topology_path)

    def clean() -> dict[str, Any] | None:
        code, result, _ = ctl("check", "--topology", topology, "--json")
        return result if code == 0 else None

    result = wait_until(clean, "ctl check to pass")
    print(json.dumps(result, indent=1))
    assert result["problems"] == []
    for shard in result["shards"]:
        compared = shard["compared"]
        assert compared is not None, shard
        assert compared["agree"] is True, shard
        assert compared["upto"] >= seqs[shard["id"]]
        assert set(compared["entries"]) == {"a", "b", "c"}
        assert min(compared["entries"].values()) >= 200  # 4 rounds of 50 keys, none dropped
        assert all(store["ok"] for store in shard["stores"].values()), shard
    code, text, _ = ctl("check", "--topology", topology)
    assert code == 0, text
    assert text.startswith("check: OK")

    cluster.kill("c")
    code, result, _ = ctl("check", "--topology", topology, "--json", "--timeout", "5")
    print(json.dumps(result["problems"], indent=1))
    assert code == 1
    found = {(p["code"], p.get("node")) for p in result["problems"]}
    assert ("node_unreachable", "c") in found
    # a and b still agree on every shard
    assert all(s["compared"]["agree"] for s in result["shards"])

    (port,) = free_ports(1)
    code, result, _ = ctl("check", "--cluster", f"http://127.0.0.1:{port}", "--json")
    assert code == 2
    assert result["problems"][0]["code"] == "cluster_unreachable"
