"""``import kayos`` in a fresh interpreter loads nothing heavy (aiohttp, the storage engine, the
asyncio client): the package's public names are lazy, so a script that only produces pays little
to start. A child Python process, so a module an earlier test imported cannot hide a regression."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_import_kayos_stays_cheap() -> None:
    code = (
        "import sys, kayos; "
        "heavy = [m for m in ('aiohttp', 'kayos.storage', 'kayos.client.aio') "
        "if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout
