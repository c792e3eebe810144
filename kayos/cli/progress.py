"""A progress line for long commands (``kayos bench ...``, ``kayos chaos run``): on a terminal,
a rich line on stderr with the phase that runs, the time elapsed (and expected, where known) and
a count done out of a total where there is one; nothing with ``--json`` or when stderr is not a
terminal (a pipe, a log, CI), so stdout carries only the command's output.

``Progress(title, enabled=...)`` is a context manager; ``phase(name)`` names what runs now,
``advance()`` counts one more done, ``line(text)`` prints a line above the bar (where it is
shown) or to stderr as before (where it is not).
"""

from __future__ import annotations

import sys
from typing import Any

import click


def wanted(as_json: bool) -> bool:
    """Whether a progress line is shown: not with --json, and only when stderr (where it goes)
    is a terminal."""
    return not as_json and sys.stderr.isatty()


class Progress:
    """The progress line of one command (see the module's docstring). ``console`` is rich's
    Console to draw on (a test gives one with ``force_terminal``); by default stderr's."""

    def __init__(
        self,
        title: str,
        *,
        enabled: bool,
        total: int | None = None,
        expected_s: float | None = None,
        console: Any = None,
    ) -> None:
        self.title = title
        self.enabled = enabled
        self.total = total
        self.expected_s = expected_s
        self.console = console
        self.done = 0
        self.current = "starting"
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichProgress

        columns: list[Any] = [SpinnerColumn(), TextColumn(f"[bold]{self.title}[/]")]
        if self.total is not None:
            columns += [BarColumn(bar_width=20), MofNCompleteColumn()]
        columns += [TimeElapsedColumn(), TextColumn("{task.description}")]
        console = self.console or Console(stderr=True)
        self._bar = RichProgress(*columns, console=console, transient=False)
        self._bar.start()
        self._task = self._bar.add_task(self._description(), total=self.total)
        return self

    def _description(self) -> str:
        expected = f" of ~{self.expected_s:.0f} s" if self.expected_s else ""
        return f"{expected} {self.current}".strip()

    def phase(self, name: str) -> None:
        """Names what runs now."""
        self.current = name
        if self._bar is not None:
            self._bar.update(self._task, description=self._description())

    def advance(self, count: int = 1) -> None:
        """Counts ``count`` more done (of ``total``)."""
        self.done += count
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)

    def line(self, text: str) -> None:
        """A line of the command's own (a case's result, a fault): above the bar on a terminal,
        else on stderr."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            click.echo(text, err=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
