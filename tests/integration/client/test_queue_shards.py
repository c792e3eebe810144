"""A queue over three shards on a real 3-node cluster (kayos.local.cluster.LocalCluster: 3 rotated
shards, replication factor 3, fsync on): keys keep their order and their de-dup, a consumer group
reads every shard and commits one mark per shard and a new client resumes after them, the nodes
refuse what would break a shard's invariants (docs/node-api.md, "Queues over several shards")."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest

import kayos
from chaos.history import Recorder
from kayos.errors import InvalidRequest
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

SEED = 13_013
WAIT_S = 60.0
QUEUES = ("qs-order", "qs-groups", "qs-refuse", "qs-async", "qs-cli", "k.qs-kestrel", "qs-chaos")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("queue-shards"),
        nodes=3,
        replicas=3,
        shards=3,
        queue_shards=dict.fromkeys(QUEUES, 3),
    ) as started:
        yield started


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[kayos.Client]:
    print(f"seed={SEED}")
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED)) as opened:
        yield opened


def read_all(client: kayos.Client, queue: str, group: str) -> list[kayos.Page]:
    return list(client.consume(queue, group, page_size=50))


def test_the_queues_three_shards_have_their_heads_on_three_nodes(client: kayos.Client) -> None:
    topology = client.topology
    shards = topology.shards_for("qs-order")
    assert len(shards) == 3
    assert {topology.shards[shard].head for shard in shards} == {"a", "b", "c"}
    assert topology.to_json()["queues"]["qs-order"] == {"shards": 3}, "nodes serve the entry"


def test_keys_keep_their_order_and_de_dup_per_shard(client: kayos.Client) -> None:
    queue = "qs-order"
    rng = random.Random(SEED)
    keys = [f"key-{i}" for i in range(90)]
    # Three versions of every key, each round a batch the client splits by shard.
    for version in range(3):
        order = keys[:]
        rng.shuffle(order)
        parts = client.produce_sharded(queue, [(k, f"{k}:v{version}") for k in order])
        assert sorted(part.shard for part in parts) == sorted(client.topology.shards_for(queue))
        assert sum(part.items for part in parts) == 90
        for part in parts:
            assert part.last_seq - part.first_seq + 1 == part.items
    pages = read_all(client, queue, "g")
    assert {page.shard for page in pages} == set(client.topology.shards_for(queue))
    seen: dict[bytes, list[tuple[int, bytes | None]]] = defaultdict(list)
    for page in pages:
        for message in page.messages:
            assert page.shard == client.topology.shard_for_key(queue, message.key)
            seen[message.key].append((page.shard, message.value))
    # De-dup: one live version per key, the last one produced, from the key's one shard.
    assert {key.decode(): values for key, values in seen.items()} == {
        k: [(client.topology.shard_for_key(queue, k.encode()), f"{k}:v2".encode())] for k in keys
    }
    # Order per key: a later version after a commit comes after the earlier one.
    for page in pages:
        if page.end:
            client.commit(queue, "g", page.boundary, shard=page.shard)
    client.produce_sharded(queue, [(k, f"{k}:v3") for k in keys[:10]])
    later = [m for page in read_all(client, queue, "g") for m in page.messages]
    assert sorted(m.key.decode() for m in later) == sorted(keys[:10])
    assert all(m.value == m.key + b":v3" for m in later)


def test_a_group_commits_one_mark_per_shard_and_a_new_client_resumes(
    cluster: LocalCluster, client: kayos.Client
) -> None:
    queue, group = "qs-groups", "readers"
    shards = client.topology.shards_for(queue)
    client.produce_sharded(queue, [(f"k{i}", f"v{i}") for i in range(60)])
    pages = read_all(client, queue, group)
    ends = {page.shard: page.boundary for page in pages if page.end}
    assert sorted(ends) == sorted(shards), "one snapshot per shard, each with its end"
    assert sum(len(page.messages) for page in pages) == 60
    for shard, boundary in ends.items():
        assert client.commit(queue, group, boundary, shard=shard).hwm == boundary
    assert client.marks(queue, group) == ends
    for shard in shards:
        assert client.group(queue, group, shard=shard).hwm == ends[shard]
    with pytest.raises(InvalidRequest, match="name one"):
        client.group(queue, group)
    with pytest.raises(InvalidRequest, match="name one"):
        client.commit(queue, group, 1)

    # A new client (a restarted consumer) resumes each shard right after its own mark.
    client.produce_sharded(queue, [(f"new{i}", f"v{i}") for i in range(30)])
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED + 1)) as again:
        pages = read_all(again, queue, group)
        keys = sorted(m.key.decode() for page in pages for m in page.messages)
        assert keys == sorted(f"new{i}" for i in range(30))
        for page in pages:
            assert not page.messages or page.messages[0].seq > ends[page.shard]
    listed = [(q, g, hwm) for q, g, hwm in client.list_groups() if q == queue and g == group]
    assert sorted(hwm for _, _, hwm in listed) == sorted(ends.values())
    client.delete_group(queue, group)
    assert client.marks(queue, group) == dict.fromkeys(shards, 0)


def test_what_would_span_or_miss_a_shard_is_refused(
    cluster: LocalCluster, client: kayos.Client
) -> None:
    queue = "qs-refuse"
    topology = client.topology
    keys = [f"r{i}" for i in range(30)]
    by_shard: dict[int, list[str]] = defaultdict(list)
    for key in keys:
        by_shard[topology.shard_for_key(queue, key.encode())].append(key)
    with pytest.raises(InvalidRequest, match="transaction commits in one shard"):
        client.produce_batch(queue, [(k, "v") for k in keys], txn=True)
    with pytest.raises(InvalidRequest, match="produce_sharded"):
        client.produce_batch(queue, [(k, "v") for k in keys])

    def spanning_transaction() -> None:
        with client.transaction(queue) as txn:
            for key in keys:
                txn.put(key, "v")

    with pytest.raises(InvalidRequest, match="transaction commits in one shard"):
        spanning_transaction()
    # A transaction whose keys keep to one shard commits there.
    shard, same = next(iter(by_shard.items()))
    with client.transaction(queue) as txn:
        for key in same:
            txn.put(key, "t")
    assert txn.result is not None
    assert client.wait_committed(shard, txn.result[1], timeout_s=WAIT_S)
    with pytest.raises(InvalidRequest, match="name"):
        client.wait_committed(queue, txn.result[1], timeout_s=1)

    # The node: a spanning batch is refused whole, a part at the wrong head is redirected.
    head = topology.shards[shard].head
    body = {"messages": [{"key": k, "value": "x"} for k in keys]}
    status, reply = http_json(
        f"{cluster.url(head)}/v1/queues/{queue}/messages?acks=all", method="POST", body=body
    )
    assert status == 400, reply
    assert reply["error"]["code"] == "invalid_request"
    assert "span shards" in reply["error"]["message"]
    other = next(node for node in topology.nodes if node != head)
    body = {"messages": [{"key": k, "value": "x"} for k in same]}
    status, reply = http_json(
        f"{cluster.url(other)}/v1/queues/{queue}/messages?acks=all", method="POST", body=body
    )
    assert status == 421, reply
    assert reply["error"]["node"] == head
    status, reply = http_json(
        f"{cluster.url(head)}/v1/queues/{queue}/messages?acks=all", method="POST", body=body
    )
    assert status == 200, reply
    assert reply["shard"] == shard
    # Per-shard requests name a shard of the queue.
    tail = topology.shards[shard].tails[0]
    status, reply = http_json(f"{cluster.url(tail)}/v1/queues/{queue}/consume?group=g")
    assert status == 400, reply
    assert "name one" in reply["error"]["message"]
    foreign = next(s for s in topology.shards if s not in topology.shards_for("qs-single"))
    status, reply = http_json(
        f"{cluster.url(tail)}/v1/queues/qs-single/consume?group=g&shard={foreign}"
    )
    assert status == 400, reply
    assert "holds no part" in reply["error"]["message"]
    status, reply = http_json(
        f"{cluster.url(tail)}/v1/queues/{queue}/consume?group=g&shard={shard}"
    )
    assert status == 200, reply
    assert reply["shard"] == shard
    # A commit sent to a non-head member is relayed with its shard.
    status, reply = http_json(
        f"{cluster.url(tail)}/v1/queues/{queue}/groups/g/commit?shard={shard}",
        method="POST",
        body={"hwm": reply["boundary"]},
    )
    assert status == 200, reply
    assert client.group(queue, "g", shard=shard).hwm == reply["hwm"]


def test_async_consume_long_polls_every_shard(cluster: LocalCluster) -> None:
    queue = "qs-async"

    async def run() -> list[kayos.Page]:
        async with kayos.AsyncClient(
            list(cluster.urls.values()), rng=random.Random(SEED)
        ) as client:
            shards = client.topology.shards_for(queue)
            key = next(
                f"w{i}"
                for i in range(1000)
                if client.topology.shard_for_key(queue, f"w{i}".encode()) == shards[-1]
            )

            async def read() -> list[kayos.Page]:
                return [page async for page in client.consume(queue, "w", wait_s=WAIT_S)]

            reading = asyncio.ensure_future(read())
            # The reader waits on every shard; a write to the last one ends its wait.
            for _ in range(100):
                if reading.done():
                    break
                await client.produce(queue, key, "later")
                done, _pending = await asyncio.wait({reading}, timeout=0.5)
                if done:
                    break
            return await asyncio.wait_for(reading, WAIT_S)

    pages = asyncio.run(run())
    messages = [(page.shard, m.key) for page in pages for m in page.messages]
    assert messages
    assert all(key.startswith(b"w") for _, key in messages)
    assert len({page.shard for page in pages}) == 3, "every shard's snapshot is read"


def test_cli_consume_commits_every_shard(cluster: LocalCluster, client: kayos.Client) -> None:
    from click.testing import CliRunner

    from kayos.cli.main import cli

    queue = "qs-cli"
    seed = ["--cluster", cluster.url("a")]
    lines = "".join(f"c{i}\tv{i}\n" for i in range(12))
    done = CliRunner().invoke(cli, ["produce", queue, "--file", "-", *seed], input=lines)
    assert done.exit_code == 0, done.output
    assert "shard" in done.output
    done = CliRunner().invoke(cli, ["consume", queue, "--group", "g", "--commit", *seed])
    assert done.exit_code == 0, done.output
    assert len(done.stdout.splitlines()) == 12
    assert all(hwm > 0 for hwm in client.marks(queue, "g").values())
    done = CliRunner().invoke(cli, ["consume", queue, "--group", "g", *seed])
    assert done.exit_code == 0, done.output
    assert done.stdout == "", "committed on every shard: nothing left"


def test_the_kestrel_backend_keeps_a_log_in_one_shard_of_a_sharded_queue(
    cluster: LocalCluster, client: kayos.Client
) -> None:
    from kestrel_compat.backends.kayos_backend import KayosBackend, queue_for
    from kestrel_compat.core.persistence import GroupState, NewEntry

    log = "qs-kestrel"
    queue = queue_for(log)
    assert len(client.topology.shards_for(queue)) == 3

    async def append_and_read() -> tuple[list[int], list[int]]:
        backend = await KayosBackend.connect(cluster.url("b"))
        try:
            seqs: list[int] = []
            for batch in range(4):
                entries = [
                    NewEntry(f"{batch}.{i}".encode(), 1000 + i, None, (log,)) for i in range(25)
                ]
                seqs += await backend.append(log, entries)
            return seqs, [entry.seq for entry in await backend.read(log, 0, 1000)]
        finally:
            await backend.close()

    seqs, read = asyncio.run(append_and_read())
    assert seqs == sorted(seqs), "one FIFO seq space"
    assert len(set(seqs)) == 100
    assert read == seqs, "every item read back, in order"
    # Before any group confirms anything (the front's until_consumed retention then moves the
    # log's floor), a plain consumer sees every item, all in the log's one shard.
    home = client.topology.shards_for(queue)[0]
    pages = list(client.consume(queue, "audit"))
    assert sum(len(page.messages) for page in pages if page.shard == home) == 100
    assert sum(len(page.messages) for page in pages if page.shard != home) == 0
    assert client.retention(queue, shard=home)["policy"] == {"until_consumed": True}

    async def groups() -> tuple[GroupState | None, int, list[str]]:
        backend = await KayosBackend.connect(cluster.url("c"))
        try:
            await backend.commit_group(log, log, GroupState(seqs[49], b""))
            return (
                await backend.load_group(log, log),
                await backend.last_seq(log),
                await backend.list_groups(log),
            )
        finally:
            await backend.close()

    state, last, names = asyncio.run(groups())
    assert state == GroupState(seqs[49], b"")
    assert last >= seqs[-1]
    assert names == [log], "the audit consumer never committed a mark"


def test_the_chaos_checker_passes_on_a_history_over_a_sharded_queue(
    cluster: LocalCluster, client: kayos.Client
) -> None:
    from chaos import checker
    from chaos.history import Produce
    from chaos.procs.workload import Consumer, Producer, join_timeout_s

    queue = "qs-chaos"
    seeds = list(cluster.urls.values())
    recorder = Recorder()
    producers = [Producer(n, seeds, [queue], recorder, SEED) for n in range(2)]
    consumers = [
        Consumer(queue, "checked", seeds, recorder, shard=shard)
        for shard in client.topology.shards_for(queue)
    ]
    for worker in [*producers, *consumers]:
        worker.start()

    def acked() -> int:
        return sum(
            1
            for event in recorder.snapshot_of_events()
            if isinstance(event, Produce) and event.outcome == "ok"
        )

    try:
        wait_until(lambda: acked() >= 300, "300 acknowledged produce calls")
    finally:
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join(join_timeout_s)
    final = cluster.wait_replicated(WAIT_S)
    for consumer in consumers:
        consumer.drain_to = final[consumer.shard]
    try:
        for consumer in consumers:
            assert consumer.drained.wait(WAIT_S), f"{consumer.name} drained to {final}"
    finally:
        for consumer in consumers:
            consumer.stop.set()
        for consumer in consumers:
            consumer.join(join_timeout_s)
    events = recorder.snapshot_of_events()
    verdict = checker.check(events)
    assert verdict.ok, [v.to_json() for v in verdict.violations]
    assert verdict.lost_versions == 0
    assert verdict.acked_versions >= 300
    recorded = {event.queue for event in events if isinstance(event, Produce)}
    assert recorded == {f"{queue}/{shard}" for shard in client.topology.shards_for(queue)}
    assert any(event.txn and len(event.items) > 1 for event in events if isinstance(event, Produce))


def test_the_binary_port_refuses_a_batch_spanning_shards(cluster: LocalCluster) -> None:
    from kayos.client.binary import BinaryConnection
    from kayos.replication.wire.frames import Produce

    queue = "qs-refuse"
    topology = cluster.topology
    keys = tuple(f"bin{i}".encode() for i in range(30))
    assert len({topology.shard_for_key(queue, key) for key in keys}) == 3
    head = topology.shards[topology.shards_for(queue)[0]].head
    address = topology.nodes[head]

    async def send() -> None:
        connection = await BinaryConnection.open(head, address.host, address.bin_port, name="t")
        try:
            await connection.request(
                lambda rid: Produce(rid, queue, keys, (b"v",) * 30, None, None, -1, False), WAIT_S
            )
        finally:
            await connection.close()

    with pytest.raises(InvalidRequest, match="span shards"):
        asyncio.run(send())
    with kayos.Client(list(cluster.urls.values())) as client:
        seen = {m.key for page in client.consume(queue, "bin-audit") for m in page.messages}
    assert not seen & set(keys), "nothing of the refused batch was written"
