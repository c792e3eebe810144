"""The members' report endpoints (kayos/manager/member/http.py; docs/manager.md, "HTTP
endpoints"): ``POST /v1/manager/suspect`` only asks the leader's driver to probe (never a chain
change by itself), ``POST /v1/manager/exited`` is signed and names a well-formed incarnation; a
follower answers 421 with the leader's URL. And the supervisor's side: the signed report it
posts (kayos/local/exits.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kayos.datadir import read_incarnation, write_incarnation
from kayos.local.exits import exit_message, report_exit
from kayos.manager import Config, ManagerView, NodeGone, decide
from kayos.manager.member.config import ManagerSetup, MemberAddr
from kayos.manager.member.http import MemberState, make_app
from kayos.signing import check_signed
from kayos.topology import NodeAddr, rotated
from tests.support.links import TEST_IDENTITY

pytestmark = pytest.mark.unit

A1 = "00000000000000a1"


class FakeMember:
    """A member whose driver records what it was asked: probes and exit reports."""

    def __init__(self, leader: str = "m1") -> None:
        nodes = [NodeAddr(n, "127.0.0.1", 1 + i, 100 + i) for i, n in enumerate("abc")]
        self.base = rotated(nodes, replicas=3)
        chains = [s.chain for s in self.base.shards.values()]
        self.the_view = ManagerView.bootstrap(Config(), list(self.base.nodes), chains)
        self.leader = leader
        self.probed: list[str] = []
        self.exits: list[tuple[str, str]] = []

    def suspect(self, node: str) -> bool:
        self.probed.append(node)
        return len(self.probed) == 1  # the second within the interval: rate limited

    async def logged(self, node: str, incarnation: str) -> ManagerView:
        self.exits.append((node, incarnation))
        self.the_view, _ = decide(self.the_view, NodeGone(node, 10, "exited", incarnation))
        return self.the_view

    def state(self) -> MemberState:
        members = (MemberAddr("m1", "127.0.0.1", 1, 2), MemberAddr("m2", "127.0.0.1", 3, 4))
        setup = ManagerSetup(self.base, members, Config(), TEST_IDENTITY)

        async def submit(events: Any) -> Any:
            raise AssertionError("a report logs through the driver")

        return MemberState(
            "m1", setup, lambda: (self.the_view, ""), lambda: (0, []), lambda: ([], 0),
            lambda: self.leader, lambda: 1, lambda: True, submit, lambda view, actions: None,
            self.suspect, self.logged,
        )  # fmt: skip


@pytest.mark.asyncio
async def test_a_suspect_report_makes_the_leader_probe_and_nothing_else() -> None:
    fake = FakeMember()
    async with TestClient(TestServer(make_app(fake.state()))) as client:
        reply = await client.post("/v1/manager/suspect", json={"node": "a"})
        assert (reply.status, await reply.json()) == (202, {"node": "a", "probe": True})
        reply = await client.post("/v1/manager/suspect", json={"node": "a"})
        assert (reply.status, await reply.json()) == (202, {"node": "a", "probe": False})
        for bad in ({"node": "zz"}, {"node": 7}, {}, [1]):
            reply = await client.post("/v1/manager/suspect", json=bad)
            assert reply.status == 400, bad
        reply = await client.post("/v1/manager/suspect", data=b"not json")
        assert reply.status == 400
    assert fake.probed == ["a", "a"]
    assert [n.state for n in fake.the_view.nodes] == ["up", "up", "up"]


@pytest.mark.asyncio
async def test_a_follower_redirects_reports_to_the_leader() -> None:
    fake = FakeMember(leader="m2")
    async with TestClient(TestServer(make_app(fake.state()))) as client:
        reply = await client.post("/v1/manager/suspect", json={"node": "a"})
        assert reply.status == 421
        assert (await reply.json())["error"]["redirect"] == "http://127.0.0.1:4"
        message = exit_message(TEST_IDENTITY, "a", A1, -9)
        reply = await client.post("/v1/manager/exited", json=message)
        assert reply.status == 421
    assert fake.probed == []
    assert fake.exits == []


@pytest.mark.asyncio
async def test_an_exit_report_is_signed_and_names_an_incarnation() -> None:
    fake = FakeMember()
    async with TestClient(TestServer(make_app(fake.state()))) as client:
        forged = {**exit_message(TEST_IDENTITY, "a", A1, -9), "mac": "00" * 32}
        reply = await client.post("/v1/manager/exited", json=forged)
        assert reply.status == 401
        for node, incarnation in (("zz", A1), ("a", "A1"), ("a", "")):
            message = exit_message(TEST_IDENTITY, node, incarnation, -9)
            reply = await client.post("/v1/manager/exited", json=message)
            assert reply.status == 400, (node, incarnation)
        assert fake.exits == []
        message = exit_message(TEST_IDENTITY, "a", A1, 1)
        reply = await client.post("/v1/manager/exited", json=message)
        assert reply.status == 200
        assert (await reply.json())["state"] == "down"
    assert fake.exits == [("a", A1)]


def test_the_supervisors_report_names_the_incarnation_its_node_wrote(tmp_path: Path) -> None:
    message = exit_message(TEST_IDENTITY, "a", A1, -9)
    assert message["body"] == {"node": "a", "incarnation": A1, "code": -9}
    check_signed(TEST_IDENTITY, "exited", message["body"], message["mac"])
    # Nothing written (the process died before it could): nothing to report, nothing sent.
    assert read_incarnation(str(tmp_path)) is None
    outcome = report_exit(TEST_IDENTITY, ["http://127.0.0.1:1"], "a", str(tmp_path), -9)
    assert outcome.startswith("no incarnation")
    write_incarnation(str(tmp_path), A1)
    assert read_incarnation(str(tmp_path)) == A1
    (tmp_path / "incarnation").write_text("garbage\n")
    assert read_incarnation(str(tmp_path)) is None
    write_incarnation(str(tmp_path), A1)
    assert report_exit(TEST_IDENTITY, [], "a", str(tmp_path), -9) == "no manager to report to"
