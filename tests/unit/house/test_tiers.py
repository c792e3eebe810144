"""The tier check (tests/support/layout.py): a test is in one tier's folder and carries exactly
that tier's marker; the unit tier starts no process (tests/unit/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.layout import tier_problems

pytestmark = pytest.mark.unit

ROOT = Path("/repo/tests")


@dataclass
class Item:
    path: Path
    nodeid: str
    marks: tuple[str, ...]

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def item(where: str, *marks: str) -> Item:
    return Item(ROOT / where, f"tests/{where}::test_x", marks)


def test_a_test_marked_for_its_folders_tier_passes() -> None:
    items = [
        item("unit/storage/test_a.py", "unit"),
        item("integration/chain/test_b.py", "integration", "slow"),
        item("chaos/campaigns/test_c.py", "chaos"),
        item("spark/test_d.py", "spark"),
    ]
    assert tier_problems(items, ROOT) == []


def test_a_missing_wrong_or_second_tier_marker_is_named() -> None:
    problems = tier_problems(
        [
            item("unit/storage/test_a.py"),
            item("unit/storage/test_b.py", "integration"),
            item("integration/chain/test_c.py", "integration", "chaos"),
        ],
        ROOT,
    )
    assert len(problems) == 3, problems
    assert "with no tier" in problems[0]
    assert "['integration']" in problems[1]
    assert "['chaos', 'integration']" in problems[2]


def test_a_test_outside_every_tier_folder_is_named() -> None:
    (problem,) = tier_problems([item("test_loose.py", "unit")], ROOT)
    assert "not in a tier's folder" in problem


def test_the_unit_tier_refuses_to_start_a_process() -> None:
    with pytest.raises(RuntimeError, match="starts no process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
