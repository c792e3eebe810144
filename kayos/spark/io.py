"""The Spark source's calls to the cluster (docs/spark.md), through the client only: probing a
shard's committed boundary, reading a seq range as Arrow record batches, writing Arrow batches
to a head, and the streaming sink's replay marker. No pyspark here; pyarrow is imported by the
functions that build or take Arrow data."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kayos import limits
from kayos.client.aio import AsyncClient
from kayos.client.sync import Client
from kayos.client.types import Acks, ItemLike, Page, ShardSeqs
from kayos.errors import InvalidRequest, UnavailableError
from kayos.spark.offsets import SeqRange, SourceOptions
from kayos.topology import check_queue_name

if TYPE_CHECKING:
    import pyarrow as pa

# One client per process and cluster: executors' Python workers are reused across tasks, and
# the per-query planner process asks every trigger; each would otherwise reconnect every time.
_clients: dict[tuple[Any, ...], Client] = {}
_clients_lock = threading.Lock()

# The consumer group that holds a streaming sink's replay marker, by query id.
SINK_GROUP_PREFIX = "spark-sink-"


def client_for(options: SourceOptions) -> Client:
    extra = options.client_options()
    key = (options.seeds, tuple(sorted(extra.items())))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = Client(list(options.seeds), **extra)
            _clients[key] = client
        return client


def shards_of(client: Client, queue: str) -> list[int]:
    """The shards that hold ``queue`` (``Topology.shards_for``: one unless the topology gives
    the queue several, docs/node-api.md "Queues over several shards")."""
    return list(client.topology.shards_for(queue))


def marker_shard(client: Client, queue: str) -> int:
    """The shard of ``queue`` that keeps the streaming sink's replay marker: its first."""
    return client.topology.shards_for(queue)[0]


@dataclass(frozen=True)
class Probe:
    """A tail's answer for one shard after a position: its committed boundary, and whether the
    queue has any entry in ``(after, boundary]``."""

    boundary: int
    has_rows: bool


def probe(client: Client, queue: str, shard: int, after: int, upto: int | None = None) -> Probe:
    page = client.read(queue, after=after, limit=1, upto=upto, shard=shard)
    return Probe(page.boundary, len(page) > 0)


def committed_through(client: Client, shard: int, seq: int) -> bool:
    """True once the shard is committed through ``seq`` as a tail sees it (waiting for a tail
    a little behind, at most ``limits.spark_range_catch_up_ms``)."""
    return client.wait_committed(shard, seq, limits.spark_range_catch_up_ms / 1000)


def boundary(client: Client, queue: str, shard: int) -> int:
    """The shard's committed boundary as a tail reports it now."""
    return probe(client, queue, shard, 0).boundary


def earliest(client: Client, queue: str, shard: int) -> int:
    """The position before the queue's first live entry (the boundary if it has none): a read
    from "earliest" starts there, not at 0, so the seqs of the shard's other queues before it do
    not count against a read limit."""
    page = client.read(queue, after=0, limit=1, shard=shard)
    return page.columns.seqs[0] - 1 if len(page) else page.boundary


def arrow_schema(include_headers: bool) -> pa.Schema:
    import pyarrow as pa

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("queue", pa.string()),
        pa.field("shard", pa.int32()),
        pa.field("seq", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.map_(pa.string(), pa.binary())))
    return pa.schema(fields)


def page_batch(page: Page, queue: str, schema: pa.Schema) -> pa.RecordBatch:
    """One consume page as an Arrow record batch, straight from its columns; ``timestamp`` from
    the messages' append times (docs/spark.md, "The timestamp column"), null where unknown."""
    import pyarrow as pa

    columns = page.columns
    count = len(columns.seqs)
    stamp = pa.timestamp("us", tz="UTC")
    if columns.append_ms is None:
        timestamps = pa.nulls(count, stamp)
    else:
        timestamps = pa.array(columns.append_ms, pa.timestamp("ms", tz="UTC")).cast(stamp)
    arrays = [
        pa.array(columns.keys, pa.binary()),
        pa.array(columns.values, pa.binary()),
        pa.DictionaryArray.from_arrays(pa.array([0] * count, pa.int8()), [queue]).cast(pa.string()),
        pa.array([page.shard] * count, pa.int32()),
        pa.array(columns.seqs, pa.int64()),
        timestamps,
    ]
    if len(schema) == 7:
        headers = columns.headers or [None] * count
        arrays.append(
            pa.array(
                [None if h is None else list(h.items()) for h in headers],
                pa.map_(pa.string(), pa.binary()),
            )
        )
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_range(
    client: Client, rng: SeqRange, page_rows: int, include_headers: bool
) -> Iterator[pa.RecordBatch]:
    """The queue's entries of ``(rng.after, rng.upto]`` as of ``rng.upto``, page by page (with
    their append times), the next page asked for while the caller works on this one. A tail
    whose commit point is below ``upto`` answers a short snapshot; then this waits until a tail
    is committed through ``upto`` and goes on where it stopped: a range is read whole or the call
    fails (``UnavailableError``)."""
    schema = arrow_schema(include_headers)
    deadline = time.monotonic() + limits.spark_range_catch_up_ms / 1000

    def ask(after: int) -> Future[Page]:
        return pool.submit(
            client.read,
            rng.queue,
            after=after,
            limit=page_rows,
            upto=rng.upto,
            shard=rng.shard,
            times=True,  # the timestamp column
        )

    if rng.after >= rng.upto:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="kayos-spark-read") as pool:
        after = rng.after
        pending: Future[Page] | None = ask(after)
        while pending is not None:
            page = pending.result()
            pending = None
            after = max(after, page.next)
            short = page.end and page.boundary < rng.upto
            if not page.end:
                pending = ask(after)
            elif short:
                # The tail answered its own commit point, below the range's end.
                if time.monotonic() > deadline or not committed_through(
                    client, rng.shard, rng.upto
                ):
                    raise UnavailableError(
                        f"no tail of shard {rng.shard} reached seq {rng.upto} within "
                        f"{limits.spark_range_catch_up_ms} ms (at {page.boundary})"
                    )
                pending = ask(after)
            if len(page):
                yield page_batch(page, rng.queue, schema)


# --- writes --------------------------------------------------------------------------------------


def acks_of(text: str) -> Acks:
    return "all" if text == "all" else (1 if text == "1" else 0)


def batch_items(batch: pa.RecordBatch, queue: str) -> dict[str, list[ItemLike]]:
    """A record batch's rows as produce items by target queue: ``key`` and ``value`` columns
    (string or binary; a null value deletes the key), and the row's ``queue`` column where it
    has one and it is not null, else ``queue``."""
    import pyarrow as pa

    names = batch.schema.names
    if "key" not in names or "value" not in names:
        raise InvalidRequest(f"a kayos write needs columns key and value, not {names}")
    keys = batch.column("key")
    values = batch.column("value")
    if not pa.types.is_binary(keys.type):
        keys = keys.cast(pa.binary())
    if not pa.types.is_binary(values.type):
        values = values.cast(pa.binary())
    key_list = keys.to_pylist()
    if None in key_list:
        raise InvalidRequest("a kayos write got a row whose key is null")
    items: list[ItemLike] = list(zip(key_list, values.to_pylist(), strict=True))
    if "queue" not in names:
        return {queue: items}
    by_queue: dict[str, list[ItemLike]] = {}
    for target, item in zip(batch.column("queue").to_pylist(), items, strict=True):
        by_queue.setdefault(check_queue_name(target) if target else queue, []).append(item)
    return by_queue


@dataclass(frozen=True)
class Written:
    """What one writer task acknowledged: rows, and the highest seq it got on the option's
    queue's marker shard (``marker_shard``; 0 under acks=0)."""

    rows: int
    max_seq: int


def write_batches(options: SourceOptions, batches: Iterable[pa.RecordBatch]) -> Written:
    """Produces every row, grouped by target queue (so by shard), in order within a queue:
    ``limits.spark_write_batch_rows`` per produce batch with up to
    ``limits.spark_write_in_flight_batches`` pipelined to the heads, each acknowledged at the
    option's acks before this returns."""
    return asyncio.run(_write(options, batches))


async def _write(options: SourceOptions, batches: Iterable[pa.RecordBatch]) -> Written:
    acks = acks_of(options.acks)
    rows = 0
    max_seq = 0
    async with AsyncClient(list(options.seeds), **options.client_options()) as client:
        in_flight: list[tuple[str, asyncio.Future[list[ShardSeqs]]]] = []
        marker = client.topology.shards_for(options.queue)[0]

        async def settle(keep: int) -> None:
            nonlocal max_seq
            while len(in_flight) > keep:
                target, future = in_flight.pop(0)
                for part in await future:  # one part per shard of a queue with several
                    if target == options.queue and part.shard == marker:
                        max_seq = max(max_seq, part.last_seq)

        def send(target: str, chunk: list[ItemLike]) -> None:
            nonlocal rows
            future = asyncio.ensure_future(client.produce_sharded(target, chunk, acks=acks))
            in_flight.append((target, future))
            rows += len(chunk)

        try:
            pending: dict[str, list[ItemLike]] = {}
            for batch in batches:
                for target, items in batch_items(batch, options.queue).items():
                    waiting = pending.setdefault(target, [])
                    waiting += items
                    while len(waiting) >= limits.spark_write_batch_rows:
                        send(target, waiting[: limits.spark_write_batch_rows])
                        del waiting[: limits.spark_write_batch_rows]
                        await settle(limits.spark_write_in_flight_batches)
            for target, waiting in pending.items():
                if waiting:
                    send(target, waiting)
            await settle(0)
        finally:
            for _target, future in in_flight:
                future.cancel()
            if in_flight:
                await asyncio.gather(*(f for _t, f in in_flight), return_exceptions=True)
    return Written(rows, max_seq)


# --- the streaming sink's replay marker ----------------------------------------------------------


def sink_group(query_id: str) -> str:
    return SINK_GROUP_PREFIX + query_id


def last_committed_batch(client: Client, queue: str, query_id: str) -> int:
    """The last batch id the query's sink committed on ``queue``; -1 if none."""
    info = client.group(queue, sink_group(query_id), shard=marker_shard(client, queue))
    if not info.state:
        return -1
    try:
        marker = json.loads(info.state)
        return int(marker["batch"]) if marker.get("query") == query_id else -1
    except (ValueError, KeyError, TypeError, AttributeError):
        return -1


def record_committed_batch(
    client: Client, queue: str, query_id: str, batch_id: int, max_seq: int
) -> None:
    """Records ``batch_id`` as committed by the query's sink (one group commit, replicated)."""
    group, shard = sink_group(query_id), marker_shard(client, queue)
    hwm = max(max_seq, client.group(queue, group, shard=shard).hwm)
    state = json.dumps({"query": query_id, "batch": batch_id}, sort_keys=True).encode()
    client.commit(queue, group, hwm, state=state, shard=shard)
