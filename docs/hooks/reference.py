"""MkDocs hook (mkdocs.yml, `hooks:`): adds the reference pages generated from the code
(Configuration, Metrics, Ports) and fills the markers of written pages (the exception tree of
the Python API page). The generators are kayos/cli/reference/; nothing they write is kept in
the repository, so the pages cannot drift from the code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# The site documents the tree it is built from, whatever kayos the environment has installed.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kayos.cli.reference.pages import MARKERS, PAGES  # noqa: E402


def on_files(files: Files, config: Any) -> Files:
    for path, render in PAGES.items():
        written = files.get_file_from_path(path)
        if written is not None:
            raise SystemExit(f"docs/{path} is generated at build time: remove the written file")
        files.append(File.generated(config, path, content=render()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
