"""Fixtures of the integration tier (real `kayos node` processes on loopback, through
kayos.local.cluster.LocalCluster): a seed to replay, and clusters started in the test's directory
and stopped after it. The plain-HTTP helpers the tests share are in tests/support/cluster.py."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster


@pytest.fixture
def seed() -> int:
    """The seed of a test's randomness: KAYOS_TEST_SEED to replay, else fresh and printed."""
    value = int(os.environ.get("KAYOS_TEST_SEED") or random.SystemRandom().randrange(2**32))
    print(f"seed={value} (replay with KAYOS_TEST_SEED={value})")
    return value


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Starts a LocalCluster in the test's directory; every one is stopped at teardown."""
    clusters: list[LocalCluster] = []

    def start(**options: Any) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster-{len(clusters)}", **options)
        clusters.append(cluster)
        cluster.start_all()
        print("\n".join(cluster.describe()))
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()
