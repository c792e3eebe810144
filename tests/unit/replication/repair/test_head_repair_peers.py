"""Whom a head whose store opened below its durable mark asks (kayos.node.replicas.repair,
docs/replication-protocol.md "A damaged head repairs first"): its downstreams first, in chain
order, then every other node of the topology (a node outside the chain answers from its learner),
never itself."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kayos.node.replicas.repair import peers_of
from tests.support.links import one_shard_topology

pytestmark = pytest.mark.unit


def _head(node_id: str, downstreams: tuple[str, ...]) -> Any:
    return SimpleNamespace(node_id=node_id, downstreams=downstreams)


def test_downstreams_first_then_the_other_nodes() -> None:
    topology = one_shard_topology(["a", "b", "c", "d", "e"])
    assert peers_of(_head("c", ("e", "a")), topology) == ("e", "a", "b", "d")


def test_a_head_alone_asks_every_other_node() -> None:
    topology = one_shard_topology(["b", "a", "c"])
    assert peers_of(_head("b", ()), topology) == ("a", "c")
    assert peers_of(_head("b", ()), one_shard_topology(["b"])) == ()
