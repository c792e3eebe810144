"""``kayos ctl queue ...`` run as its own process against real node processes: describe shows a
queue's shards with their chains, seqs, groups' marks and retention; an unknown queue, a bad name
and a dead member are named with exit code 1."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest

import kayos
from kayos.local.cluster import LocalCluster
from tests.support.cluster import ctl

pytestmark = pytest.mark.integration

SEED = 13_031


def test_describe_a_sharded_queue_then_refusals_and_a_dead_member(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    print(f"seed={SEED}")
    cluster = start_cluster(nodes=3, replicas=3, shards=3, queue_shards={"cq": 3})
    topology = str(cluster.topology_path)
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED)) as client:
        parts = client.produce_sharded("cq", [(f"k{i}", f"v{i}") for i in range(60)])
        last = {part.shard: part.last_seq for part in parts}
        ends = {}
        for page in client.consume("cq", "readers", page_size=100):
            if page.end:
                client.commit("cq", "readers", page.boundary, shard=page.shard)
                ends[page.shard] = page.boundary
        client.set_retention("cq", {"max_age_ms": 3_600_000})

    code, result, err = ctl("queue", "describe", "cq", "--topology", topology, "--json")
    print(json.dumps(result, indent=1))
    assert code == 0, (result, err)
    assert result["known"] is True
    assert result["shard_count"] == 3
    assert result["shard_count_from"] == "queue"
    shards = {shard["id"]: shard for shard in result["shards"]}
    assert set(shards) == set(cluster.topology.shards_for("cq"))
    assert {shard["head"] for shard in shards.values()} == {"a", "b", "c"}
    for shard_id, shard in shards.items():
        assert shard["last_seq"] >= last[shard_id]
        assert shard["committed_seq"] >= last[shard_id]
        assert shard["has_entries"] is True
        assert shard["retention"]["policy"] == {"max_age_ms": 3_600_000}
        assert [m["node"] for m in shard["members"]] == shard["chain"]
        (group,) = shard["groups"]
        assert group["group"] == "readers"
        assert group["hwm"] == ends[shard_id]
        assert group["lag"] == 0
    assert result["groups"] == {"readers": {str(s): hwm for s, hwm in sorted(ends.items())}}

    code, text, err = ctl("queue", "describe", "cq", "--topology", topology)
    assert code == 0, (text, err)
    assert text.startswith("queue cq: 3 shard(s) (queue)")
    assert "group readers: mark" in text

    code, result, _ = ctl("queue", "describe", "nosuch", "--topology", topology, "--json")
    assert code == 1
    assert result["known"] is False
    assert result["problems"][0].startswith("unknown queue 'nosuch'")
    code, _, err = ctl("queue", "describe", "bad/name", "--topology", topology)
    assert code == 1
    assert "bad queue name" in err

    cluster.kill("c")
    code, result, _ = ctl(
        "queue", "describe", "cq", "--topology", topology, "--json", "--timeout", "5"
    )
    assert code == 1
    assert result["known"] is True, "the live members still answer"
    assert any(
        problem.startswith("shard ") and ": c: " in problem for problem in result["problems"]
    )
