"""The manager's decisions as transcripts (testdata/*.txt here; the language is in
tests/support/transcript.py).

``KAYOS_REWRITE=1 pytest tests/unit/manager/test_transcripts.py`` rewrites the expected outputs;
review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.transcript import run_file

pytestmark = pytest.mark.unit

TESTDATA = Path(__file__).parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_there_are_transcripts() -> None:
    assert len(FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_transcript(path: Path) -> None:
    expected, actual = run_file(path)
    if os.environ.get("KAYOS_REWRITE"):
        path.write_text(actual)
        return
    assert actual == expected, f"{path.name} differs; KAYOS_REWRITE=1 regenerates it"
