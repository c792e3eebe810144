"""The safe default of a node (docs/security.md, "Safe defaults"): bound beyond loopback it needs
TLS, or ``--insecure``, which its status and its ``kayos_insecure`` metric then report."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kayos.errors import InvalidRequest
from kayos.node.runtime import Node
from kayos.node.server import Listen, check_node_exposure, secure_node
from kayos.node.status import node_status
from kayos.topology import NodeAddr, rotated

pytestmark = pytest.mark.unit


def node_at(host: str, tmp_path: Path) -> Node:
    topology = rotated([NodeAddr("a", host, 7101, 7201)], replicas=1)
    return Node(topology, "a", str(tmp_path / "a"))


def test_a_node_beyond_loopback_without_tls_refuses_to_start(tmp_path: Path) -> None:
    node = node_at("10.0.0.5", tmp_path)
    with pytest.raises(
        InvalidRequest, match=r"node a: refusing to serve on 10\.0\.0\.5 without TLS"
    ):
        secure_node(node, None, None, insecure=False)


def test_an_insecure_node_says_so_in_status_and_metrics(tmp_path: Path) -> None:
    node = node_at("10.0.0.5", tmp_path)
    secure_node(node, None, None, insecure=True)
    assert node_status(node)["insecure"] is True
    assert b"kayos_insecure 1.0" in generate_latest(node.registry)


def test_a_loopback_node_runs_open_and_reports_0(tmp_path: Path) -> None:
    node = node_at("127.0.0.1", tmp_path)
    secure_node(node, None, None, insecure=False)
    assert node_status(node)["insecure"] is False
    assert b"kayos_insecure 0.0" in generate_latest(node.registry)


def test_a_listen_address_beyond_loopback_counts_too(tmp_path: Path) -> None:
    node = node_at("127.0.0.1", tmp_path)
    listen = Listen(http=("10.0.0.6", 7101))
    with pytest.raises(InvalidRequest, match=r"10\.0\.0\.6"):
        check_node_exposure(node, listen, tls=False, insecure=False)
