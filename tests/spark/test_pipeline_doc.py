"""docs/guide/spark.md's example pipeline, run as written (its one Python block under "A
pipeline, batch and stream") against a real 3-node, 3-shard cluster."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kayos.client import Client
from kayos.local.cluster import LocalCluster
from tests.support.layout import REPO_ROOT
from tests.support.spark import endpoints, produce_rows, read_all

pytestmark = pytest.mark.spark

DOC = REPO_ROOT / "docs" / "guide" / "spark.md"


def _pipeline_block() -> str:
    text = DOC.read_text()
    section = text.split("## A pipeline, batch and stream", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section has one Python block"
    return blocks[0]


def test_doc_pipeline_runs_as_written(
    spark: Any, cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    words = ["kayos", "spark", "kayos", "queue", "kayos", "spark"] * 50
    produce_rows(client, "words", [(f"w{i:05d}", word) for i, word in enumerate(words)])
    namespace = {
        "spark": spark,
        "CLUSTER": endpoints(cluster),
        "CHECKPOINT": str(tmp_path / "checkpoint"),
    }
    exec(compile(_pipeline_block(), str(DOC), "exec"), namespace)  # noqa: S102 - the doc's own code
    counts = {k.decode(): int(v or b"0") for k, v, _s in read_all(client, "word-counts")}
    assert counts == dict(Counter(words))
    seen = {k.decode() for k, _v, _s in read_all(client, "words-seen")}
    assert seen == set(words)
