"""The generated pages by their path on the site (kayos/cli/reference/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable

from kayos.cli.reference import config_page, errors_tree, metrics_page, ports_page

__all__ = ["MARKERS", "PAGES"]

# Site path (relative to docs/) -> the function that writes the page's Markdown.
PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": config_page.render,
    "reference/metrics.md": metrics_page.render,
    "reference/ports.md": ports_page.render,
}

# A marker in a written page -> the function whose Markdown replaces it at build time.
MARKERS: dict[str, Callable[[], str]] = {
    "<!-- kayos:errors-tree -->": errors_tree.render,
}
