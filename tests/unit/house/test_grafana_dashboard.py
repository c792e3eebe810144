"""The Grafana dashboard file (deploy/grafana/kayos.json) read as the live check reads it
(tests/integration/deploy/test_grafana_dashboard.py): the PromQL name parser on known
expressions, and the dashboard's shape: templated on cluster and node, every panel described,
every query naming Kayos metrics only and selecting a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.deploy.promql import dashboard_expressions, metric_names, samples

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "kayos.json"


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("kayos_node_ready", {"kayos_node_ready"}),
        ('up{job="x"} == 0', {"up"}),
        (
            "histogram_quantile(0.99, sum by (le, node) "
            '(rate(a_bucket{n=~"$node"}[$__rate_interval])))',
            {"a_bucket"},
        ),
        ('time() - b_seconds{cluster="$cluster"} offset 1h', {"b_seconds"}),
        ("c_total / on(node) group_left(zone) d_info > bool 2e3", {"c_total", "d_info"}),
        (
            "sum without (shard) (increase(e_total[5m])) and f or g unless h",
            {"e_total", "f", "g", "h"},
        ),
        ('count(x{l="by (y) sum"}) by (k)', {"x"}),
    ],
)
def test_metric_names_are_the_selected_series_only(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names


def test_samples_parse_labels_with_escapes_and_reject_garbage() -> None:
    text = '# HELP a x\na{l="q\\"v",m="2"} 1.5\nb 3\n'
    assert samples(text) == [("a", {"l": 'q\\"v', "m": "2"}, 1.5), ("b", {}, 3.0)]
    with pytest.raises(AssertionError, match="not a sample line"):
        samples("a{ 1\n")


def test_the_dashboard_is_templated_on_cluster_and_node_and_queries_kayos_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "cluster", "node"} <= set(variables)
    assert variables["node"]["includeAll"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("produce", "consume", "lag (messages)", "lag (seconds)", "links", "epoch"):
        assert topic in titles
    for topic in ("failover", "ready", "disk"):
        assert topic in titles
    expressions = dashboard_expressions(DASHBOARD)
    for panel in panels:
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert 'cluster="$cluster"' in target["expr"], target["expr"]
    names = set().union(*(metric_names(e) for e in expressions))
    assert names
    assert all(name.startswith("kayos_") for name in names), names
