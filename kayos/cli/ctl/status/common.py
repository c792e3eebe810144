"""What both halves of ``kayos ctl status``'s pure part share: a node's answer, an alert, the
styling function the text takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# `kayos ctl status`'s exit codes: every node healthy, something degraded, no node reachable.
EXIT_HEALTHY = 0
EXIT_DEGRADED = 1
EXIT_UNREACHABLE = 2
# A node's answer: its status reply (a dict) or the reason it gave none (a str).
NodeAnswer = dict[str, Any] | str
# How the text is styled: click.style on a terminal, plain otherwise (same signature).
Style = Callable[..., str]


def alert(severity: str, code: str, message: str, **where: Any) -> dict[str, Any]:
    """One alert of the summary: its severity, code, message and where it is."""
    return {"severity": severity, "code": code, "message": message, **where}
