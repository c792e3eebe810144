"""Canned answers for the pure parts that read them: nodes' ``GET /v1/status`` replies of a healthy
cluster (``kayos ctl status``'s summary); the manager's leader driver's inputs (views, status
replies, what a round remembers) and a cluster.toml with manager tables."""

from __future__ import annotations

from typing import Any

from kayos.cli.ctl.status.common import NodeAnswer
from kayos.identity import ClusterIdentity
from kayos.manager import Config, ManagerView, NodeReturned, TimerTick, decide
from kayos.manager.member.config import MemberAddr, managers_toml
from kayos.manager.member.plan import Answer, Memory
from kayos.topology import NodeAddr, Topology, rotated


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


# --- the manager's leader driver and member ---------------------------------------------------

CONFIG = Config(detection_window_ms=2_000, suspect_after_ms=1_000)
NODES = {n: NodeAddr(n, "127.0.0.1", 7101 + i, 7201 + i) for i, n in enumerate("abc")}


def view3() -> ManagerView:
    """The bootstrap view of nodes a, b, c with three rotated chains of three."""
    return ManagerView.bootstrap(CONFIG, list("abc"), [list("abc"), list("bca"), list("cab")])


def status(epoch: int = 1, shards: dict[int, dict[str, Any]] | None = None, **more: Any) -> Any:
    """A node's ``GET /v1/status`` reply at ``epoch``; each shard's entry a head's unless told."""
    entries = {
        str(s): {"role": "head", "last_seq": 0, "takeover": [], **e}
        for s, e in (shards or {}).items()
    }
    return {"node": "x", "epoch": epoch, "ready": True, "shards": entries, **more}


def answers(at: int = 1_000, **replies: Any) -> dict[str, Answer]:
    """A round's answers of a, b and c (``replies`` by node id; a missing one gave none)."""
    return {n: Answer(replies.get(n), at, 5) for n in "abc"}


def everyone(view: ManagerView) -> Memory:
    """A driver's memory in which every node of ``view`` answered the last round."""
    return Memory(answered=frozenset(n.id for n in view.nodes))


def down_b() -> ManagerView:
    """``view3`` after a tick at which b was silent past the detection window: b is down."""
    view, _ = decide(view3(), TimerTick(5_000, (("a", 5_000), ("c", 5_000))))
    assert view.node("b") is not None
    assert view.node("b").state == "down"
    return view


def catching_up_b() -> ManagerView:
    """``down_b`` after b returned: b catches up on every shard."""
    view = down_b()
    view, _ = decide(view, NodeReturned("b", 5_300))
    assert all("b" in s.catching_up for s in view.shards)
    return view


MEMBERS = [MemberAddr(f"m{i}", "127.0.0.1", 7300 + i, 7400 + i) for i in (1, 2, 3)]


def cluster_text(config: Config | None = None, *, secret: bool = True) -> str:
    """A cluster.toml of nodes a, b, c (with a cluster secret unless ``secret`` is False)
    and the ``MEMBERS`` manager tables with ``config``."""
    nodes = [NodeAddr(n, "127.0.0.1", 7101 + i, 7201 + i) for i, n in enumerate("abc")]
    topology = rotated(nodes, replicas=3)
    if secret:
        topology = topology.with_identity(ClusterIdentity.generate())
    return topology.dumps_toml() + "\n" + managers_toml(MEMBERS, config)
