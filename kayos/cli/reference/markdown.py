"""Markdown pieces the generated reference pages share."""

from __future__ import annotations

from collections.abc import Sequence

# Shown under every generated page's title.
GENERATED_NOTE = (
    "This page is generated from the code when the site is built (kayos/cli/reference/); "
    "edit the code it names, not the page."
)


def cell(text: str) -> str:
    """``text`` made safe for one table cell: pipes escaped, lines joined."""
    return " ".join(text.replace("|", "\\|").split())


def code(text: str) -> str:
    """``text`` as an inline code span (a backtick inside gets a longer fence)."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table; every cell passes through ``cell``."""
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "---|" * len(headers))
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
