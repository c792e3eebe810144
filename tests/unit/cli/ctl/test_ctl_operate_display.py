"""How `kayos ctl drain/move-shard/rebalance` show progress (kayos/cli/ctl/operate.py): a rich
progress bar on a terminal, a plain line per change otherwise, nothing with --json."""

from __future__ import annotations

import io
from typing import Any

import pytest

from kayos.cli.ctl.operate import Display

pytestmark = pytest.mark.unit


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _progress(*moves: tuple[int, str, str]) -> dict[str, Any]:
    return {
        "moves": [{"shard": s, "source": a, "target": b, "joined": False} for s, a, b in moves],
        "drain_blocked": [],
        "replicas": {"a": 3, "d": len(moves)},
    }


STEPS = [_progress((0, "a", "d"), (1, "b", "d")), _progress((1, "b", "d")), _progress()]


def test_plain_lines_on_a_pipe_one_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    with Display(as_json=False) as show:
        for step in [STEPS[0], STEPS[0], *STEPS[1:]]:
            show(step)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines  # the repeated step printed once
    assert lines[0].startswith("moves pending 2 (joined 0); shard 0 a->d, shard 1 b->d"), lines
    assert lines[-1].startswith("moves pending 0"), lines


def test_json_shows_nothing_while_following(capsys: pytest.CaptureFixture[str]) -> None:
    with Display(as_json=True) as show:
        for step in STEPS:
            show(step)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ""


def test_a_progress_bar_on_a_terminal_counts_moves_done(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    display = Display(as_json=False)
    with display as show:
        for step in STEPS:
            show(step)
        task = display.bar.tasks[0]
        assert (task.completed, task.total) == (2, 2)
    assert "2/2" in terminal.getvalue(), terminal.getvalue()[-400:]
