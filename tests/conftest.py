"""Shared test fixtures (a hypothesis profile for CI and a throwaway shard store) and the tier
check: every test sits in one tier's folder and carries that tier's marker, and no other's
(docs/testing.md, "The tiers"), so `pytest -m unit` and the folder agree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from kayos.clock import ManualClock
from kayos.storage.engine import ShardStore, StoreOptions
from tests.support.layout import tier_problems
from tests.support.storage import TEST_STORE_UUID

TESTS_ROOT = Path(__file__).resolve().parent

if TYPE_CHECKING:
    from collections.abc import Iterator


# CI runs every property test derandomized (the same examples on every run) and prints the
# reproduction blob of a failure, so a red build can be replayed locally with @reproduce_failure.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

# The tests name their clusters themselves: a KAYOS_CLUSTER exported in the shell that runs them
# would point every `kayos` command (and a front meant to keep items in memory) elsewhere.
os.environ.pop("KAYOS_CLUSTER", None)


@pytest.fixture(autouse=True)
def credentials_env_restored() -> Iterator[None]:
    """``KAYOS_CREDENTIALS`` as it was before each test: a command run in-process with
    ``--credentials`` names its file for every client of the process (kayos/cli/address.py), and
    left behind it made later clients (a Spark read meant to have none) prove a credential of a
    cluster long gone."""
    before = os.environ.get("KAYOS_CREDENTIALS")
    yield
    if before is None:
        os.environ.pop("KAYOS_CREDENTIALS", None)
    else:
        os.environ["KAYOS_CREDENTIALS"] = before


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = tier_problems(items, TESTS_ROOT)
    if problems:
        shown = "\n".join(problems[:20])
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise pytest.UsageError(f"tests outside their tier's marker:\n{shown}{more}")
