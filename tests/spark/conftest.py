"""The Spark tier (docs/spark.md, "Tests and figures"): one local[2] SparkSession for the whole
session, one real 3-node, 3-shard LocalCluster per module, loopback only. Skipped, saying why,
without pyspark or Java, unless KAYOS_REQUIRE_SPARK=1 (CI) makes that a failure."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos.client import Client
from kayos.local.cluster import LocalCluster

# Bounds of the waits below: generous for 2 shared cores; only a failure reaches them.
WAIT_S = 120.0


def _missing() -> str | None:
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        return "pyspark/pyarrow not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None:
        return "no java on PATH (Spark needs Java 17 or 21)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = _missing()
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)
            if reason is not None:
                if os.environ.get("KAYOS_REQUIRE_SPARK") == "1":
                    raise pytest.UsageError(f"KAYOS_REQUIRE_SPARK=1 but {reason}")
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import kayos.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kayos-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    kayos.spark.register(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(autouse=True)
def _no_leftover_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        for query in session.streams.active:
            query.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("spark-cluster"), nodes=3, replicas=3, shards=3)
    local.start_all()
    yield local
    local.stop()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(list(cluster.urls.values())) as kayos_client:
        yield kayos_client


def endpoints(cluster: LocalCluster) -> str:
    return ",".join(cluster.urls.values())


def queue_on_shard(cluster: LocalCluster, shard: int, stem: str) -> str:
    """A fresh queue name that lives in ``shard``."""
    for n in range(10_000):
        name = f"{stem}-{n}"
        if cluster.topology.shard_for(name) == shard:
            return name
    raise AssertionError(f"no queue name for shard {shard}")


def produce_rows(client: Client, queue: str, rows: list[tuple[str, str | None]]) -> int:
    """Produces ``rows`` with acks=all in batches; returns the last seq."""
    last = 0
    for i in range(0, len(rows), 5_000):
        _first, last = client.produce_batch(queue, rows[i : i + 5_000], acks="all")
    return last


def read_all(client: Client, queue: str) -> list[tuple[bytes, bytes | None, int]]:
    """Every live entry of the queue now, as ``(key, value, seq)``, through the plain client."""
    out: list[tuple[bytes, bytes | None, int]] = []
    after = 0
    while True:
        page = client.read(queue, after=after, limit=10_000)
        out += [(m.key, m.value, m.seq) for m in page.messages]
        if page.end:
            return out
        after = page.next


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)  # a bounded poll of a condition, not a synchronisation by time
