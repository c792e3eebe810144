"""The Spark source and sink on a queue over three shards (docs/node-api.md, "Queues over several
shards"): a batch read has every shard's rows, a streaming query's offsets name every shard and
its consumer group commits one mark per shard, the sink writes to every shard of its queue."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from kayos.client import Client
from kayos.local.cluster import LocalCluster
from tests.support.spark import endpoints

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.spark

SOURCE, SINK = "sp-sharded", "sp-sharded-out"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("spark-queue-shards"),
        nodes=3,
        replicas=3,
        shards=3,
        queue_shards={SOURCE: 3, SINK: 3},
    )
    local.start_all()
    yield local
    local.stop()


def _rows(count: int, stem: str) -> list[tuple[str, str]]:
    return [(f"{stem}{i:05d}", f"v{i}") for i in range(count)]


def _all_keys(client: Client, queue: str) -> dict[bytes, int]:
    """Every live key of the queue with the shard it came from (a fresh group reads them all)."""
    return {
        message.key: page.shard
        for page in client.consume(queue, "audit-" + queue, page_size=10_000)
        for message in page.messages
    }


def test_a_batch_read_has_every_shards_rows(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    rows = _rows(600, "batch-")
    client.produce_sharded(SOURCE, rows)
    frame = (
        spark.read.format("kayos")
        .option("kayos.endpoints", endpoints(cluster))
        .option("queue", SOURCE)
        .load()
    )
    got = frame.select("key", "value", "shard").collect()
    assert len(got) == 600
    assert {row.shard for row in got} == set(client.topology.shards_for(SOURCE))
    for row in got:
        assert row.shard == client.topology.shard_for_key(SOURCE, bytes(row.key))
    assert {(bytes(r.key).decode(), bytes(r.value).decode()) for r in got} == set(rows)


def test_a_stream_commits_one_mark_per_shard_and_its_sink_spreads(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    rows = _rows(300, "stream-")
    client.produce_sharded(SOURCE, rows)
    query = (
        spark.readStream.format("kayos")
        .option("kayos.endpoints", endpoints(cluster))
        .option("queue", SOURCE)
        .option("startingOffsets", "earliest")
        .option("maxRowsPerTrigger", "100")
        .option("consumerGroup", "etl")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("kayos")
        .option("kayos.endpoints", endpoints(cluster))
        .option("queue", SINK)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress]
    shards = client.topology.shards_for(SOURCE)
    assert sorted(int(shard) for shard in ends[-1][SOURCE]) == sorted(shards)
    # commit() runs one batch late: each shard's mark is the second-to-last batch's end there.
    assert client.marks(SOURCE, "etl") == {int(s): seq for s, seq in ends[-2][SOURCE].items()}
    written = _all_keys(client, SINK)
    source_keys = set(_all_keys(client, SOURCE))
    assert set(written) == source_keys, "every source row landed once in the sink"
    assert set(written.values()) == set(client.topology.shards_for(SINK))
