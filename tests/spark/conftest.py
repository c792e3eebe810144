"""The Spark tier (docs/spark.md, "Tests and figures"): one local[2] SparkSession for the whole
session, one real 3-node, 3-shard LocalCluster per module, loopback only. Skipped, saying why,
without pyspark or Java, unless KAYOS_REQUIRE_SPARK=1 (CI) makes that a failure."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos.client import Client
from kayos.local.cluster import LocalCluster


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
