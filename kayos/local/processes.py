"""The processes of a local cluster, one level down from ``LocalCluster``: how a child is tied
to its parent's life, stopped, and explained from its log when it fails.

A face like the rest of kayos/local/: it signals processes and reads their log files, nothing of
what runs inside them.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

# Lines of a node's log quoted in an error about it.
log_tail_lines = 40
# The line ``LocalCluster`` writes into a member's log before each start; ``failure_reason``
# reads only what follows the last one.
START_MARKER = "--- kayos launcher: starting node"


class ClusterError(RuntimeError):
    """A node did not start, did not become ready, or died; the message quotes its log."""


def log_tail(path: Path, lines: int = log_tail_lines) -> str:
    """The last ``lines`` lines of the log at ``path`` ("(no log)" if it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def failure_reason(path: Path) -> str:
    """The first line of the error a process ended with, from its log's last start on: a
    click ``Error:`` line, else the last exception line of a traceback, else the last line."""
    lines = [line.strip() for line in log_tail(path).splitlines() if line.strip()]
    for marker in (START_MARKER, "--- kayos: starting the kestrel front"):
        starts = [i for i, line in enumerate(lines) if line.startswith(marker)]
        if starts:
            lines = lines[starts[-1] + 1 :]
            break
    for line in reversed(lines):
        if line.startswith("Error: "):
            return line.removeprefix("Error: ")
    for line in reversed(lines):
        name, colon, _rest = line.partition(": ")
        if colon and name.rsplit(".", 1)[-1].endswith(("Error", "Exception")) and " " not in name:
            return line
    return lines[-1] if lines else "(nothing in its log)"


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the node gets SIGKILL if the process that started it dies, so a crashed test run
    leaves no nodes behind holding ports and CPU."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop_process(
    process: subprocess.Popen[bytes],
    sig: int | None,
    timeout_s: float,
    kill_timeout_s: float | None = None,
) -> int:
    """Sends ``sig`` (None: nothing, it was sent already) and waits up to ``timeout_s`` for the
    exit; past that, SIGKILL and wait again. Returns the exit code."""
    if sig is not None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(timeout=timeout_s if kill_timeout_s is None else kill_timeout_s)
