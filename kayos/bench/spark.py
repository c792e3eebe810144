"""``kayos bench spark``: the Spark source's rows/s against the plain client's, in one run.

Workload (issue 14's): a LocalCluster of 3 node processes, 3 shards, replication factor 3, fsync
on; a ``local[2]`` SparkSession on the same machine. One queue of ``rows`` messages with unique
keys and ``value_bytes``-byte values, written by Spark itself.

Figures (rows/s over each phase's wall time):
- ``write_rows_per_s``: a batch write of the rows (``spark.range`` -> key, value) through the
  source's writer, acks=all.
- ``client_read_rows_per_s``: the plain client (``Client.consume``, pipelined pages of 10,000)
  reading the whole queue in this process: the reference.
- ``batch_read_rows_per_s``: ``spark.read.format("kayos")`` of the whole queue, every value's
  length summed (so every row is moved into Spark), ``minPartitions`` sub-ranges.
- ``stream_read_rows_per_s``: ``readStream`` with ``trigger(availableNow=True)`` into the
  ``noop`` sink, from earliest, ``maxRowsPerTrigger`` per micro-batch.
- ``spark_floor_rows_per_s``: the same batch read of a source that yields one pre-built Arrow
  batch of the same shape again and again (kayos/bench/spark_floor.py): what Spark itself costs.
- ``batch_read_vs_client``, ``stream_read_vs_client``: the ratios to the client's figure;
  ``batch_read_vs_floor``: the batch read against Spark's own floor.
The session start and the first job (JVM and Python workers warming up) run before timing, on
a small warm-up queue.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kayos.bench.produce import machine_facts
from kayos.client.sync import Client
from kayos.local.cluster import LocalCluster

BENCH_QUEUE = "bench-spark"
WARMUP_QUEUE = "bench-spark-warmup"


@dataclass(frozen=True, slots=True)
class SparkBenchParameters:
    rows: int = 1_000_000
    value_bytes: int = 100
    min_partitions: int = 2
    max_rows_per_trigger: int = 250_000

    def __post_init__(self) -> None:
        if self.rows < 1 or self.value_bytes < 1 or self.min_partitions < 1:
            raise ValueError("rows, value_bytes and min_partitions must be >= 1")
        if self.max_rows_per_trigger < 1:
            raise ValueError("max_rows_per_trigger must be >= 1")


def _session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import kayos.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kayos-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    kayos.spark.register(session)
    return session


def _write(spark: Any, endpoints: str, queue: str, rows: int, value_bytes: int) -> float:
    frame = spark.range(rows).selectExpr(
        "concat('k', lpad(cast(id as string), 12, '0')) as key",
        f"rpad(cast(id as string), {value_bytes}, 'x') as value",
    )
    began = time.perf_counter()
    frame.write.format("kayos").option("kayos.endpoints", endpoints).option("queue", queue).option(
        "acks", "all"
    ).mode("append").save()
    return time.perf_counter() - began


def _batch_read(spark: Any, endpoints: str, queue: str, min_partitions: int) -> tuple[int, float]:
    began = time.perf_counter()
    frame = (
        spark.read.format("kayos")
        .option("kayos.endpoints", endpoints)
        .option("queue", queue)
        .option("minPartitions", str(min_partitions))
        .load()
    )
    row = frame.selectExpr("count(*) as n", "sum(length(value)) as bytes").collect()[0]
    return int(row["n"]), time.perf_counter() - began


def _floor_read(spark: Any, parameters: SparkBenchParameters) -> tuple[int, float]:
    began = time.perf_counter()
    frame = (
        spark.read.format("kayos-bench-floor")
        .option("rows", str(parameters.rows))
        .option("partitions", str(parameters.min_partitions))
        .option("value_bytes", str(parameters.value_bytes))
        .load()
    )
    row = frame.selectExpr("count(*) as n", "sum(length(value)) as bytes").collect()[0]
    return int(row["n"]), time.perf_counter() - began


def _stream_read(
    spark: Any, endpoints: str, queue: str, parameters: SparkBenchParameters, checkpoint: str
) -> tuple[int, float]:
    began = time.perf_counter()
    query = (
        spark.readStream.format("kayos")
        .option("kayos.endpoints", endpoints)
        .option("queue", queue)
        .option("startingOffsets", "earliest")
        .option("maxRowsPerTrigger", str(parameters.max_rows_per_trigger))
        .option("minPartitions", str(parameters.min_partitions))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    return sum(int(p["numInputRows"]) for p in query.recentProgress), elapsed


def _client_read(urls: list[str], queue: str) -> tuple[int, float]:
    with Client(urls, name="kayos-bench") as client:
        began = time.perf_counter()
        count = 0
        total_bytes = 0
        for page in client.consume(queue, "bench-client-reader", page_size=10_000):
            count += len(page)
            total_bytes += sum(len(v or b"") for v in page.columns.values)
        return count, time.perf_counter() - began


def bench_spark(
    parameters: SparkBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Starts a 3-node, 3-shard LocalCluster under ``base`` (a temporary directory if None)
    and a local[2] SparkSession, runs the phases, stops both and returns the figures; ``phase``
    is told each phase's name as it begins (a progress display)."""
    root = tempfile.mkdtemp(prefix="kayos-bench-spark-", dir=base)
    cluster = LocalCluster(os.path.join(root, "cluster"), nodes=3, replicas=3, shards=3)
    spark = None
    try:
        phase("starting 3 nodes")
        cluster.start_all()
        urls = list(cluster.urls.values())
        endpoints = ",".join(urls)
        phase("starting Spark (local[2]) and warming up")
        spark = _session()
        # Warm-up: the JVM, the Python workers and the source's planning, on a small queue.
        _write(spark, endpoints, WARMUP_QUEUE, 1000, parameters.value_bytes)
        _batch_read(spark, endpoints, WARMUP_QUEUE, parameters.min_partitions)
        from kayos.bench.spark_floor import FloorSource

        spark.dataSource.register(FloorSource)
        _floor_read(spark, SparkBenchParameters(rows=1000))

        phase(f"Spark batch write ({parameters.rows} rows)")
        write_s = _write(spark, endpoints, BENCH_QUEUE, parameters.rows, parameters.value_bytes)
        phase("client read")
        client_rows, client_s = _client_read(urls, BENCH_QUEUE)
        phase("Spark batch read")
        batch_rows, batch_s = _batch_read(spark, endpoints, BENCH_QUEUE, parameters.min_partitions)
        phase("Spark floor (a source that reads nothing)")
        floor_rows, floor_s = _floor_read(spark, parameters)
        phase("Spark availableNow stream read")
        stream_rows, stream_s = _stream_read(
            spark, endpoints, BENCH_QUEUE, parameters, os.path.join(root, "checkpoint")
        )
        if not client_rows == batch_rows == stream_rows == floor_rows == parameters.rows:
            raise RuntimeError(
                f"rows read differ: client {client_rows}, batch {batch_rows}, "
                f"stream {stream_rows}, written {parameters.rows}"
            )
        client_rate = client_rows / client_s
        batch_rate = batch_rows / batch_s
        stream_rate = stream_rows / stream_s
        floor_rate = floor_rows / floor_s
        return {
            "parameters": asdict(parameters),
            "write_rows_per_s": round(parameters.rows / write_s),
            "client_read_rows_per_s": round(client_rate),
            "batch_read_rows_per_s": round(batch_rate),
            "stream_read_rows_per_s": round(stream_rate),
            "spark_floor_rows_per_s": round(floor_rate),
            "batch_read_vs_client": round(batch_rate / client_rate, 3),
            "stream_read_vs_client": round(stream_rate / client_rate, 3),
            "batch_read_vs_floor": round(batch_rate / floor_rate, 3),
            "seconds": {
                "write": round(write_s, 2),
                "client_read": round(client_s, 2),
                "batch_read": round(batch_s, 2),
                "stream_read": round(stream_s, 2),
                "spark_floor": round(floor_s, 2),
            },
            "machine": machine_facts(),
        }
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
