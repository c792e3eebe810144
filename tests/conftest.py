"""Shared test fixtures: a hypothesis profile for CI and a throwaway shard store."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from kayos.clock import ManualClock
from kayos.storage.engine import ShardStore, StoreOptions
from tests.support.storage import TEST_STORE_UUID

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

# CI runs every property test derandomized (the same examples on every run) and prints the
# reproduction blob of a failure, so a red build can be replayed locally with @reproduce_failure.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def tmp_store(tmp_path: Path, clock: ManualClock) -> Iterator[ShardStore]:
    """A fresh store on the real file system with a manual clock; closed after the test."""
    store = ShardStore.open(
        str(tmp_path / "shard"), clock=clock, options=StoreOptions(store_uuid=TEST_STORE_UUID)
    )
    try:
        yield store
    finally:
        store.close()
