"""The operator face sends what its entry's actions ask for at once (kayos/manager/member/http.py,
docs/manager.md "The driver loop"): a move's catch-up order goes to the leading driver as the
request is answered, not on a later round; a refused request sends nothing. A real aiohttp server
on 127.0.0.1 with the member's state faked (its log is ``decide`` in memory)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kayos.manager import Action, AddNode, Config, Event, ManagerView, StartCatchUp, decide
from kayos.manager.member.config import ManagerSetup, MemberAddr
from kayos.manager.member.http import MemberState, make_app
from kayos.manager.member.plan import signed
from kayos.topology import NodeAddr, rotated
from tests.support.links import TEST_IDENTITY

pytestmark = pytest.mark.unit


class FakeMember:
    """The member's side the face reads: a view ``decide`` moves on, and the sends asked for."""

    def __init__(self) -> None:
        nodes = [NodeAddr(n, "127.0.0.1", 1 + i, 100 + i) for i, n in enumerate("abcd")]
        self.base = rotated(nodes, replicas=3)
        chains = [s.chain for s in self.base.shards.values()]
        self.the_view = ManagerView.bootstrap(Config(), list(self.base.nodes), chains)
        self.sent: list[tuple[ManagerView, tuple[Action, ...]]] = []

    async def submit(self, events: list[Event]) -> tuple[ManagerView, tuple[Action, ...]]:
        actions: list[Action] = []
        for event in events:
            self.the_view, more = decide(self.the_view, event)
            actions += more
        return self.the_view, tuple(actions)

    def state(self) -> MemberState:
        member = MemberAddr("m1", "127.0.0.1", 1, 2)
        setup = ManagerSetup(self.base, (member,), Config(), TEST_IDENTITY)
        return MemberState(
            "m1", setup, lambda: (self.the_view, ""), lambda: (0, []),
            lambda: ([], 0), lambda: "m1", lambda: 1, lambda: True, self.submit,
            lambda view, actions: self.sent.append((view, actions)),
        )  # fmt: skip


async def post(client: TestClient[Any, Any], body: dict[str, Any]) -> tuple[int, Any]:
    reply = await client.post("/v1/manager/operator", json=signed(TEST_IDENTITY, "operator", body))
    return reply.status, await reply.json()


@pytest.mark.asyncio
async def test_a_moves_catch_up_order_is_sent_as_the_request_is_answered() -> None:
    fake = FakeMember()
    shard = next(s for s in fake.the_view.shards if "d" not in s.chain)
    source = shard.chain[1]
    async with TestClient(TestServer(make_app(fake.state()))) as client:
        move = {"op": "move-shard", "shard": shard.id, "source": source, "target": "d"}
        # Refused (the target already holds the shard): nothing logged, nothing sent.
        held = next(s for s in fake.the_view.shards if "d" in s.chain)
        status, _ = await post(client, {**move, "shard": held.id, "epoch": fake.the_view.epoch})
        assert status == 400
        assert fake.sent == []
        status, reply = await post(client, {**move, "epoch": fake.the_view.epoch})
        assert status == 200, reply
    assert len(fake.sent) == 1
    view, actions = fake.sent[0]
    assert view is fake.the_view
    orders = [a for a in actions if isinstance(a, StartCatchUp)]
    assert [(o.node, o.shard) for o in orders] == [("d", shard.id)]


@pytest.mark.asyncio
async def test_a_node_added_at_runtime_can_be_removed() -> None:
    """``kayos ctl remove-node`` of a node ``kayos ctl add-node`` added: the face checked the name
    against the managers' topology file only, so it answered ``unknown node`` and the node stayed
    in the view for good (found by the drain_under_fault campaign, which retires drained nodes).
    A name the view does not hold is still refused."""
    fake = FakeMember()
    await fake.submit([AddNode("e", "127.0.0.1", 9, 109)])
    async with TestClient(TestServer(make_app(fake.state()))) as client:
        for node, expected in (("e", 200), ("zz", 400)):
            body = {"node": node}
            reply = await client.post(
                "/v1/manager/remove-node", json=signed(TEST_IDENTITY, "remove-node", body)
            )
            assert reply.status == expected, await reply.json()
    found = fake.the_view.node("e")
    assert found is not None
    assert found.state == "removed"
