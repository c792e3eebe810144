"""The progress line of ``kayos bench ...`` and ``kayos chaos run`` (kayos/cli/progress.py): shown
on a terminal (here a rich Console forced to be one), quiet with --json and when stderr is not a
terminal, so stdout holds only the command's output."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from kayos.cli.bench import bench
from kayos.cli.progress import Progress, wanted

pytestmark = pytest.mark.unit

FIGURES = {"workload": {"messages": 10, "per_commit": 1}, "msgs_per_s": 5, "scan_msgs_per_s": 9}


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120, color_system=None), out


def test_progress_shows_the_phase_and_the_count_on_a_terminal() -> None:
    console, out = _terminal()
    with Progress("bench failover", enabled=True, total=6, console=console) as shown:
        shown.phase("case 2/6: kill9 middle #1")
        shown.advance()
        shown.line("bench failover: kill9 head (a) #1: writes resumed after 0.2 s")
    text = out.getvalue()
    assert "bench failover" in text
    assert "case 2/6: kill9 middle #1" in text
    assert "1/6" in text
    assert "writes resumed after 0.2 s" in text


def test_progress_says_the_expected_time_where_it_is_known() -> None:
    console, out = _terminal()
    with Progress("chaos run", enabled=True, expected_s=60, console=console) as shown:
        shown.phase("fault 3: kill node b")
    assert "of ~60 s fault 3: kill node b" in out.getvalue()


def test_disabled_progress_draws_nothing_but_keeps_its_lines_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    console, out = _terminal()
    with Progress("bench produce", enabled=False, console=console) as shown:
        shown.phase("consume")
        shown.advance()
        shown.line("a line of the command's own")
    assert out.getvalue() == ""
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "a line of the command's own\n"


def test_progress_is_wanted_only_on_a_terminal_and_never_with_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Tty())
    assert wanted(as_json=False)
    assert not wanted(as_json=True)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not wanted(as_json=False)


def _fake_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    import kayos.bench.storage

    def fake(*_args: object, phase: object = None, **_kwargs: object) -> dict[str, object]:
        assert callable(phase)
        phase("shard store: 10 messages")
        return FIGURES

    monkeypatch.setattr(kayos.bench.storage, "bench_storage", fake)


def test_with_json_the_output_is_the_json_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_storage(monkeypatch)
    result = CliRunner().invoke(bench, ["storage", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == FIGURES  # stdout and stderr together: nothing else


def test_off_a_terminal_no_progress_is_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_storage(monkeypatch)
    result = CliRunner().invoke(bench, ["storage"])
    assert result.exit_code == 0, result.output
    assert "shard store: 10 messages" not in result.output
    assert "msgs_per_s: 5" in result.stdout


def test_the_chaos_campaign_counts_its_faults_on_the_progress_line() -> None:
    from chaos.cli import CampaignProgress

    console, out = _terminal()
    with CampaignProgress("chaos run", enabled=True, total=5, console=console) as shown:
        shown.echo("fault 0: kill9 b 1.0s")
        shown.echo("fault 1: sigstop a 0.5s")
        shown.echo("heal: starting b")
    assert shown.done == 2
    text = out.getvalue()
    assert "2/5" in text
    assert "chaos: fault 1: sigstop a 0.5s" in text
