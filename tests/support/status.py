"""Canned ``GET /v1/status`` answers of a healthy cluster, for ``kayos ctl status``'s summary."""

from __future__ import annotations

from typing import Any

from kayos.cli.status_view import (
    NodeAnswer,
)
from kayos.topology import Topology


def topology(fanout: tuple[str, ...] = ()) -> Topology:
    """Three nodes, S0 a->b->c and S1 b->c->a (or S0 a->b->{c, d} with fanout)."""
    names = ["a", "b", "c", *fanout]
    nodes = {
        name: {"host": "127.0.0.1", "http_port": 7101 + i, "bin_port": 7201 + i}
        for i, name in enumerate(names)
    }
    shards: list[dict[str, Any]] = [{"id": 0, "chain": ["a", "b"] if fanout else ["a", "b", "c"]}]
    if fanout:
        shards[0]["fanout"] = ["c", *fanout]
    else:
        shards.append({"id": 1, "chain": ["b", "c", "a"]})
    return Topology.from_json({"epoch": 1, "nodes": nodes, "shards": shards})


def link(peer: str, direction: str, *, up: bool = True, heard: float = 0.1, lag: int = 0) -> Any:
    """One link entry of a replica's status, toward ``peer`` in ``direction``."""
    return {
        "peer": peer,
        "direction": direction,
        "up": up,
        "last_heard_s": heard,
        "lag_entries": lag,
    }


def healthy_answers(topo: Topology, seq: int = 50) -> dict[str, NodeAnswer]:
    """What every node of ``topo`` answers when every link is up and nothing lags."""
    answers: dict[str, NodeAnswer] = {}
    for node in topo.nodes:
        shards: dict[str, Any] = {}
        for shard in topo.shards_of(node):
            upstream = shard.upstream_of(node)
            links = [link(upstream, "upstream")] if upstream else []
            links += [link(down, "downstream") for down in shard.downstreams_of(node)]
            shards[str(shard.id)] = {
                "role": shard.role_of(node),
                "last_seq": seq,
                "committed_seq": seq,
                "catching_up": False,
                "links": links,
                "rolled_back_entries": 0,
                "rolled_back_committed_entries": 0,
            }
        answers[node] = {"node": node, "epoch": topo.epoch, "ready": True, "shards": shards}
    return answers
