"""Every route a node's HTTP face and a manager member's registers has its row in
``kayos.auth.rules.HTTP_RULES`` (docs/security.md, "Roles"): a route added without one would be
closed by default, and this test says which to add."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kayos.auth.rules import HTTP_RULES
from kayos.node.http.app import make_app
from kayos.node.runtime import Node
from kayos.topology import Topology
from tests.support.layout import REPO_ROOT
from tests.support.links import one_shard_topology

pytestmark = pytest.mark.unit


def node_routes(tmp_path: Path) -> set[tuple[str, str]]:
    topology: Topology = one_shard_topology(["a"])
    node = Node(topology, next(iter(topology.nodes)), str(tmp_path))
    app = make_app(node)
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def test_every_node_route_has_a_rule(tmp_path: Path) -> None:
    routes = node_routes(tmp_path)
    assert routes, "the node registered no route"
    missing = sorted(routes - set(HTTP_RULES))
    assert not missing, f"routes without a row in kayos.auth.rules.HTTP_RULES: {missing}"


def test_every_manager_route_has_a_rule() -> None:
    source = (REPO_ROOT / "kayos/manager/member/http.py").read_text()
    routes = set(re.findall(r'@routes\.(get|post|put|delete)\("([^"]+)"\)', source))
    assert routes
    missing = sorted((m.upper(), path) for m, path in routes if (m.upper(), path) not in HTTP_RULES)
    assert not missing, f"manager routes without a row: {missing}"


def test_the_table_names_no_route_that_does_not_exist(tmp_path: Path) -> None:
    source = (REPO_ROOT / "kayos/manager/member/http.py").read_text()
    manager = {
        (m.upper(), p)
        for m, p in re.findall(r'@routes\.(get|post|put|delete)\("([^"]+)"\)', source)
    }
    stale = sorted(set(HTTP_RULES) - node_routes(tmp_path) - manager)
    assert not stale, f"rows for routes no face registers: {stale}"
