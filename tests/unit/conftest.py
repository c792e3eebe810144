"""The unit tier is pure and in-process: a test here that starts a process fails at once, saying
where such a test belongs (tests/integration/, real processes on loopback)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "the unit tier starts no process: a test that needs one belongs in tests/integration/"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
