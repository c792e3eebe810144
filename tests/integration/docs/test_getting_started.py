"""docs/guide/getting-started.md, run as a reader runs it: every console block the page marks
(the markers are described in tests/support/docs/console_page.py) is executed in order, in a
directory laid out like a fresh checkout after `make dev`, against the real `kayos up` that the
page's `make run` starts, and each command's exit code and the lines the page shows are checked.

What differs from a reader's machine, and only that:

- The install (`git clone`, `make dev`) is not run: the directory gets this checkout's Makefile
  and pyproject.toml and a `.venv` whose `kayos` runs this checkout (a venv whose path file names
  this checkout and the test interpreter's site-packages), stamped installed so `make run` goes
  straight to `.venv/bin/kayos up` as it does after `make dev`.
- Ports: `make run` gets `ARGS=...` moving every port to free ones (the page's "Ports already in
  use" shows the reader the same; the recipe line make echoes is expected with them), and an
  address `127.0.0.1:PORT` in a command is rewritten to the moved port. Output lines match any
  digits, so the ports shown need no rewriting.
- Commands run in `sh -c` with a fresh terminal's PATH and PYTHONUNBUFFERED=1, so stdout and
  stderr interleave in one stream as a terminal shows them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kayos.local.ports import free_ports
from tests.support.cluster import wait_until
from tests.support.docs.console_page import (
    Block,
    Step,
    console_blocks,
    first_missing,
    match_in_order,
)
from tests.support.layout import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

PAGE = REPO_ROOT / "docs" / "guide" / "getting-started.md"
START_S = 180.0  # kayos up on a busy 2-core box: nine processes, then the Kestrel front
STEP_S = 90.0  # one command, or the output a step waits for
HEAL_S = 90.0  # a killed node restarted, caught up and back in every chain
# The page's default ports, by kayos up's layout (node i: HTTP base+i, binary base+100+i;
# manager i: Raft base+200+i, HTTP base+300+i), and the Kestrel front's.
DEFAULT_BASE = 7101
KESTREL_DEFAULTS = (22133, 2222, 2229)


def free_layout() -> tuple[int, tuple[int, int, int]]:
    """A base port whose whole kayos up layout is free now, and three free Kestrel ports."""
    for _ in range(50):
        base = free_ports(1)[0]
        wanted = [base + offset + i for offset in (0, 100, 200, 300) for i in range(3)]
        if max(wanted) > 65535:
            continue
        probes: list[socket.socket] = []
        try:
            for port in wanted:
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        kestrel = [p for p in free_ports(8) if p not in wanted][:3]
        return base, (kestrel[0], kestrel[1], kestrel[2])
    raise AssertionError("no free run of ports for kayos up")


def port_map(base: int, kestrel: tuple[int, int, int]) -> dict[int, int]:
    """The page's default port -> the port this run uses."""
    moved = {
        DEFAULT_BASE + offset + i: base + offset + i
        for offset in (0, 100, 200, 300)
        for i in range(3)
    }
    moved.update(zip(KESTREL_DEFAULTS, kestrel, strict=True))
    return moved


def moved_ports_args(base: int, kestrel: tuple[int, int, int]) -> str:
    """The options that move every port of kayos up."""
    moved = f"--base-port {base} --kestrel-port {kestrel[0]}"
    return moved + f" --kestrel-text-port {kestrel[1]} --kestrel-thrift-port {kestrel[2]}"


def as_run(command: str, base: int, kestrel: tuple[int, int, int]) -> str:
    """The page's command with the ports moved: ARGS for `make run`, addresses rewritten."""
    if command.strip() == "make run":
        return f"make run ARGS='{moved_ports_args(base, kestrel)}'"
    ports = port_map(base, kestrel)
    return re.sub(
        r"127\.0\.0\.1:(\d+)",
        lambda m: f"127.0.0.1:{ports.get(int(m.group(1)), int(m.group(1)))}",
        command,
    )


def as_shown(shown: tuple[str, ...], base: int, kestrel: tuple[int, int, int]) -> tuple[str, ...]:
    """The lines shown under `make run` as that command prints them with the ports moved: make
    echoes the recipe with the ARGS in it."""
    echo = ".venv/bin/kayos up"
    moved = f"{echo} {moved_ports_args(base, kestrel)}"
    return tuple(moved if line.strip() == echo else line for line in shown)


def fresh_checkout(work: Path) -> None:
    """``work`` as a checkout after `make dev`: the Makefile, pyproject.toml, and a .venv whose
    python imports this checkout and whose ``kayos`` script runs it, stamped installed."""
    work.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, work / name)
    venv = work / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    paths = [str(REPO_ROOT), *site.getsitepackages()]
    (Path(purelib) / "kayos-checkout.pth").write_text("\n".join(paths) + "\n")
    script = venv / "bin" / "kayos"
    script.write_text(
        f"#!{python}\nimport sys\nfrom kayos.cli.main import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    (venv / ".installed").touch()


def terminal_env() -> dict[str, str]:
    """A fresh terminal's environment: no virtualenv on PATH, unbuffered Python output."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(Path.home()),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }


class Background:
    """The reader's first terminal: one command in its own process group, its output read
    line by line as it comes."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.lines: list[str] = []
        self.position = 0
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            env=terminal_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def expect(self, shown: tuple[str, ...], what: str, timeout_s: float) -> None:
        """Waits until the shown lines appear, in order, after what was matched before."""

        def seen_or_exited() -> bool:
            found = match_in_order(shown, list(self.lines), self.position)
            return found is not None or self.process.poll() is not None

        with contextlib.suppress(AssertionError):  # the assertion below says what is missing
            wait_until(seen_or_exited, what, timeout_s)
        if self.process.poll() is not None:
            self.reader.join(timeout=10)  # the rest of its output, still in the pipe
        found = match_in_order(shown, list(self.lines), self.position)
        assert found is not None, (
            f"{what}: not printed (exit code so far: {self.process.poll()}); the first line "
            f"missing: {first_missing(shown, list(self.lines), self.position)!r}\nshown:\n"
            + "\n".join(shown)
            + "\nprinted:\n"
            + "\n".join(self.lines)
        )
        self.position = found

    def interrupt(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)

    def stop(self) -> None:
        """Ends whatever is left (a failed test): SIGINT, then SIGKILL after a bound."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def run_step(step: Step, cwd: Path, command: str) -> tuple[int, list[str]]:
    """One command in `sh -c`, stdout and stderr as one stream: its exit code and lines."""
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        env=terminal_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=STEP_S,
    )
    return done.returncode, done.stdout.splitlines()


def check_step(step: Step, cwd: Path, command: str, *, until_ok: bool) -> None:
    """Runs the step (again until it passes, within HEAL_S, when ``until_ok``)."""
    outcome: list[tuple[int, list[str]]] = []

    def passes() -> bool:
        code, lines = run_step(step, cwd, command)
        outcome.append((code, lines))
        return code == 0 and match_in_order(step.shown, lines) is not None

    if until_ok:
        with contextlib.suppress(AssertionError):
            wait_until(passes, f"{command!r} to pass", HEAL_S)
    else:
        passes()
    code, lines = outcome[-1]
    assert code == 0, f"{command!r} exited {code}:\n" + "\n".join(lines)
    assert match_in_order(step.shown, lines) is not None, (
        f"{command!r} did not print what the page shows; the first line missing: "
        f"{first_missing(step.shown, lines)!r}\nshown:\n"
        + "\n".join(step.shown)
        + "\nprinted:\n"
        + "\n".join(lines)
    )


def locks_free(data: Path) -> bool:
    """Whether no process holds any data directory's lock under ``data`` (all stopped)."""
    for lock in data.glob("**/LOCK"):
        with lock.open("rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
    return True


def run_block(
    block: Block, work: Path, layout: tuple[int, tuple[int, int, int]], first: list[Background]
) -> None:
    """One marked block of the page, as its mode says."""
    where = f"{PAGE.name}:{block.line}"
    if block.mode == "background":
        assert len(block.steps) == 1, f"{where}: one command"
        step = block.steps[0]
        assert step.command is not None, f"{where}: one command"
        first.append(Background(as_run(step.command, *layout), work))
        first[0].expect(as_shown(step.shown, *layout), f"{where}: {step.command}", START_S)
    elif block.mode == "wait":
        first[0].expect(block.steps[0].shown, f"{where}: the first terminal's output", STEP_S)
    elif block.mode == "ctrl-c":
        first[0].interrupt()
        first[0].expect(block.steps[0].shown, f"{where}: output after Ctrl-C", STEP_S)
        first[0].process.wait(timeout=STEP_S)
        wait_until(lambda: locks_free(work / "kayos-data"), "every process to stop", STEP_S)
    elif block.mode in ("run", "until-ok"):
        for step in block.steps:
            assert step.command is not None, f"{where}: output shown before any command"
            command = as_run(step.command, *layout)
            check_step(step, work, command, until_ok=block.mode == "until-ok")


def test_getting_started_page_runs_as_written(tmp_path: Path) -> None:
    blocks = console_blocks(PAGE)
    modes = [block.mode for block in blocks]
    commands = [step.command or "" for block in blocks for step in block.steps]
    # The page's story, which this test would otherwise pass without: a cluster started and
    # stopped, a produce, a consume, a node killed, and a status that waits for the repair.
    run = [mode for mode in modes if mode != "skip"]
    assert run.count("background") == 1, modes
    assert run[-1] == "ctrl-c", modes
    assert any(c.startswith("kill -9 ") for c in commands), commands
    assert any("produce" in c for c in commands), commands
    assert any("consume" in c for c in commands), commands
    assert "until-ok" in modes, modes
    if shutil.which("make", path=terminal_env()["PATH"]) is None:
        raise AssertionError("the page's commands need make, which this machine lacks")
    work = tmp_path / "kayos"
    fresh_checkout(work)
    layout = free_layout()
    first: list[Background] = []
    started = time.monotonic()
    try:
        for block in blocks:
            if block.mode != "skip":
                run_block(block, work, layout, first)
    finally:
        for terminal in first:
            terminal.stop()
        print(f"the page ran in {time.monotonic() - started:.1f}s; first terminal:")
        print("\n".join(first[0].lines if first else []))
    assert first[0].process.returncode is not None
