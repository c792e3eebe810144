"""The shell sessions of a Markdown page, read so a test can run them as a reader would.

A page marks each ```` ```console ```` block it wants run with an HTML comment on the line just
before the fence (invisible once rendered):

- ``<!-- run -->``: run each ``$ `` command in a shell, in order; each must exit 0 and print the
  lines shown under it.
- ``<!-- run: until-ok -->``: the same, but a command is tried again (within a bound) until it
  exits 0 and prints what is shown: a state the reader is told to wait for.
- ``<!-- run: background -->``: the block's one command keeps running (the reader's first
  terminal); the lines shown under it must appear in its output.
- ``<!-- run: wait -->``: no command; the lines shown are what the background command prints
  next.
- ``<!-- run: ctrl-c -->``: a ``^C`` line: SIGINT to the background command's process group, as
  a terminal sends it; the lines shown must follow in its output, and it must exit.
- ``<!-- run: skip, WHY -->``: not run, and the page's reader is not told why.

Every console block carries one of these, so a block cannot be left out of the run by accident.

Shown output is matched loosely enough to survive a second run: each shown line must match a
line of the actual output, in the order shown (other lines may come between); runs of digits
match any digits where they differ from run to run (numbers of 4 or more digits: pids and ports;
decimals: timings; the number after "epoch"), a random hex id (8 or more lowercase hex digits, at
least one a decimal digit) any hex id, runs of spaces any spaces, ``...`` anything; other numbers
(seqs, counts) must be as shown. A line that is only ``...`` says output was left out and matches
nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MODES = ("run", "until-ok", "background", "wait", "ctrl-c", "skip")
MARKER = re.compile(r"^<!--\s*run(?::\s*([a-z-]+)(?:,\s*(.*?))?)?\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
PROMPT = "$ "
INTERRUPT = "^C"
ELISION = "..."
# What differs from one run to the next, and matches any of its kind: an id drawn at random
# (8 or more lowercase hex digits, at least one a decimal digit, so plain words are left alone),
# a decimal (timings), a number of 4 or more digits (pids, ports), an epoch; and spaces.
VARYING = re.compile(
    r"(?P<elision>\.\.\.)"
    r"|(?P<hex>(?<![0-9a-z])(?=[a-f]*\d)[0-9a-f]{8,}(?![0-9a-z]))"
    r"|(?P<decimal>\d+\.\d+)"
    r"|(?P<number>\d{4,}|(?<=epoch )\d+)"
    r"|(?P<space>\s+)"
)
PATTERNS = {
    "elision": ".*",
    "hex": "[0-9a-f]+",
    "decimal": r"\d+\.\d+",
    "number": r"\d+",
    "space": r"\s+",
}


class PageError(Exception):
    """The page's console blocks do not follow the rules above."""


@dataclass(frozen=True)
class Step:
    """One command (``None`` for output shown with no command) and the lines shown under it."""

    command: str | None
    shown: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """A console block: where it starts (1-based line of its fence), its mode and its steps."""

    line: int
    mode: str
    steps: tuple[Step, ...]


def steps_of(lines: list[str]) -> tuple[Step, ...]:
    """The block's lines as steps: each ``$ `` or ``^C`` line starts one."""
    steps: list[Step] = []
    command: str | None = None
    shown: list[str] = []
    for line in lines:
        if line.startswith(PROMPT) or line.strip() == INTERRUPT:
            if command is not None or shown:
                steps.append(Step(command, tuple(shown)))
            command = line[len(PROMPT) :] if line.startswith(PROMPT) else INTERRUPT
            shown = []
        else:
            shown.append(line)
    if command is not None or shown:
        steps.append(Step(command, tuple(shown)))
    return tuple(steps)


def mode_of(marker: re.Match[str], where: str) -> str:
    """The marker's mode, checked."""
    mode = marker.group(1) or "run"
    if mode not in MODES:
        raise PageError(f"{where}: unknown mode {mode!r} (one of {', '.join(MODES)})")
    if mode == "skip" and not marker.group(2):
        raise PageError(f"{where}: a skipped block says why: <!-- run: skip, WHY -->")
    return mode


def console_blocks(page: Path) -> list[Block]:
    """Every console block of ``page`` with its marker; a block without one is an error."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise PageError(f"{page.name}:{index + 1}: a fence that is never closed")
        if fence.group(1) == "console":
            where = f"{page.name}:{index + 1}"
            marker = MARKER.match(lines[index - 1]) if index > 0 else None
            if marker is None:
                raise PageError(f"{where}: a console block without a <!-- run ... --> line above")
            blocks.append(
                Block(index + 1, mode_of(marker, where), steps_of(lines[index + 1 : end]))
            )
        index = end + 1
    return blocks


def line_pattern(shown: str) -> re.Pattern[str] | None:
    """The pattern an output line must match to be ``shown``; None for an elision line."""
    text = shown.strip()
    if text == ELISION:
        return None
    regex, done = "", 0
    for found in VARYING.finditer(text):
        kind = found.lastgroup
        assert kind is not None
        regex += re.escape(text[done : found.start()]) + PATTERNS[kind]
        done = found.end()
    return re.compile(regex + re.escape(text[done:]))


def match_in_order(shown: tuple[str, ...], actual: list[str], start: int = 0) -> int | None:
    """The index just past the last line of ``actual`` (from ``start``) that the shown lines
    match, one after another in order; None when some shown line has no match."""
    position = start
    for line in shown:
        pattern = line_pattern(line)
        if pattern is None:
            continue
        found = next(
            (i for i in range(position, len(actual)) if pattern.fullmatch(actual[i].strip())),
            None,
        )
        if found is None:
            return None
        position = found + 1
    return position


def first_missing(shown: tuple[str, ...], actual: list[str], start: int = 0) -> str | None:
    """The first shown line ``match_in_order`` finds no place for (None: all found), for a
    failure message."""
    for count in range(1, len(shown) + 1):
        if match_in_order(shown[:count], actual, start) is None:
            return shown[count - 1]
    return None
