"""The Metrics reference: every metric a node's ``GET /metrics`` exposes, read from a node itself.

A ``Node`` is built (nothing is opened: a node touches its data directory only when started) with
the HTTP application that registers its collectors, and its registry is asked for its metric
families: the name, type and help of each are the node's own. Labels are read from the source of
kayos/node/ and kayos/auth/ (the call that makes each metric names them: the refusal counter a
node shares with a manager member is made in kayos/auth/), since a family with no samples (no
shard yet) carries none. A metric whose labels cannot be read there fails the build, naming it.
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import dataclass
from pathlib import Path

import kayos.node
from kayos.cli.reference.markdown import GENERATED_NOTE, code, table
from kayos.errors import KayosError
from kayos.node.http.app import make_app
from kayos.node.runtime import Node
from kayos.topology import Topology

# prometheus_client's classes and families that make a metric from (name, help, labels).
MAKERS = {
    "Counter",
    "Gauge",
    "Histogram",
    "Summary",
    "Info",
    "Enum",
    "CounterMetricFamily",
    "GaugeMetricFamily",
    "HistogramMetricFamily",
    "SummaryMetricFamily",
    "InfoMetricFamily",
    "StateSetMetricFamily",
    "GaugeHistogramMetricFamily",
    "UnknownMetricFamily",
}
# The samples each type of metric is exposed as, beside its name (the Prometheus text format).
SAMPLES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
}
# A one-node topology for the node built to be asked for its metrics.
TOPOLOGY = {
    "epoch": 1,
    "nodes": {"a": {"host": "127.0.0.1", "http_port": 1, "bin_port": 2}},
    "shards": [{"id": 0, "chain": ["a"]}],
}


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family as the node exposes it."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    source: str


def strings(items: list[ast.expr]) -> tuple[str, ...] | None:
    """The values of a list of string literals; None if any item is something else."""
    values = [i.value for i in items if isinstance(i, ast.Constant)]
    if len(values) != len(items) or not all(isinstance(v, str) for v in values):
        return None
    return tuple(str(v) for v in values)


def label_lists(function: ast.AST) -> dict[str, tuple[str, ...]]:
    """Names assigned a literal list of strings in ``function`` (``labels = ["shard", "role"]``)."""
    found: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List | ast.Tuple):
            items = strings(node.value.elts)
            if items is not None:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = items
    return found


def labels_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in ("labels", "labelnames"):
            return keyword.value
    return call.args[2] if len(call.args) > 2 else None


def literal_labels(
    node: ast.expr | None, named: dict[str, tuple[str, ...]]
) -> tuple[str, ...] | None:
    """The label names ``node`` gives: a literal list, or a name bound to one; None if neither."""
    if node is None:
        return ()
    if isinstance(node, ast.Name):
        return named.get(node.id)
    if isinstance(node, ast.List | ast.Tuple):
        return strings(node.elts)
    return None


def enclosing_scopes(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    """Each call of ``tree`` -> the innermost function around it (the module when none)."""
    scopes: dict[ast.AST, ast.AST] = {}

    def visit(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scope
            if isinstance(child, ast.Call):
                scopes[child] = scope
            visit(child, inner)

    visit(tree, tree)
    return scopes


def module_label_lists(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """``label_lists`` of the module's own statements, not of its functions."""
    found: dict[str, tuple[str, ...]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            found.update(label_lists(statement))
    return found


def declared(root: Path | None = None) -> dict[str, tuple[tuple[str, ...] | None, str]]:
    """Metric name -> (label names or None when unreadable, module path) for every metric made
    with a literal name in the source under ``root`` (kayos/node/)."""
    root = root or Path(kayos.node.__file__).parent
    found: dict[str, tuple[tuple[str, ...] | None, str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(root.parent.parent).as_posix()
        for call, scope in enclosing_scopes(tree).items():
            assert isinstance(call, ast.Call)
            func = call.func
            maker = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if maker not in MAKERS or not call.args or not isinstance(call.args[0], ast.Constant):
                continue
            named = module_label_lists(tree)
            if scope is not tree:
                named.update(label_lists(scope))
            labels = literal_labels(labels_argument(call), named)
            name = str(call.args[0].value)
            if name not in found or found[name][0] is None:
                found[name] = (labels, where)
    return found


def exposed() -> list[tuple[str, str, str]]:
    """(name, type, help) of every metric family a node's registry holds, in exposition order."""
    with tempfile.TemporaryDirectory(prefix="kayos-metrics-") as data_dir:
        node = Node(Topology.from_json(TOPOLOGY), "a", data_dir)
        make_app(node)
        return [(m.name, m.type, m.documentation) for m in node.registry.collect()]


def metrics() -> list[Metric]:
    """Every metric a node exposes, with its labels; ``KayosError`` naming any whose labels
    cannot be read from the source."""
    auth = Path(kayos.node.__file__).parent.parent / "auth"
    sources = {**declared(auth), **declared()}
    found: list[Metric] = []
    for name, kind, help_text in exposed():
        labels, source = sources.get(name, (None, "?"))
        if labels is None:
            raise KayosError(
                f"metric {name}: its labels are not a literal list (or a name bound to one) in "
                "the call that makes it under kayos/node/ or kayos/auth/, so the Metrics "
                "reference cannot list them"
            )
        found.append(Metric(name, kind, help_text, labels, source))
    return found


def render() -> str:
    rows = []
    for metric in metrics():
        samples = [metric.name + suffix for suffix in SAMPLES.get(metric.type, ("",))]
        rows.append(
            [
                "<br>".join(code(s) for s in samples),
                metric.type,
                ", ".join(code(label) for label in metric.labels) or "none",
                metric.help,
                code(metric.source),
            ]
        )
    parts = [
        "# Metrics",
        f"*{GENERATED_NOTE}*",
        "Every node serves its metrics at `GET /metrics` on its HTTP port, in the Prometheus "
        "text format ([HTTP API](../node-api.md)). The gauges and counters are read from the "
        "node's replicas at each scrape, so a node exposes a family's samples only for the "
        "shards it holds (a family with no shard shows only its `# HELP` and `# TYPE` lines). "
        "Label values: `shard` is the shard's number, `role` one of `head`, `middle`, `tail`, "
        "`peer` a node id, `direction` `upstream` or `downstream`, `queue` and `group` the "
        "names. Counters start at 0 when the node process starts. A histogram's `_bucket` "
        "samples carry the label `le` too.",
        table(["exposed as", "type", "labels", "meaning", "defined in"], rows),
        "The manager members and the Kestrel front expose no metrics; `kayos ctl status` "
        "and the front's `stats` command report on them.",
    ]
    return "\n\n".join(parts) + "\n"
