"""The client against real ``kayos node`` processes (kayos.local.cluster.LocalCluster: 3 nodes, 3
rotated shards, replication factor 3): the blocking and asyncio clients, embedded-free paths
end to end, wrong_role redirects from a stale topology, a head restart under retries, and the
``kayos produce`` / ``kayos consume`` commands."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

import kayos
from kayos.cli.main import cli
from kayos.client.binary import BinaryConnection
from kayos.errors import InvalidRequest, WrongRoleError
from kayos.local.cluster import LocalCluster
from kayos.replication.wire.frames import Produce
from kayos.topology import ShardChain, Topology

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

SEED = 7_101
# Bound on every wait here: generous for 2 shared cores, reached only by a failure.
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("client-cluster"), nodes=3, replicas=3) as started:
        yield started


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[kayos.Client]:
    print(f"seed={SEED}")
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED)) as opened:
        yield opened


def queue_on_shard(topology: Topology, shard: int, prefix: str) -> str:
    """A queue name that lives in ``shard``."""
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if topology.shard_for(name) == shard:
            return name
    raise AssertionError(f"no queue name for shard {shard}")


def all_messages(client: kayos.Client, queue: str, group: str) -> list[kayos.Message]:
    return [
        message for page in client.consume(queue, group, page_size=64) for message in page.messages
    ]


def test_round_trip(client: kayos.Client) -> None:
    queue = "client-round-trip"
    assert client.produce(queue, "a", "1") >= 1
    first, last = client.produce_batch(
        queue,
        [("b", b"2"), kayos.Item("c", "3", headers={"trace": "t1"}), ("d", "4", 0)],
        acks="all",
    )
    assert last - first == 2
    with client.transaction(queue) as txn:
        txn.put("e", "5")
        txn.delete("a")
    assert txn.result is not None
    assert client.wait_committed(queue, txn.result[1], timeout_s=WAIT_S)

    pages = list(client.consume(queue, "g", page_size=2))
    assert pages[-1].end
    assert not any(page.end for page in pages[:-1])
    messages = [message for page in pages for message in page.messages]
    assert [(m.key, m.value, m.deleted) for m in messages] == [
        (b"b", b"2", False),
        (b"c", b"3", False),
        (b"d", b"4", False),
        (b"e", b"5", False),
        (b"a", None, True),
    ]
    assert messages[1].headers == {"trace": b"t1"}

    boundary = pages[-1].boundary
    client.commit(queue, "g", boundary, state=b"cursor")
    info = client.group(queue, "g")
    assert (info.hwm, info.state) == (boundary, b"cursor")
    assert all_messages(client, queue, "g") == []
    client.produce(queue, "f", "6")
    assert [m.key for m in all_messages(client, queue, "g")] == [b"f"]


def test_pipelined_async_produce_loses_and_duplicates_nothing(cluster: LocalCluster) -> None:
    queues = [queue_on_shard(cluster.topology, shard, "client-pipe") for shard in range(3)]

    async def produce_all() -> dict[str, list[int]]:
        seqs: dict[str, list[int]] = defaultdict(list)
        async with kayos.AsyncClient(
            list(cluster.urls.values()), rng=random.Random(SEED)
        ) as client:

            async def one(queue: str, i: int) -> None:
                seqs[queue].append(await client.produce(queue, f"k{i}", f"v{i}", acks=1))

            async def batch(queue: str, b: int) -> None:
                items = [(f"b{b}-{j}", f"v{j}") for j in range(50)]
                first, last = await client.produce_batch(queue, items, acks=1)
                seqs[queue].extend(range(first, last + 1))

            work = [one(q, i) for q in queues for i in range(200)]
            work += [batch(q, b) for q in queues for b in range(10)]
            await asyncio.wait_for(asyncio.gather(*work), WAIT_S)
            for queue in queues:
                assert await client.wait_committed(queue, max(seqs[queue]), timeout_s=WAIT_S)
        return seqs

    seqs = asyncio.run(produce_all())
    with kayos.Client(list(cluster.urls.values())) as client:
        for queue in queues:
            assert len(set(seqs[queue])) == 700, "every message got its own seq"
            messages = all_messages(client, queue, "audit")
            assert [m.seq for m in messages] == sorted(seqs[queue])
            keys = {m.key for m in messages}
            assert len(keys) == 700


def test_stale_topology_is_corrected_by_wrong_role(cluster: LocalCluster) -> None:
    queue = queue_on_shard(cluster.topology, 0, "client-stale")
    chain = cluster.topology.shards[0].chain
    stale_chain = ShardChain(0, tuple(reversed(chain)))  # head and tail swapped
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED)) as client:
        client.topology.shards[0] = stale_chain
        seq = client.produce(queue, "k", "v")
        assert client.topology.shards[0].chain == chain, "refreshed from a node"
        client.topology.shards[0] = stale_chain
        (page,) = client.consume(queue, "g")
        assert [m.seq for m in page.messages] == [seq]


def test_binary_produce_at_a_non_head_names_the_head(cluster: LocalCluster) -> None:
    queue = queue_on_shard(cluster.topology, 1, "client-wrong")
    shard = cluster.topology.shards[1]
    member = shard.chain[-1]
    address = cluster.topology.nodes[member]

    async def produce_at_tail() -> None:
        connection = await BinaryConnection.open(
            member, address.host, address.bin_port, name="test"
        )
        try:
            await connection.request(
                lambda rid: Produce(rid, queue, (b"k",), (b"v",), None, None, 1, False), WAIT_S
            )
        finally:
            await connection.close()

    with pytest.raises(WrongRoleError) as caught:
        asyncio.run(produce_at_tail())
    assert caught.value.redirect == shard.head
    assert caught.value.epoch == cluster.topology.epoch


def test_node_refusals_are_not_retried(client: kayos.Client) -> None:
    queue = "client-refused"
    seq = client.produce(queue, "k", "v")
    with pytest.raises(InvalidRequest):
        client.commit(queue, "g", seq + 1_000_000)


def test_cli_produce_and_consume(cluster: LocalCluster, tmp_path: object) -> None:
    seed = ["--cluster", cluster.url("a")]
    runner = CliRunner()
    done = runner.invoke(cli, ["produce", "client-cli", "k1", "hello", *seed])
    assert done.exit_code == 0, done.output
    lines = "k2\tworld\nk3\tagain\n"
    done = runner.invoke(
        cli, ["produce", "client-cli", "--file", "-", "--acks", "all", *seed], input=lines
    )
    assert done.exit_code == 0, done.output
    assert "2 messages" in done.output

    done = runner.invoke(cli, ["consume", "client-cli", "--group", "g", "--commit", *seed])
    assert done.exit_code == 0, done.output
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["key"], r["value"]) for r in records] == [
        ("k1", "hello"),
        ("k2", "world"),
        ("k3", "again"),
    ]
    done = runner.invoke(cli, ["consume", "client-cli", "--group", "g", *seed])
    assert done.exit_code == 0, done.output
    assert done.stdout == "", "committed: nothing left for the group"

    done = runner.invoke(cli, ["produce", "client-cli", "k1", *seed])
    assert done.exit_code == 2, "KEY without VALUE is a usage error"
    done = runner.invoke(cli, ["consume", "client-cli", "--group", "g", "--follow", *seed])
    assert done.exit_code == 2, "--follow needs --commit"


def test_produce_rides_out_a_head_restart(cluster: LocalCluster) -> None:
    """Runs last: it restarts a node of the module's cluster."""
    queue = queue_on_shard(cluster.topology, 2, "client-restart")
    head = cluster.head_of(queue)
    print(f"seed={SEED}")
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED), retries=40) as client:
        before = client.produce(queue, "before", "v", acks=1)
        cluster.kill(head)
        results: list[int | BaseException] = []

        def produce() -> None:
            try:
                results.append(client.produce(queue, "during", "v", acks=1))
            except BaseException as exc:  # handed to the test thread
                results.append(exc)

        producer = threading.Thread(target=produce)
        producer.start()
        cluster.start(head)
        producer.join(WAIT_S)
        assert not producer.is_alive()
        (result,) = results
        assert isinstance(result, int), result
        assert result > before
        assert client.wait_committed(queue, result, timeout_s=WAIT_S)
