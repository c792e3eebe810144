"""The bounds of kayos/limits.py and kestrel_compat/limits.py as reference tables: every
module-level name in the order of the file, under its section, with its value, its unit (read
from its name, where CONTRIBUTING.md puts it: ``<what>_<unit>_<kind>``) and the comment above it.

The source is read for the sections, comments and expressions; the value shown is the module's
own, imported, so an expression such as ``64 * 1024 * 1024`` is shown with what it comes to.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from kayos.cli.reference.markdown import code, table

# The last word of a bound's name that says what kind of bound it is, not its unit.
KINDS = ("max", "min", "default", "target", "tolerated")
# Unit words that are abbreviations, spelled out; any other last word is its own unit.
UNIT_WORDS = {"ms": "milliseconds", "s": "seconds", "us": "microseconds"}
SECTION_MARK = "# ---"


@dataclass(frozen=True, slots=True)
class Bound:
    """One module-level name of a limits module."""

    name: str
    section: str
    expression: str
    value: Any
    unit: str
    reason: str


def unit_of(name: str, value: Any) -> str:
    """The unit a bound's name gives: its last word once a kind (``_max``, ...) is dropped."""
    words = name.split("_")
    while len(words) > 1 and words[-1] in KINDS:
        words.pop()
    if len(words) == 1 and words[0] in KINDS:
        return "count"
    last = words[-1]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return last
    return UNIT_WORDS.get(last, last)


def shown(value: Any, unit: str) -> str:
    """The value as a reader wants it: exact, with a round binary size or a time beside it."""
    text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return text
    if unit == "bytes" and value >= 1024:
        for power, name in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
            if value % (1 << power) == 0:
                return f"{text} ({value >> power:,} {name})"
    if unit == "milliseconds" and value >= 1000 and value % 100 == 0:
        return f"{text} ({value / 1000:g} s)"
    return text


def comment_above(lines: list[str], lineno: int) -> list[str]:
    """The comment lines directly above line ``lineno`` (1-based), without their '#'."""
    found: list[str] = []
    index = lineno - 2
    while index >= 0:
        line = lines[index].strip()
        if not line.startswith("#") or line.startswith(SECTION_MARK):
            break
        found.append(line[1:].strip())
        index -= 1
    return found[::-1]


def section_title(line: str) -> str:
    """``# --- storage format (see docs/x.md) ----`` -> ``storage format (see docs/x.md)``."""
    return line.strip().removeprefix(SECTION_MARK).strip().rstrip("-").strip()


def bounds(module_name: str) -> list[Bound]:
    """Every module-level assignment of ``module_name``, in file order."""
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    lines = source.splitlines()
    found: list[Bound] = []
    section = ""
    section_lines = {i + 1: section_title(t) for i, t in enumerate(lines) if t.startswith("# ---")}
    previous_end = -1
    previous_reason = ""
    for node in ast.parse(source).body:
        for line in range(previous_end + 1, node.lineno):
            section = section_lines.get(line, section)
        previous_end = max(previous_end, node.end_lineno or node.lineno)
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        reason = " ".join(comment_above(lines, node.lineno))
        if not reason and lines[node.lineno - 2].strip():
            reason = previous_reason  # a bound sharing the comment of the one just above
        previous_reason = reason
        expression = ast.get_source_segment(source, node.value) if node.value else ""
        for target in targets:
            if isinstance(target, ast.Name):
                value = getattr(module, target.id)
                unit = unit_of(target.id, value)
                found.append(Bound(target.id, section, expression or "", value, unit, reason))
    return found


def render(module_name: str, heading: str) -> str:
    """The Markdown of one limits module: a table per section, headed ``heading`` level."""
    parts: list[str] = []
    by_section: dict[str, list[Bound]] = {}
    for bound in bounds(module_name):
        by_section.setdefault(bound.section, []).append(bound)
    for section, members in by_section.items():
        parts.append(f"{heading} {section[:1].upper() + section[1:] if section else 'General'}")
        rows = []
        for bound in members:
            value = shown(bound.value, bound.unit)
            if bound.expression.replace("_", "") != repr(bound.value):
                value += f" = {code(bound.expression)}"
            rows.append([code(bound.name), value, bound.unit, bound.reason])
        parts.append(table(["name", "value", "unit", "why"], rows))
    return "\n\n".join(parts)
