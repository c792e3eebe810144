"""The kayos Spark source against a real 3-node, 3-shard cluster (issue 14's acceptance list)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kayos.client import Client
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from tests.support.spark import endpoints, produce_rows, queue_on_shard, read_all, wait_until

pytestmark = pytest.mark.spark


def _reader(spark: Any, cluster: LocalCluster, queue: str, **options: str) -> Any:
    reader = spark.read.format("kayos").option("kayos.endpoints", endpoints(cluster))
    for name, value in {"queue": queue, **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def _stream(spark: Any, cluster: LocalCluster, queue: str, **options: str) -> Any:
    reader = spark.readStream.format("kayos").option("kayos.endpoints", endpoints(cluster))
    for name, value in {"queue": queue, "startingOffsets": "earliest", **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def _kayos_sink(frame: Any, cluster: LocalCluster, queue: str, checkpoint: Path) -> Any:
    return (
        frame.selectExpr("key", "value")
        .writeStream.format("kayos")
        .option("kayos.endpoints", endpoints(cluster))
        .option("queue", queue)
        .option("checkpointLocation", str(checkpoint))
    )


def _rows(count: int, stem: str = "k") -> list[tuple[str, str | None]]:
    return [(f"{stem}{i:07d}", f"v{i}") for i in range(count)]


def test_batch_read_of_every_shard(spark: Any, cluster: LocalCluster, client: Client) -> None:
    for shard in range(3):
        queue = queue_on_shard(cluster, shard, "batch")
        produce_rows(client, queue, _rows(700 + shard))
        frame = _reader(spark, cluster, queue)
        got = frame.select("key", "value", "queue", "shard", "seq").collect()
        assert len(got) == 700 + shard
        assert {row.queue for row in got} == {queue}
        assert {row.shard for row in got} == {shard}
        expected = {(k.encode(), v.encode()) for k, v in _rows(700 + shard)}  # type: ignore[union-attr]
        assert {(bytes(row.key), bytes(row.value)) for row in got} == expected
        # The same with more partitions than shards: split seq ranges, nothing lost or doubled.
        split = _reader(spark, cluster, queue, minPartitions="4")
        assert split.rdd.getNumPartitions() >= 4
        assert sorted(r.seq for r in split.select("seq").collect()) == sorted(r.seq for r in got)


def test_batch_read_between_offsets(spark: Any, cluster: LocalCluster, client: Client) -> None:
    queue = queue_on_shard(cluster, 1, "ranged")
    last = produce_rows(client, queue, _rows(100))
    shard = cluster.topology.shard_for(queue)
    start, end = last - 60, last - 10
    frame = _reader(
        spark,
        cluster,
        queue,
        startingOffsets=f'{{"{queue}": {{"{shard}": {start}}}}}',
        endingOffsets=f'{{"{queue}": {{"{shard}": {end}}}}}',
    )
    assert sorted(r.seq for r in frame.select("seq").collect()) == list(range(start + 1, end + 1))


def test_dedup_keys_appear_once_with_latest_value(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    queue = queue_on_shard(cluster, 2, "dedup")
    produce_rows(client, queue, [("a", "1"), ("b", "1"), ("c", "1")])
    produce_rows(client, queue, [("a", "2"), ("b", None)])
    produce_rows(client, queue, [("a", "3")])
    got = {bytes(r.key): r.value for r in _reader(spark, cluster, queue).collect()}
    assert got == {b"a": bytearray(b"3"), b"b": None, b"c": bytearray(b"1")}


def test_stream_max_rows_per_trigger_batches(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 0, "trigger")
    out = queue_on_shard(cluster, 1, "trigger-out")
    produce_rows(client, queue, _rows(1000))
    query = (
        _kayos_sink(_stream(spark, cluster, queue, maxRowsPerTrigger="250"), cluster, out, tmp_path)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    counts = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert counts == [250, 250, 250, 250]
    assert sorted(k for k, _v, _s in read_all(client, out)) == sorted(
        k.encode() for k, _v in _rows(1000)
    )
    # Lag is visible: the latest offset the source reported against the batch's end.
    last = query.recentProgress[-1]["sources"][0]
    assert last["latestOffset"] is not None


def test_available_now_stops_at_the_snapshot_taken_at_start(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 2, "avail")
    out = queue_on_shard(cluster, 0, "avail-out")
    produce_rows(client, queue, _rows(1000, "first"))
    frame = _stream(spark, cluster, queue, maxRowsPerTrigger="100")
    query = _kayos_sink(frame, cluster, out, tmp_path).trigger(availableNow=True).start()
    # The snapshot was taken before batch 0 ran: rows produced once it is done come after it.
    wait_until(lambda: query.recentProgress or not query.isActive, "the first micro-batch")
    produce_rows(client, queue, _rows(200, "late"))
    assert query.isActive, "the query ended before the late rows came: nothing was shown"
    assert query.awaitTermination(180)
    keys = {k for k, _v, _s in read_all(client, out)}
    assert keys == {k.encode() for k, _v in _rows(1000, "first")}  # and none of the late rows
    assert [p["numInputRows"] for p in query.recentProgress] == [100] * 10


def test_restart_from_checkpoint_reads_each_row_once(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 1, "restart")
    out = queue_on_shard(cluster, 2, "restart-out")
    checkpoint = tmp_path / "checkpoint"
    produced = 0
    seqs_seen: list[list[int]] = []
    for run in range(3):
        produce_rows(client, queue, _rows(400, f"r{run}-"))
        produced += 400
        frame = _stream(spark, cluster, queue, maxRowsPerTrigger="150")
        query = _kayos_sink(frame, cluster, out, checkpoint).trigger(availableNow=True).start()
        # Producers keep writing while the query runs; those rows belong to the next run.
        extra = _rows(50, f"during{run}-")
        produce_rows(client, queue, extra)
        produced += 50
        assert query.awaitTermination(180)
        seqs_seen.append([p["numInputRows"] for p in query.recentProgress])
    final = _stream(spark, cluster, queue)
    query = _kayos_sink(final, cluster, out, checkpoint).trigger(availableNow=True).start()
    assert query.awaitTermination(180)
    total_read = sum(sum(run) for run in seqs_seen) + sum(
        p["numInputRows"] for p in query.recentProgress
    )
    assert total_read == produced, seqs_seen  # no row twice, none missed
    assert len(read_all(client, out)) == produced


def test_batch_write_lands_with_acks_all(spark: Any, cluster: LocalCluster, client: Client) -> None:
    queue = queue_on_shard(cluster, 0, "bwrite")
    frame = spark.createDataFrame(
        [(f"w{i:05d}", f"value {i}") for i in range(3000)], "key string, value string"
    ).repartition(3)
    frame.write.format("kayos").option("kayos.endpoints", endpoints(cluster)).option(
        "queue", queue
    ).option("acks", "all").mode("append").save()
    # acks=all: committed on every member, so every tail shows it at once (no wait).
    got = read_all(client, queue)
    assert sorted(k for k, _v, _s in got) == [f"w{i:05d}".encode() for i in range(3000)]
    assert {v for _k, v, _s in got} == {f"value {i}".encode() for i in range(3000)}


def test_replayed_stream_batch_is_not_written_twice(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 2, "replay")
    out = queue_on_shard(cluster, 1, "replay-out")
    checkpoint = tmp_path / "checkpoint"
    produce_rows(client, queue, _rows(500))
    frame = _stream(spark, cluster, queue, maxRowsPerTrigger="250")
    query = _kayos_sink(frame, cluster, out, checkpoint).trigger(availableNow=True).start()
    assert query.awaitTermination(180)
    before = read_all(client, out)
    assert len(before) == 500
    # A crash after the sink committed batch 1 but before Spark recorded it: drop commits/1.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits == [0, 1]
    (checkpoint / "commits" / "1").unlink()
    shutil.rmtree(checkpoint / "commits" / ".1.crc", ignore_errors=True)
    crc = checkpoint / "commits" / ".1.crc"
    if crc.exists():
        crc.unlink()
    again = _stream(spark, cluster, queue, maxRowsPerTrigger="250")
    query = _kayos_sink(again, cluster, out, checkpoint).trigger(availableNow=True).start()
    assert query.awaitTermination(180)
    replayed = [p for p in query.recentProgress if p["batchId"] == 1]
    assert replayed
    assert replayed[0]["numInputRows"] == 250
    after = read_all(client, out)
    assert after == before  # same entries, same seqs: nothing written twice


def test_tail_killed_during_streaming_query(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 0, "failover")
    out = queue_on_shard(cluster, 1, "failover-out")
    tail = cluster.tails_of(queue)[0]
    produce_rows(client, queue, _rows(2000))
    frame = _stream(spark, cluster, queue, maxRowsPerTrigger="200", **{"kayos.retries": "40"})
    query = _kayos_sink(frame, cluster, out, tmp_path).trigger(processingTime="0 seconds").start()
    try:
        wait_until(
            lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 400,
            "two batches before the kill",
        )
        cluster.kill(tail)
        cluster.start(tail)
        produce_rows(client, queue, _rows(500, "after-"))
        wait_until(
            lambda: (
                sum(p["numInputRows"] for p in query.recentProgress) >= 2500 or not query.isActive
            ),
            "every row through the query",
        )
        assert query.isActive, query.exception()
    finally:
        query.stop()
    keys = sorted(k for k, _v, _s in read_all(client, out))
    expected = sorted(k.encode() for k, _v in _rows(2000) + _rows(500, "after-"))
    assert keys == expected  # no row lost
    total = sum(p["numInputRows"] for p in query.recentProgress)
    assert total == 2500  # and none read twice


def test_resume_past_the_shard_is_data_loss(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 1, "loss")
    last = produce_rows(client, queue, _rows(10))
    shard = cluster.topology.shard_for(queue)
    beyond = f'{{"{queue}": {{"{shard}": {last + 10_000_000}}}}}'
    frame = _stream(spark, cluster, queue, startingOffsets=beyond, **{"kayos.timeoutS": "5"})
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"DataLossError|committed only through"):
        query.awaitTermination(180)


def test_bad_options_are_clear_errors(spark: Any, cluster: LocalCluster) -> None:
    with pytest.raises(Exception, match="startingOffsets"):
        _reader(spark, cluster, "q", startingOffsets="yesterday").collect()
    with pytest.raises(Exception, match="queue is required"):
        spark.read.format("kayos").option("kayos.endpoints", endpoints(cluster)).load()
    with pytest.raises(Exception, match="maxRowsPerTrigger"):
        _stream(spark, cluster, "q", maxRowsPerTrigger="lots").writeStream.format("noop").start()
    assert issubclass(KayosError, Exception)


def test_consumer_group_follows_the_checkpoint(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    queue = queue_on_shard(cluster, 0, "grouped")
    out = queue_on_shard(cluster, 2, "grouped-out")
    produce_rows(client, queue, _rows(300))
    options = {"maxRowsPerTrigger": "100", "consumerGroup": "etl"}
    checkpoint = tmp_path / "checkpoint"
    query = (
        _kayos_sink(_stream(spark, cluster, queue, **options), cluster, out, checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress]
    shard = str(cluster.topology.shard_for(queue))
    # commit() runs one batch late: the group holds the second-to-last batch's end (advisory).
    hwm = client.group(queue, "etl").hwm
    assert hwm == ends[-2][queue][shard]
    # A new query (no checkpoint) can start from the group's mark.
    produce_rows(client, queue, _rows(50, "new-"))
    fresh = _stream(spark, cluster, queue, startingOffsets="committed", consumerGroup="etl")
    got = {bytes(r.key) for r in _collect_available(fresh, tmp_path / "fresh")}
    assert {k.encode() for k, _v in _rows(50, "new-")} <= got
    assert len(got) == 100 + 50  # the last batch's rows (not committed yet) and the new ones


def _collect_available(frame: Any, checkpoint: Path) -> list[Any]:
    name = f"collected_{checkpoint.name.replace('-', '_')}"
    query = (
        frame.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    return list(frame.sparkSession.table(name).collect())


def test_headers_column_and_writes_by_queue_column(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    queue = queue_on_shard(cluster, 1, "headers")
    client.produce(queue, "h1", "v", headers={"trace": b"abc"})
    client.produce(queue, "h2", "v")
    rows = {
        bytes(r.key): r.headers
        for r in _reader(spark, cluster, queue, includeHeaders="true").collect()
    }
    assert rows == {b"h1": {"trace": bytearray(b"abc")}, b"h2": None}
    # Rows carrying a queue column go to that queue (grouped by queue, so by shard).
    targets = [queue_on_shard(cluster, shard, "routed") for shard in range(3)]
    frame = spark.createDataFrame(
        [(f"r{i}", "x", targets[i % 3]) for i in range(90)],
        "key string, value string, queue string",
    )
    frame.write.format("kayos").option("kayos.endpoints", endpoints(cluster)).option(
        "queue", targets[0]
    ).mode("append").save()
    for n, target in enumerate(targets):
        keys = {k for k, _v, _s in read_all(client, target)}
        assert keys == {f"r{i}".encode() for i in range(90) if i % 3 == n}


def test_a_null_key_is_a_clear_error_and_writes_nothing(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    queue = queue_on_shard(cluster, 2, "nullkey")
    # One task: its rows are checked before any is sent (tasks are not atomic with each other).
    frame = spark.createDataFrame([("a", "1"), (None, "2")], "key string, value string").coalesce(1)
    with pytest.raises(Exception, match="key is null"):
        frame.write.format("kayos").option("kayos.endpoints", endpoints(cluster)).option(
            "queue", queue
        ).mode("append").save()
    assert read_all(client, queue) == []
