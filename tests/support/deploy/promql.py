"""Metric names out of PromQL expressions, and samples out of Prometheus text: what the Grafana
dashboard (deploy/grafana/kayos.json) asks for, checked against what a node serves.

The parser is deliberately small: it removes what cannot be a metric name (string literals,
label matchers ``{...}``, range and subquery brackets ``[...]``, the label lists of ``by``,
``without``, ``on``, ``ignoring``, ``group_left`` and ``group_right``, Grafana's ``$variables``,
numbers and durations), then takes every identifier that is not a function call (followed by
``(``) or a keyword.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "atan2", "inf", "nan", "start", "end"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENTIFIER = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w.])(\s*\()?")


def metric_names(expression: str) -> set[str]:
    """The metric names ``expression`` selects."""
    text = _STRING.sub(" ", expression)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def dashboard_expressions(path: Path) -> list[str]:
    """Every PromQL expression of a Grafana dashboard: its panels' targets (rows' panels
    included) and its query variables."""
    dashboard = json.loads(path.read_text())
    found: list[str] = []

    def panels(items: list[Any]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        found += [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else None
        if variable.get("type") == "query" and isinstance(text, str):
            inner = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", text)
            found.append(inner.group(1) if inner else text)
    return found


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample of a Prometheus text exposition."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = dict(_LABEL.findall(match.group(2) or ""))
        found.append((match.group(1), labels, float(match.group(3))))
    return found
