"""The node's side of the manager's evidence (docs/node-api.md, "Incarnation and the manager's
watch", "Reporting a lost neighbour"): the watch streams beats with the incarnation, is bounded,
and ends with a goodbye once the lease has ended; reports of a lost neighbour are rate limited and
only for failures that say the peer went away; the topology carries the members' URLs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kayos import limits
from kayos.errors import InvalidRequest, KayosError, UnavailableError
from kayos.node.reports import SuspectReports, due
from kayos.node.watch import Watches, beat_line, bye_line
from kayos.replication.logic.lease import Asked, Ended, Granted, LeaseState, NodeLease, holds
from kayos.replication.logic.lease import decide as lease_decide
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

INCARNATION = "0123456789abcdef"


def watch_app(watches: Watches) -> web.Application:
    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except KayosError as exc:
            return web.json_response({"error": {"code": exc.code}}, status=503)

    app = web.Application(middlewares=[errors])
    app.router.add_get("/v1/admin/watch", watches.serve)
    return app


@pytest.mark.asyncio
async def test_a_watch_beats_with_the_incarnation_and_ends_with_a_goodbye() -> None:
    watches = Watches(INCARNATION)
    async with TestClient(TestServer(watch_app(watches))) as client:
        response = await client.get("/v1/admin/watch")
        assert response.status == 200
        assert response.content_type == "application/x-ndjson"
        lines = [json.loads(await response.content.readline()) for _ in range(3)]
        assert lines == [{"incarnation": INCARNATION, "beat": n} for n in range(3)]
        assert watches.open == 1
        await asyncio.wait_for(watches.goodbye(), 5.0)
        rest = [json.loads(line) for line in (await response.content.read()).splitlines()]
        assert rest[-1] == {"bye": True, "incarnation": INCARNATION}
        assert all(line.get("incarnation") == INCARNATION for line in rest)
        assert watches.open == 0
        # A stopping node takes no new watch.
        again = await client.get("/v1/admin/watch")
        assert again.status == 503


@pytest.mark.asyncio
async def test_watches_past_the_bound_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "node_watchers_max", 2)
    watches = Watches(INCARNATION)
    async with TestClient(TestServer(watch_app(watches))) as client:
        first = await client.get("/v1/admin/watch")
        second = await client.get("/v1/admin/watch")
        assert (first.status, second.status) == (200, 200)
        third = await client.get("/v1/admin/watch")
        assert third.status == 503
        first.close()  # the watcher goes away: its place is free again
        for _ in range(200):
            if watches.open < 2:
                break
            await asyncio.sleep(0.01)  # a bounded wait for the server to see the close
        assert watches.open < 2
        fourth = await client.get("/v1/admin/watch")
        assert fourth.status == 200
        await watches.goodbye()


@pytest.mark.asyncio
async def test_goodbye_does_not_wait_past_its_bound_for_a_watcher_that_never_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "node_goodbye_ms_max", 50)
    watches = Watches(INCARNATION)
    watches.open = 1  # a watcher stuck in a write
    watches.idle.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await watches.goodbye()
    assert loop.time() - started < 2.0
    with pytest.raises(UnavailableError):
        await watches.serve(None)  # type: ignore[arg-type]


def test_the_lines_are_one_json_object_each() -> None:
    assert beat_line(INCARNATION, 7) == b'{"incarnation": "0123456789abcdef", "beat": 7}\n'
    assert bye_line(INCARNATION) == b'{"bye": true, "incarnation": "0123456789abcdef"}\n'


def test_an_ended_lease_holds_no_more_and_takes_no_grant() -> None:
    state, _ = lease_decide(LeaseState(managed=True, epoch=3), Asked(10.0))
    state, _ = lease_decide(state, Granted(1, 3, True))
    assert holds(state, 10.1)
    state, notes = lease_decide(state, Ended())
    assert notes == ("lease ended: the node is stopping",)
    assert not holds(state, 10.1)
    state, _ = lease_decide(state, Asked(10.2))
    state, _ = lease_decide(state, Granted(state.nonce, 3, True))
    assert not holds(state, 10.2)
    # Without a manager nothing can splice the chain: a stopping node's lease still holds.
    unmanaged, _ = lease_decide(LeaseState(managed=False, epoch=3), Ended())
    assert holds(unmanaged, 0.0)
    lease = NodeLease(managed=True, epoch=1)
    assert lease.granted(lease.ask(), 1, True)
    lease.end()
    assert lease.remaining_ms() == 0
    assert not lease.holds()


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def monotonic_s(self) -> float:
        return self.now_s

    def time_s(self) -> float:
        return self.now_s


def test_reports_are_rate_limited_per_neighbour_and_only_for_a_lost_peer() -> None:
    clock = FakeClock()
    sent: list[Any] = []

    def spawn(coro: Any) -> Any:
        sent.append(coro)
        coro.close()  # not run: only what would be sent counts here
        return None

    reports = SuspectReports("a", lambda: ["http://127.0.0.1:7401"], clock, spawn)  # type: ignore[arg-type]
    reports.peer_lost("b", ConnectionRefusedError())
    reports.peer_lost("b", ConnectionResetError())  # within the interval: not again
    reports.peer_lost("c", EOFError())
    reports.peer_lost("c", InvalidRequest("wrong role"))  # a refusal of its own: not lost
    reports.peer_lost("a", None)  # itself: never
    assert reports.sent == 2
    clock.now_s += limits.node_suspect_report_interval_ms_min / 1000
    reports.peer_lost("b", None)
    assert reports.sent == 3
    assert len(sent) == 3
    nowhere = SuspectReports("a", list, clock, spawn)  # type: ignore[arg-type]
    nowhere.peer_lost("b", ConnectionResetError())
    assert nowhere.sent == 0  # no manager known: nothing to send
    assert due(None, 0.0)
    assert not due(0.0, 1.0)


def topology(**extra: Any) -> dict[str, Any]:
    return {
        "epoch": 1,
        "nodes": {"a": {"host": "127.0.0.1", "http_port": 7101, "bin_port": 7201}},
        "shards": [{"id": 0, "chain": ["a"]}],
        **extra,
    }


def test_the_topology_carries_the_members_urls_and_reads_the_files_tables() -> None:
    plain = Topology.from_json(topology())
    assert plain.managers == ()
    assert "managers" not in plain.to_json()
    urls = ["http://127.0.0.1:7401", "http://127.0.0.1:7402"]
    signed = Topology.from_json(topology(managers=urls))
    assert signed.managers == tuple(urls)
    assert signed.to_json()["managers"] == urls
    assert Topology.from_json(signed.to_json()) == signed
    tables = {
        "m2": {"host": "127.0.0.1", "raft_port": 7302, "http_port": 7402},
        "m1": {"host": "127.0.0.1", "raft_port": 7301, "http_port": 7401},
    }
    assert Topology.from_json(topology(managers=tables)).managers == tuple(urls)
    assert signed.with_identity(None).managers == tuple(urls)
    for bad in (["ftp://x"], "http://127.0.0.1:7401", [7401], {"m1": {"host": "h"}}):
        with pytest.raises(InvalidRequest):
            Topology.from_json(topology(managers=bad))
    with pytest.raises(InvalidRequest):
        Topology(
            1,
            {"a": NodeAddr("a", "h", 1, 2)},
            {0: ShardChain(0, ("a",))},
            managers=("http://h:1",) * (limits.manager_members_max + 1),
        )
