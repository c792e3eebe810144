"""The Spark source's timestamp column against a real cluster (docs/spark.md, "The timestamp
column"): batch and streaming reads fill it from the tail's time index, never null for entries
produced while the cluster ran, and each within the documented precision of its produce: not
after the acks=all answer, not more than one sampling interval before the request."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.client import Client
from kayos.local.cluster import LocalCluster
from tests.support.spark import endpoints, produce_rows, queue_on_shard, wait_until

pytestmark = pytest.mark.spark

INTERVAL_US = limits.time_index_interval_ms * 1000


def produce_timed(client: Client, queue: str, stem: str, count: int) -> tuple[int, int]:
    """Produces ``count`` rows keyed ``<stem>-<i>`` with acks=all; the wall-clock window in unix
    microseconds from before the request to after its answer."""
    before = time.time()
    produce_rows(client, queue, [(f"{stem}-{i}", "v") for i in range(count)])
    return int(before * 1_000_000), int(time.time() * 1_000_000)


def two_timed_batches(client: Client, queue: str) -> dict[str, tuple[int, int]]:
    """Batches ``a`` and ``b`` at least one sampling interval apart, so the tail samples each."""
    windows = {"a": produce_timed(client, queue, "a", 300)}
    after_a = windows["a"][1] / 1_000_000
    wait_until(lambda: time.time() >= after_a + INTERVAL_US / 1_000_000 + 0.05, "one interval")
    windows["b"] = produce_timed(client, queue, "b", 200)
    return windows


def check_stamps(rows: list[Any], windows: dict[str, tuple[int, int]]) -> None:
    assert len(rows) == 500
    for row in rows:
        before, after = windows[bytes(row.key).decode().split("-")[0]]
        assert row.us is not None, row
        assert before - INTERVAL_US < row.us <= after, (row, before, after)
    # The two batches fell in different intervals: their times differ by at least one.
    a = {row.us for row in rows if bytes(row.key).startswith(b"a-")}
    b = {row.us for row in rows if bytes(row.key).startswith(b"b-")}
    assert min(b) - max(a) >= INTERVAL_US, (a, b)


def test_batch_read_fills_the_timestamp_within_one_interval_of_the_produce(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    queue = queue_on_shard(cluster, 2, "stamped")
    windows = two_timed_batches(client, queue)
    frame = (
        spark.read.format("kayos")
        .option("kayos.cluster", endpoints(cluster))
        .option("queue", queue)
        .load()
    )
    assert frame.schema["timestamp"].dataType.typeName() == "timestamp"
    check_stamps(frame.selectExpr("key", "unix_micros(timestamp) AS us").collect(), windows)


def test_streaming_read_fills_the_timestamp_too(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 0, "stamped-stream")
    windows = two_timed_batches(client, queue)
    query = (
        spark.readStream.format("kayos")
        .option("kayos.cluster", endpoints(cluster))
        .option("queue", queue)
        .option("startingOffsets", "earliest")
        .option("maxRowsPerTrigger", "200")
        .load()
        .selectExpr("key", "unix_micros(timestamp) AS us")
        .writeStream.format("memory")
        .queryName("stamped_stream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    check_stamps(spark.sql("SELECT key, us FROM stamped_stream").collect(), windows)
