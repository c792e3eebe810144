"""Where the checkout is: tests that read the project's own files (docs, deploy files, the
source) find them from here, wherever the test module sits in the tree."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
