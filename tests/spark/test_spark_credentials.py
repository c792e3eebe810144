"""The Spark source and sink against a cluster that holds client credentials (docs/security.md,
docs/spark.md "kayos.credentials"): a batch write proves a produce-only credential, a batch read a
consume-only one, and a read with no credential fails saying so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from tests.support.security.credentials import add_credentials

pytestmark = pytest.mark.spark

QUEUE = "orders.spark"


def test_the_source_and_sink_prove_their_credentials(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    files = add_credentials(cluster, tmp_path)
    urls = ",".join(cluster.urls.values())
    frame = spark.createDataFrame(
        [(f"k{i:04d}", f"value {i}") for i in range(500)], "key string, value string"
    ).repartition(2)
    (
        frame.write.format("kayos")
        .option("kayos.cluster", urls)
        .option("queue", QUEUE)
        .option("kayos.credentials", str(files["producer"]))
        .mode("append")
        .save()
    )
    rows = (
        spark.read.format("kayos")
        .option("kayos.cluster", urls)
        .option("queue", QUEUE)
        .option("kayos.credentials", str(files["consumer"]))
        .load()
        .collect()
    )
    assert sorted(bytes(row.key) for row in rows) == [f"k{i:04d}".encode() for i in range(500)]
    with pytest.raises(Exception, match=r"unauthenticated|needs a credential"):
        spark.read.format("kayos").option("kayos.cluster", urls).option(
            "queue", QUEUE
        ).load().collect()
