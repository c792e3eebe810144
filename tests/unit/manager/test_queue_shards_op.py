"""Operator requests for a queue's shard count (``kayos ctl queue create/alter``): checked against
the view and the topology file with a reason (kayos/manager/member/http.py), carried into the
published topology where the view's count wins over the file's (kayos/manager/member/plan.py)."""

from __future__ import annotations

import pytest

from kayos.errors import InvalidRequest
from kayos.manager import Config, ManagerView, SetQueueShards, decide
from kayos.manager.member.http import operator_event, queue_shard_count
from kayos.manager.member.plan import topology_of
from kayos.topology import NodeAddr, Topology, rotated

pytestmark = pytest.mark.unit


def setup() -> tuple[ManagerView, Topology]:
    nodes = [NodeAddr(n, "127.0.0.1", 1 + i, 100 + i) for i, n in enumerate("abcd")]
    base = rotated(nodes, replicas=3)
    base = Topology(base.epoch, base.nodes, base.shards, queue_shards=2, queues={"fixed": 3})
    chains = [s.chain for s in base.shards.values()]
    return ManagerView.bootstrap(Config(), list(base.nodes), chains), base


def refused(body: dict[str, object], view: ManagerView, base: Topology) -> str:
    with pytest.raises(InvalidRequest) as caught:
        operator_event({**body, "epoch": view.epoch}, view, base)
    return str(caught.value)


def test_create_then_alter_are_published_over_the_file() -> None:
    view, base = setup()
    create = {"op": "queue-create", "queue": "orders", "shards": 3, "epoch": view.epoch}
    event = operator_event(create, view, base)
    assert event == SetQueueShards("orders", 3)
    view, actions = decide(view, event)
    assert [type(a).__name__ for a in actions] == ["PublishTopology"]
    assert view.queues == (("orders", 3),)
    assert queue_shard_count(view, base, "orders") == 3
    published = topology_of(view, base.nodes, base)
    assert published.epoch == view.epoch == 2
    assert published.queues == {"fixed": 3, "orders": 3}
    assert published.queue_shards == 2, "the file's default stays"

    alter = {"op": "queue-alter", "queue": "fixed", "shards": 4, "epoch": view.epoch}
    view, _ = decide(view, operator_event(alter, view, base))
    assert topology_of(view, base.nodes, base).queues == {"fixed": 4, "orders": 3}, "view wins"
    # A queue on the file's default (2) gains shards too.
    alter = {"op": "queue-alter", "queue": "other", "shards": 3, "epoch": view.epoch}
    assert operator_event(alter, view, base) == SetQueueShards("other", 3)


@pytest.mark.parametrize(
    ("op", "queue", "shards", "reason"),
    [
        ("queue-alter", "fixed", 2, "never goes down"),
        ("queue-alter", "fixed", 3, "never goes down"),
        ("queue-alter", "other", 1, "never goes down"),  # the file's default counts as today's
        ("queue-create", "fixed", 4, "already exists"),
        ("queue-create", "new", 5, "the cluster has 4"),
        ("queue-create", "a b", 2, "bad queue name"),
        ("queue-create", "new", "2", "must be a int"),
    ],
)
def test_refusals_name_their_reason(op: str, queue: str, shards: object, reason: str) -> None:
    view, base = setup()
    assert reason in refused({"op": op, "queue": queue, "shards": shards}, view, base)


def test_a_stale_epoch_is_refused() -> None:
    view, base = setup()
    with pytest.raises(InvalidRequest, match="stale_epoch"):
        operator_event({"op": "queue-create", "queue": "new", "shards": 2, "epoch": 9}, view, base)
