"""Every HTTP route and binary request kind of a node, walked with no credential, a wrong secret,
an unknown name, and each role (docs/security.md, "Roles"), against a live node that holds
credentials: each answer is 401 or 403 exactly where ``kayos.auth.rules`` says (the pure decision
on the node's own table), a refused request is counted in ``kayos_auth_refusals_total`` and an
allowed one is not, and after every refusal the node's state reads back unchanged."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from kayos.auth.rules import HTTP_RULES, Rule, binary_rule, decide, http_rule
from kayos.auth.table import CredentialsTable, parse_table
from kayos.client.auth import ClientCredential, load_credential
from kayos.client.binary import BinaryConnection
from kayos.errors import KayosError
from kayos.local.cluster import LocalCluster
from kayos.replication.wire.frames import Produce, WaitCommitted
from tests.support.cluster import produce_ok
from tests.support.security.credentials import (
    GRANTS,
    add_credentials,
    as_cluster,
    request,
    stolen_but_wrong,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUEUE = "orders.q"
GROUP = "g1"
# Every node route with a request for it: (method, route, path, body).
WALK: list[tuple[str, str, str, Any]] = [
    ("GET", "/metrics", "/metrics", None),
    ("GET", "/v1/topology", "/v1/topology", None),
    ("POST", "/v1/admin/topology", "/v1/admin/topology", {}),
    ("GET", "/v1/status", "/v1/status", None),
    ("POST", "/v1/queues/{queue}/messages", f"/v1/queues/{QUEUE}/messages",
     {"messages": [{"key": "walk", "value": "x"}]}),
    ("GET", "/v1/queues/{queue}/consume", f"/v1/queues/{QUEUE}/consume?group={GROUP}", None),
    ("POST", "/v1/queues/{queue}/groups/{group}/commit",
     f"/v1/queues/{QUEUE}/groups/{GROUP}/commit", {"hwm": 1}),
    ("GET", "/v1/queues/{queue}/groups/{group}", f"/v1/queues/{QUEUE}/groups/{GROUP}", None),
    ("DELETE", "/v1/queues/{queue}/groups/{group}", f"/v1/queues/{QUEUE}/groups/other", None),
    ("PUT", "/v1/queues/{queue}/retention", f"/v1/queues/{QUEUE}/retention",
     {"max_age_ms": 86_400_000}),
    ("GET", "/v1/queues/{queue}/retention", f"/v1/queues/{QUEUE}/retention", None),
    ("GET", "/v1/shards/{shard}/groups", "/v1/shards/0/groups", None),
    ("GET", "/v1/shards/{shard}/committed", "/v1/shards/0/committed?seq=0", None),
    ("POST", "/v1/admin/catch-up", "/v1/admin/catch-up", {}),
    ("POST", "/v1/admin/lease", "/v1/admin/lease", {}),
    ("POST", "/v1/admin/write-hold", "/v1/admin/write-hold", {}),
    ("POST", "/v1/admin/followers", "/v1/admin/followers", {}),
    ("POST", "/v1/admin/compact", "/v1/admin/compact", {}),
    ("POST", "/v1/admin/secrets", "/v1/admin/secrets", {}),
    ("GET", "/v1/admin/watch", "/v1/admin/watch", None),
    ("GET", "/v1/admin/compact", "/v1/admin/compact", None),
    ("GET", "/v1/shards/{shard}/digest", "/v1/shards/0/digest?after=0&upto=1", None),
    ("GET", "/v1/shards/{shard}/check", "/v1/shards/0/check", None),
    ("GET", "/v1/admin/credentials", "/v1/admin/credentials", None),
    ("POST", "/v1/admin/credentials", "/v1/admin/credentials", None),  # body: the table itself
]  # fmt: skip
# Who knocks: a name from GRANTS, or one of these.
STRANGERS = ("no credential", "wrong secret", "unknown name")
_REFUSALS = re.compile(r"^kayos_auth_refusals_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


def refusals(url: str) -> float:
    status, text = request(url, "GET", "/metrics")
    assert status == 200
    return sum(float(value) for value in _REFUSALS.findall(text))


def state(cluster: LocalCluster) -> Any:
    """What a refused request must not change, read back as the cluster itself."""
    node = cluster.ids[0]
    status = as_cluster(cluster, node, "/v1/status")
    shards = {
        shard: (entry.get("last_seq"), entry.get("committed_seq"), entry.get("retention"))
        for shard, entry in status["shards"].items()
    }
    return (
        status["epoch"],
        shards,
        {
            key: value
            for key, value in as_cluster(
                cluster, node, f"/v1/queues/{QUEUE}/groups/{GROUP}"
            ).items()
            if key in ("hwm", "boundary", "state")  # not its lag, which time moves
        },
        as_cluster(cluster, node, f"/v1/queues/{QUEUE}/retention"),
        as_cluster(cluster, node, "/v1/admin/credentials"),
    )


def who_is(
    knocker: str, table: CredentialsTable, files: dict[str, Path], tmp: Path
) -> tuple[Any, str | None, ClientCredential | None]:
    """(who the node should take the knocker for, the refusal reason, the credential sent)."""
    if knocker == "no credential":
        return None, "missing", None
    if knocker == "wrong secret":
        return None, "bad_proof", load_credential(str(stolen_but_wrong(tmp, "ops")))
    if knocker == "unknown name":
        return None, "unknown", load_credential(str(stolen_but_wrong(tmp, "nobody")))
    return table.credentials[knocker], None, load_credential(str(files[knocker]))


def test_the_walk_covers_every_node_route() -> None:
    manager = {key for key in HTTP_RULES if key[1].startswith("/v1/manager/")}
    assert {(method, route) for method, route, _, _ in WALK} == set(HTTP_RULES) - manager


def test_every_route_and_request_kind_refuses_exactly_where_the_table_says(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=1, replicas=1) as cluster:
        url = cluster.url(cluster.ids[0])
        produce_ok(url, QUEUE, [("seed", "v")])
        files = add_credentials(cluster, tmp_path)
        table = parse_table(as_cluster(cluster, cluster.ids[0], "/v1/admin/credentials"))
        assert not table.is_open
        checked = {"refused": 0, "allowed": 0}
        for knocker in (*STRANGERS, *GRANTS):
            who, reason, sent = who_is(knocker, table, files, tmp_path)
            for method, route, path, body in WALK:
                rule = http_rule(method, route)
                queue = QUEUE if rule.scope == "queue" else None
                expected = decide(table, who, rule, queue, reason)
                if route == "/v1/admin/credentials" and method == "POST":
                    body = {"table": table.to_json()}  # the same version: changes nothing
                before_state = state(cluster) if not expected.allowed else None
                before = refusals(url)
                status, reply = request(url, method, path, body, sent, timeout_s=10)
                after = refusals(url)
                what = f"{knocker}: {method} {path} -> {status} {reply!r:.200}"
                if expected.allowed:
                    assert status not in (401, 403) or rule.role == "signed", what
                    assert after == before, what
                    checked["allowed"] += 1
                    continue
                assert status == expected.status, what
                code = "forbidden" if status == 403 else "unauthenticated"
                assert reply["error"]["code"] == code, what
                assert after == before + 1, what
                assert state(cluster) == before_state, what
                checked["refused"] += 1
            asyncio.run(walk_binary(cluster, table, knocker, who, sent))
        print(f"checked {checked}")
        assert checked["refused"] > 50
        assert checked["allowed"] > 30


async def walk_binary(
    cluster: LocalCluster, table: CredentialsTable, knocker: str, who: Any, sent: Any
) -> None:
    address = cluster.topology.nodes[cluster.ids[0]]
    before_state = state(cluster)
    opening = BinaryConnection.open(
        cluster.ids[0], address.host, address.bin_port, name="walk", credential=sent
    )
    if who is None:  # refused at its handshake: no request is ever read
        with pytest.raises(KayosError) as refused_at_hello:
            await opening
        assert refused_at_hello.value.code == "unauthenticated", knocker
        assert state(cluster) == before_state
        return
    connection = await opening
    assert who is not None, knocker
    try:
        frames = {
            "PRODUCE": lambda rid: Produce(rid, QUEUE, (b"bin",), (b"v",), None, None, -1, False),
            "WAIT_COMMITTED": lambda rid: WaitCommitted(rid, 0, 0, 0),
        }
        for kind, make in frames.items():
            rule: Rule = binary_rule(kind)
            expected = decide(table, who, rule, QUEUE if rule.scope == "queue" else None)
            before_state = state(cluster)
            try:
                await connection.request(make, 10.0)
                refused = None
            except KayosError as exc:
                refused = exc.code
            what = f"{knocker}: binary {kind} -> {refused}"
            if expected.allowed:
                assert refused is None, what
            else:
                assert refused == "forbidden", what
                assert state(cluster) == before_state, what
    finally:
        await connection.close()


def test_a_group_commit_relayed_to_the_head_carries_the_clients_own_proof(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=3, replicas=3, shards=1) as cluster:
        head = cluster.topology.shards[0].head
        tail = next(node for node in cluster.ids if node != head)
        produce_ok(cluster.url(head), QUEUE, [("k", "v")])
        files = add_credentials(cluster, tmp_path)
        consumer = load_credential(str(files["consumer"]))
        path = f"/v1/queues/{QUEUE}/groups/relayed/commit"
        status, reply = request(cluster.url(tail), "POST", path, {"hwm": 1}, consumer)
        assert status == 200, reply
        mark = as_cluster(cluster, head, f"/v1/queues/{QUEUE}/groups/relayed")
        assert mark["hwm"] == 1
        producer = load_credential(str(files["producer"]))
        status, reply = request(cluster.url(tail), "POST", path, {"hwm": 1}, producer)
        assert status == 403, reply
