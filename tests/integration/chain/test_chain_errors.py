"""Bad requests at a real 3-node chain (docs/node-api.md "Errors"): each gets its defined status
and code, and leaves every replica's log and the queue's content as they were."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import fingerprint, http_raw, produce_ok

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

QUEUE = "errors"
JSON = "application/json"
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("errors")
    with LocalCluster(base / "cluster", nodes=3, replicas=3) as running:
        produce_ok(running.url(running.head_of(QUEUE)), QUEUE, [("x", "1"), ("y", "2")])
        # The commit point reaches the tail just after the producer's reply: wait for it, or the
        # first test's "before" could see the tail still on its way there.
        running.wait_replicated()
        yield running


def messages_url(cluster: LocalCluster, queue: str = QUEUE, query: str = "acks=all") -> str:
    return f"{cluster.url(cluster.head_of(QUEUE))}/v1/queues/{queue}/messages?{query}"


def assert_refused(
    cluster: LocalCluster, reply: tuple[int, Any], status: int, code: str
) -> dict[str, Any]:
    got_status, body = reply
    assert (got_status, body["error"]["code"]) == (status, code), body
    assert body["error"]["message"]
    assert body["error"]["epoch"] == cluster.topology.epoch
    error: dict[str, Any] = body["error"]
    return error


@pytest.fixture
def unchanged(cluster: LocalCluster) -> Iterator[None]:
    before = fingerprint(cluster, QUEUE)
    yield
    assert fingerprint(cluster, QUEUE) == before, "a refused request changed nothing"


@pytest.mark.usefixtures("unchanged")
def test_malformed_json(cluster: LocalCluster) -> None:
    reply = http_raw(messages_url(cluster), b'{"messages": [{"key": "k", ', JSON)
    assert_refused(cluster, reply, 400, "protocol_error")


@pytest.mark.usefixtures("unchanged")
def test_malformed_msgpack(cluster: LocalCluster) -> None:
    # An array of two whose second element is 0xc1, the one byte msgpack never uses.
    reply = http_raw(messages_url(cluster), b"\x92\x01\xc1", MSGPACK)
    assert_refused(cluster, reply, 400, "protocol_error")


@pytest.mark.usefixtures("unchanged")
def test_oversize_key_fails_the_whole_batch(cluster: LocalCluster) -> None:
    body = {
        "messages": [
            {"key": "fine", "value": "v"},
            {"key": "k" * (limits.item_key_bytes_max + 1), "value": "v"},
        ]
    }
    reply = http_json(messages_url(cluster), method="POST", body=body)
    assert_refused(cluster, reply, 413, "limit_exceeded")


@pytest.mark.usefixtures("unchanged")
def test_oversize_value(cluster: LocalCluster) -> None:
    value = "v" * (limits.value_bytes_max + 1)
    body = json.dumps({"messages": [{"key": "big", "value": value}]}).encode()
    reply = http_raw(messages_url(cluster), body, JSON)
    assert_refused(cluster, reply, 413, "limit_exceeded")


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    "queue", ["bad!name", "q" * (limits.queue_name_bytes_max + 1)], ids=["character", "length"]
)
def test_bad_queue_name(cluster: LocalCluster, queue: str) -> None:
    body = {"messages": [{"key": "k", "value": "v"}]}
    reply = http_json(messages_url(cluster, queue), method="POST", body=body)
    assert_refused(cluster, reply, 400, "invalid_request")


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("query", "body"),
    [("acks=2", {"messages": [{"key": "k", "value": "v"}]}), ("acks=all", {"messages": []})],
    ids=["bad-acks", "empty-batch"],
)
def test_bad_parameter(cluster: LocalCluster, query: str, body: Any) -> None:
    reply = http_json(messages_url(cluster, query=query), method="POST", body=body)
    assert_refused(cluster, reply, 400, "invalid_request")


@pytest.mark.usefixtures("unchanged")
def test_produce_at_a_node_that_is_not_the_head(cluster: LocalCluster) -> None:
    head = cluster.head_of(QUEUE)
    other = next(node for node in cluster.topology.nodes if node != head)
    body = {"messages": [{"key": "k", "value": "v"}]}
    url = f"{cluster.url(other)}/v1/queues/{QUEUE}/messages?acks=all"
    error = assert_refused(cluster, http_json(url, method="POST", body=body), 421, "wrong_role")
    assert (error["redirect"], error["node"]) == (cluster.url(head), head)


@pytest.mark.usefixtures("unchanged")
def test_consume_at_a_node_that_is_not_a_tail(cluster: LocalCluster) -> None:
    tail = cluster.tails_of(QUEUE)[0]
    other = next(node for node in cluster.topology.nodes if node != tail)
    reply = http_json(f"{cluster.url(other)}/v1/queues/{QUEUE}/consume?group=g")
    error = assert_refused(cluster, reply, 421, "wrong_role")
    assert (error["redirect"], error["node"]) == (cluster.url(tail), tail)
