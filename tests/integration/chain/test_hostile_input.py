"""Hostile input at a real 3-node chain (issue 10): every request below gets a defined 4xx with a
message, and afterwards every replica's log and the queue's content are as they were, every
replication link is still up, and no seq was used up (the next acked produce gets the next one).

Also here, on the same cluster: the lag of a group is the same on every member and counts only
the group's queue, and the blocking client's read/list_groups/delete_group work end to end."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgpack
import pytest

from kayos import limits
from kayos.client import Client
from kayos.client.binary import BinaryConnection
from kayos.errors import InvalidRequest
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.replication.wire.frames import (
    PROTOCOL_VERSION,
    ErrorFrame,
    Hello,
    Produce,
    decode,
    encode,
)
from tests.support.cluster import (
    PRODUCE_TIMEOUT_S,
    WAIT_S,
    answered_status,
    fingerprint,
    http_raw,
    produce_ok,
    read_snapshot,
    wait_until,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

QUEUE = "hostile"
JSON = "application/json"
MSGPACK = "application/msgpack"
U64_END = 2**64


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("hostile")
    with LocalCluster(base / "cluster", nodes=3, replicas=3) as running:
        produce_ok(running.url(running.head_of(QUEUE)), QUEUE, [("x", "1"), ("y", "2")])
        running.wait_replicated()
        yield running


def link_count(cluster: LocalCluster) -> int:
    """Replication link ends up, over every member of every shard (GET /v1/status)."""
    count = 0
    for node in cluster.topology.nodes:
        status = answered_status(cluster, node)
        for replica in status["shards"].values():
            count += int(bool(replica["upstream_linked"])) + len(replica["downstreams_linked"])
    return count


def expected_links(cluster: LocalCluster) -> int:
    """Both ends of every link: each member below a head has one link to its upstream."""
    return sum(2 * (len(shard.members) - 1) for shard in cluster.topology.shards.values())


def head_url(cluster: LocalCluster) -> str:
    return cluster.url(cluster.head_of(QUEUE))


def messages_url(cluster: LocalCluster) -> str:
    return f"{head_url(cluster)}/v1/queues/{QUEUE}/messages?acks=all"


def head_last_seq(cluster: LocalCluster) -> int:
    head = cluster.head_of(QUEUE)
    status = answered_status(cluster, head)
    return int(status["shards"][str(cluster.topology.shard_for(QUEUE))]["last_seq"])


def assert_harmless(
    cluster: LocalCluster, send: Callable[[], tuple[int, Any]], status: int, code: str
) -> str:
    """Sends one hostile request; checks its reply and that it changed and broke nothing."""
    # Every link is up before (the cluster may have just started).
    links = expected_links(cluster)
    wait_until(lambda: link_count(cluster) == links, "every link end up")
    before = fingerprint(cluster, QUEUE)
    last_seq = head_last_seq(cluster)
    got_status, body = send()
    assert isinstance(body, dict), (got_status, body)
    assert "error" in body, (got_status, body)
    assert (got_status, body["error"]["code"]) == (status, code), body
    message = str(body["error"]["message"])
    assert message
    assert fingerprint(cluster, QUEUE) == before, "a refused request changed nothing"
    assert link_count(cluster) == links, "every replication link is still up"
    first, _ = produce_ok(head_url(cluster), QUEUE, [("after", "ok")])
    assert first == last_seq + 1, "the refused request used up no seq"
    return message


# --- produce bodies -------------------------------------------------------------------------------


def test_expiry_past_u64(cluster: LocalCluster) -> None:
    body = {"messages": [{"key": "k", "value": "v", "expiry_ms": U64_END}]}
    message = assert_harmless(
        cluster,
        lambda: http_json(messages_url(cluster), method="POST", body=body),
        400,
        "invalid_request",
    )
    assert "expiry_ms" in message


def test_expiry_at_u64_max_is_stored(cluster: LocalCluster) -> None:
    """The largest expiry the wire holds is taken, and goes down the chain."""
    body = {"messages": [{"key": "far", "value": "v", "expiry_ms": U64_END - 1}]}
    status, reply = http_json(
        messages_url(cluster), method="POST", body=body, timeout_s=PRODUCE_TIMEOUT_S
    )
    assert status == 200, reply
    assert link_count(cluster) == expected_links(cluster)


def test_json_nested_100000_deep(cluster: LocalCluster) -> None:
    raw = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    message = assert_harmless(
        cluster, lambda: http_raw(messages_url(cluster), raw, JSON), 400, "invalid_request"
    )
    assert "json_depth_max" in message


def test_msgpack_nested_deep(cluster: LocalCluster) -> None:
    raw = b"\x81\xa8messages" + b"\x91" * 100_000 + b"\xc0"
    assert_harmless(
        cluster, lambda: http_raw(messages_url(cluster), raw, MSGPACK), 400, "protocol_error"
    )


def test_misspelt_value_deletes_nothing(cluster: LocalCluster) -> None:
    body = {"messages": [{"key": "x", "valeu": "oops"}]}
    message = assert_harmless(
        cluster,
        lambda: http_json(messages_url(cluster), method="POST", body=body),
        400,
        "invalid_request",
    )
    assert "valeu" in message
    tail = cluster.url(cluster.tails_of(QUEUE)[0])
    keys = {m["key"]: m["value"] for m in read_snapshot(tail, QUEUE, "observer").messages}
    assert keys["x"] == "1", "the key is still there"


@pytest.mark.parametrize(
    "message",
    [
        {"key": "x", "value": None},
        {"key": "x"},
        {"key": "x", "delete": True, "value": "v"},
        {"key": "x", "delete": "yes"},
    ],
    ids=["null-value", "no-value", "delete-with-value", "delete-not-bool"],
)
def test_a_delete_is_said_explicitly(cluster: LocalCluster, message: dict[str, Any]) -> None:
    body = {"messages": [message]}
    assert_harmless(
        cluster,
        lambda: http_json(messages_url(cluster), method="POST", body=body),
        400,
        "invalid_request",
    )


def test_explicit_delete_deletes(cluster: LocalCluster) -> None:
    url = head_url(cluster)
    produce_ok(url, QUEUE, [("doomed", "v")])
    body = {"messages": [{"key": "doomed", "delete": True}]}
    status, reply = http_json(
        messages_url(cluster), method="POST", body=body, timeout_s=PRODUCE_TIMEOUT_S
    )
    assert status == 200, reply
    tail = cluster.url(cluster.tails_of(QUEUE)[0])
    doomed = [m for m in read_snapshot(tail, QUEUE, "observer").messages if m["key"] == "doomed"]
    assert [m["deleted"] for m in doomed] == [True]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"key": "k", "value": "v"}], "acks": "all"},
        {"messages": [{"key": "k", "value": "v", "expiry": 5}]},
        {"messages": [{"key": "k", "value": "v"}], "txn": "no"},
    ],
    ids=["top-level", "in-a-message", "txn-not-bool"],
)
def test_unknown_or_mistyped_fields(cluster: LocalCluster, body: dict[str, Any]) -> None:
    assert_harmless(
        cluster,
        lambda: http_json(messages_url(cluster), method="POST", body=body),
        400,
        "invalid_request",
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"key": "\\ud800", "value": "v"}]}',
        b'{"messages": [{"key": "k", "value": "v", "headers": {"\\udfff": "x"}}]}',
    ],
    ids=["key", "header-name"],
)
def test_lone_surrogate_text(cluster: LocalCluster, raw: bytes) -> None:
    message = assert_harmless(
        cluster, lambda: http_raw(messages_url(cluster), raw, JSON), 400, "invalid_request"
    )
    assert "Unicode" in message


def test_acks_0_refuses_what_the_store_would(cluster: LocalCluster) -> None:
    """An acks=0 produce is answered once the batch is checked, so a bad one is still a 413."""
    header = "h" * (limits.headers_bytes_max + 1)
    body = {"messages": [{"key": "k", "value": "v", "headers": {"h": header}}]}
    url = f"{head_url(cluster)}/v1/queues/{QUEUE}/messages?acks=0"
    assert_harmless(
        cluster, lambda: http_json(url, method="POST", body=body), 413, "limit_exceeded"
    )


def test_empty_key_is_a_400(cluster: LocalCluster) -> None:
    body = {"messages": [{"key": "", "value": "v"}]}
    message = assert_harmless(
        cluster,
        lambda: http_json(messages_url(cluster), method="POST", body=body),
        400,
        "invalid_request",
    )
    assert "empty" in message


# --- query parameters and group commits -----------------------------------------------------------


def consume_url(cluster: LocalCluster, query: str) -> str:
    tail = cluster.url(cluster.tails_of(QUEUE)[0])
    return f"{tail}/v1/queues/{QUEUE}/consume?group=g&{query}"


@pytest.mark.parametrize(
    "query",
    [
        f"after={U64_END}",
        f"upto={U64_END}",
        "after=-1",
        "after=1e3",
        "after=" + "9" * 5000,
        "limit=0",
        f"limit={limits.consume_page_entries_max + 1}",
        f"wait_ms={limits.consume_wait_ms_max + 1}",
    ],
    ids=[
        "after-u64",
        "upto-u64",
        "after-negative",
        "after-float",
        "after-5000-digits",
        "limit-0",
        "limit-over-max",
        "wait-over-max",
    ],
)
def test_bad_consume_parameter(cluster: LocalCluster, query: str) -> None:
    message = assert_harmless(
        cluster, lambda: http_json(consume_url(cluster, query)), 400, "invalid_request"
    )
    assert query.split("=")[0] in message


def test_after_at_u64_max_is_an_empty_page(cluster: LocalCluster) -> None:
    status, page = http_json(consume_url(cluster, f"after={U64_END - 1}"))
    assert status == 200, page
    assert page["messages"] == []
    assert page["end"] is True


@pytest.mark.parametrize("at_head", [True, False], ids=["at-the-head", "relayed"])
def test_commit_hwm_past_u64(cluster: LocalCluster, at_head: bool) -> None:
    head = cluster.head_of(QUEUE)
    node = head if at_head else next(n for n in cluster.topology.nodes if n != head)
    url = f"{cluster.url(node)}/v1/queues/{QUEUE}/groups/g/commit"
    assert_harmless(
        cluster,
        lambda: http_json(url, method="POST", body={"hwm": U64_END}),
        400,
        "invalid_request",
    )


def test_commit_unknown_field(cluster: LocalCluster) -> None:
    url = f"{head_url(cluster)}/v1/queues/{QUEUE}/groups/g/commit"
    assert_harmless(
        cluster,
        lambda: http_json(url, method="POST", body={"hwm": 1, "hmw": 2}),
        400,
        "invalid_request",
    )


def test_committed_seq_past_u64(cluster: LocalCluster) -> None:
    shard = cluster.topology.shard_for(QUEUE)
    url = f"{head_url(cluster)}/v1/shards/{shard}/committed?seq={U64_END}"
    assert_harmless(cluster, lambda: http_json(url), 400, "invalid_request")


def test_client_refuses_out_of_range_before_sending(cluster: LocalCluster) -> None:
    before = fingerprint(cluster, QUEUE)
    with Client(head_url(cluster)) as client:
        with pytest.raises(InvalidRequest, match="hwm"):
            client.commit(QUEUE, "g", U64_END)
        with pytest.raises(InvalidRequest, match="expiry_ms"):
            client.produce(QUEUE, "k", "v", expiry_ms=U64_END)
        with pytest.raises(InvalidRequest, match="empty"):
            client.produce(QUEUE, "", "v")
        with pytest.raises(InvalidRequest, match="after"):
            client.read(QUEUE, after=U64_END)
        with pytest.raises(InvalidRequest, match="seq"):
            client.wait_committed(QUEUE, U64_END, 0.0)
    assert fingerprint(cluster, QUEUE) == before


# --- the binary port ------------------------------------------------------------------------------


def test_binary_produce_with_an_empty_key(cluster: LocalCluster) -> None:
    """A refused PRODUCE is answered with an ERROR and the connection carries on."""
    address = cluster.topology.nodes[cluster.head_of(QUEUE)]
    last_seq = head_last_seq(cluster)

    async def run() -> tuple[Any, Any]:
        connection = await BinaryConnection.open(
            address.id, address.host, address.bin_port, name="hostile"
        )
        try:
            with pytest.raises(InvalidRequest, match="empty") as refused:
                await connection.request(
                    lambda rid: Produce(rid, QUEUE, (b"",), (b"v",), None, None, -1, False),
                    WAIT_S,
                )
            assert connection.alive
            reply = await connection.request(
                lambda rid: Produce(rid, QUEUE, (b"k",), (b"v",), None, None, -1, False),
                PRODUCE_TIMEOUT_S,
            )
            return refused.value, reply
        finally:
            await connection.close()

    before = link_count(cluster)
    _, reply = asyncio.run(run())
    assert (reply.first_seq, reply.last_seq) == (last_seq + 1, last_seq + 1)
    assert link_count(cluster) == before


def _raw_exchange(cluster: LocalCluster, payload: bytes) -> list[Any]:
    """HELLO as a client, then ``payload``; the frames the node sends until it closes."""
    address = cluster.topology.nodes[cluster.head_of(QUEUE)]
    with socket.create_connection((address.host, address.bin_port), timeout=WAIT_S) as sock:
        sock.sendall(encode(Hello(PROTOCOL_VERSION, "hostile", None, 0, "client")) + payload)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return decode(received)


def _frame(kind: int, body: bytes) -> bytes:
    return struct.pack(">IB", len(body) + 1, kind) + body


@pytest.mark.parametrize(
    "payload",
    [
        _frame(32, msgpack.packb([1, QUEUE, [b"k"], [b"v"], [-1], None, -1, False])),
        _frame(32, msgpack.packb([1, QUEUE, [b"k"], [b"v"], None, None, 7, False])),
        _frame(32, b"\x91" * 10_000 + b"\xc0"),
        _frame(200, b"\x90"),
        b"\xff\xff\xff\xff\x20",
        _frame(18, msgpack.packb([0, 1, 1, True, [1], [b"k"], [b"v"], None, None, None])),
    ],
    ids=["negative-expiry", "bad-acks", "nested", "unknown-kind", "huge-length", "batch"],
)
def test_binary_port_bad_frames(cluster: LocalCluster, payload: bytes) -> None:
    def send() -> tuple[int, Any]:
        frames = _raw_exchange(cluster, payload)
        errors = [f for f in frames if isinstance(f, ErrorFrame)]
        assert errors, frames
        return 400, {"error": {"code": errors[-1].code, "message": errors[-1].message}}

    assert_harmless(cluster, send, 400, "protocol_error")


# --- lag and the blocking client ------------------------------------------------------------------


def _same_shard_queue(cluster: LocalCluster, queue: str) -> str:
    shard = cluster.topology.shard_for(queue)
    return next(
        name
        for name in (f"{queue}-other-{i}" for i in range(1000))
        if cluster.topology.shard_for(name) == shard
    )


def test_lag_is_the_same_on_every_member_and_counts_only_its_queue(cluster: LocalCluster) -> None:
    queue = "lagging"
    other = _same_shard_queue(cluster, queue)
    url = cluster.url(cluster.head_of(queue))
    produce_ok(url, queue, [("a", "1"), ("b", "2"), ("c", "3")])
    produce_ok(url, other, [("a", "1"), ("b", "2")])

    def lags() -> dict[str, tuple[int, bool]]:
        found = {}
        for node in cluster.topology.nodes:
            status, info = http_json(f"{cluster.url(node)}/v1/queues/{queue}/groups/g")
            assert status == 200, info
            found[node] = (info["lag"], info["lag_complete"])
        return found

    wait_until(lambda: set(lags().values()) == {(3, True)}, "lag 3 on every member")
    tail = cluster.url(cluster.tails_of(queue)[0])
    snapshot = read_snapshot(tail, queue, "g")
    status, reply = http_json(
        f"{url}/v1/queues/{queue}/groups/g/commit",
        method="POST",
        body={"hwm": snapshot.boundary},
        timeout_s=PRODUCE_TIMEOUT_S,
    )
    assert status == 200, reply
    produce_ok(url, other, [("c", "3")])  # another queue's entry after the mark: still no lag
    wait_until(lambda: set(lags().values()) == {(0, True)}, "lag 0 on every member")


def test_blocking_client_reads_lists_and_deletes_groups(cluster: LocalCluster) -> None:
    with Client(head_url(cluster)) as client:
        seq = client.produce(QUEUE, "sync", "v")
        page = client.read(QUEUE, after=seq - 1, limit=10)
        assert [(m.seq, m.key) for m in page.messages] == [(seq, b"sync")]
        client.commit(QUEUE, "sync-group", seq)
        assert (QUEUE, "sync-group", seq) in client.list_groups()
        client.delete_group(QUEUE, "sync-group")
        assert all(group != "sync-group" for _, group, _ in client.list_groups())
        first, last = client.produce_batch(QUEUE, [("b1", "v"), ("b2", None)])
        # acks="all" by default: committed on every member once answered.
        assert client.wait_committed(QUEUE, last, WAIT_S)
        assert last == first + 1


def test_json_body_at_the_depth_bound_is_taken(cluster: LocalCluster) -> None:
    """Nesting up to json_depth_max is fine (headers are 3 levels down)."""
    body = {"messages": [{"key": "h", "value": "v", "headers": {"a": "b"}}]}
    raw = json.dumps(body).encode()
    status, reply = http_raw(messages_url(cluster), raw, JSON)
    assert status == 200, reply
