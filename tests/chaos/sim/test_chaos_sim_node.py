"""The simulated node's producers (chaos/sim/node.py) against the real node's rule: a replica
whose place in the chain changes is remade or closed, and the producers waiting on it fail
(kayos/node/replicas/reconfigure.py, ``fail_pending``). Seed 3756 of the simulator: a head kept the
waiter of a write it never committed across its demotion and rollback, and answered it ``ok``
when another write committed at the same seq after it headed the shard again."""

from __future__ import annotations

import pytest

from chaos.sim import SimConfig
from chaos.sim.core import CLIENT, MANAGER, Endpoint, World
from chaos.sim.node import Node

pytestmark = pytest.mark.chaos

Replies = list[tuple[bool, int, int]]


class Sink(Endpoint):
    """The manager and the client: what reaches them is dropped."""

    def __init__(self, name: str) -> None:
        self.id = name

    def deliver(self, fn: object, args: tuple[object, ...]) -> None:
        return


def world_of(seed: int) -> tuple[World, Node]:
    """One live node ``n1`` heading shard 0 of the chain ``(n1, n2)`` at epoch 1, ready for
    writes; ``n2`` is down, so nothing commits while it is downstream."""
    config = SimConfig()
    print("world seed:", seed)
    world = World(
        seed,
        delay_ms=config.delay_ms,
        slow_delay_ms=config.slow_delay_ms,
        slow_share=0.0,
        datagram_loss=0.0,
        peer_silence_ms=config.peer_silence_ms,
    )
    heads: dict[tuple[int, int], set[str]] = {}
    nodes = {
        name: Node(
            world,
            name,
            1,
            plant=None,
            sync_ms=config.sync_ms,
            slow_sync_ms=config.slow_sync_ms,
            heartbeat_ms=config.heartbeat_ms,
            heads=heads,
            lease_ms=config.lease_ms,
        )
        for name in ("n1", "n2")
    }
    world.endpoints.update(nodes)
    world.endpoints[MANAGER] = Sink(MANAGER)
    world.endpoints[CLIENT] = Sink(CLIENT)
    nodes["n2"].up = False
    n1 = nodes["n1"]
    n1.replicas[0].store.chain, n1.replicas[0].store.epoch = ("n1", "n2"), 1
    n1.start()
    world.run_until(50)
    assert n1.replicas[0].head_ready
    return world, n1


def produce(node: Node, op: int, value: str) -> Replies:
    replies: Replies = []

    def reply(status: str, first: int, last: int) -> None:
        assert status != "refused"
        replies.append((status == "ok", first, last))

    node.replicas[0].produce((("k", value, "", 0),), "", 0, reply)
    return replies


def test_a_demoted_head_fails_its_waiting_producers() -> None:
    world, n1 = world_of(3756)
    replica = n1.replicas[0]
    first = produce(n1, 1, "first")
    world.run_until(100)
    assert first == []  # n2 is down: seq 1 does not commit
    n1.on_chain(0, ("n2",), 2)
    assert first == [(False, 1, 1)]
    # Rolled back off the history it wrote alone, then head again, sole member: another write
    # takes seq 1 and commits. The first producer is answered once, with a failure.
    replica.roll_back(0, None)
    world.run_until(150)
    assert replica.store.last() == 0
    n1.on_chain(0, ("n1",), 3)
    world.run_until(200)
    assert replica.head_ready
    replica.writes_held_until = -float("inf")  # the manager's release (not modelled here)
    second = produce(n1, 2, "second")
    world.run_until(300)
    assert second == [(True, 1, 1)]
    assert first == [(False, 1, 1)]


def test_a_head_that_keeps_its_place_keeps_its_producers() -> None:
    world, n1 = world_of(3757)
    first = produce(n1, 1, "first")
    world.run_until(100)
    n1.on_chain(0, ("n1", "n2"), 2)  # a new epoch, the same place (the manager's other shard)
    world.run_until(150)
    assert first == []
    n1.on_chain(0, ("n1",), 3)  # n2 removed: the head's downstreams change
    assert first == [(False, 1, 1)]
