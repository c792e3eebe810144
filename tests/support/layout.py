"""The layout of the checkout and of its test tree: where the repository is (tests that read the
project's own files find them from here, wherever the test module sits), and the tier check
(tests/conftest.py): every test sits in one tier's folder under tests/ and carries that tier's
marker and no other's, so a marker selects exactly a folder's tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]

# The tiers, by the folder under tests/ that holds each (docs/testing.md, "The tiers").
TIERS = ("unit", "integration", "chaos", "spark")


class Collected(Protocol):
    """What the check reads of a collected test (a pytest.Item)."""

    @property
    def path(self) -> Path: ...

    @property
    def nodeid(self) -> str: ...

    def get_closest_marker(self, name: str) -> Any: ...


def tier_problems(items: Sequence[Collected], root: Path) -> list[str]:
    """Each test outside a tier's folder, without its tier's marker, or with another tier's."""
    problems: list[str] = []
    for item in items:
        parts = item.path.resolve().relative_to(root).parts
        tier = parts[0] if len(parts) > 1 else None
        if tier not in TIERS:
            problems.append(f"{item.nodeid}: not in a tier's folder (tests/{{{','.join(TIERS)}}}/)")
            continue
        marked = {tier_name for tier_name in TIERS if item.get_closest_marker(tier_name)}
        if marked != {tier}:
            problems.append(
                f"{item.nodeid}: in tests/{tier}/ but marked {sorted(marked) or 'with no tier'}: "
                f"give its module `pytestmark = pytest.mark.{tier}`"
            )
    return problems
