"""The ``kayos`` Spark data source (docs/spark.md): batch reader, streaming reader (offsets are
per-shard seqs, admission control and ``Trigger.AvailableNow``), batch and streaming writers.

Everything here is pickled by Spark and unpickled in other processes (executors' Python workers,
the per-query planner process), so instances hold only options and plain data: the client is
found per process in ``kayos.spark.io``, never kept in an instance.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kayos.errors import DataLossError, InvalidRequest
from kayos.spark import io
from kayos.spark.offsets import (
    EARLIEST,
    LATEST,
    Positions,
    SeqRange,
    SourceOptions,
    parse_offset,
    share_limit,
    split_ranges,
    to_offset,
)

log = logging.getLogger("kayos.spark")

SCHEMA = "key binary, value binary, queue string, shard int, seq long, timestamp timestamp"
HEADERS_FIELD = ", headers map<string, binary>"


class KayosPartition(InputPartition):  # type: ignore[misc, unused-ignore]
    """One seq range of one shard (picklable plain data)."""

    def __init__(self, rng: SeqRange) -> None:
        super().__init__(rng)
        self.rng = rng


class KayosDataSource(DataSource):  # type: ignore[misc, unused-ignore]
    """``spark.read.format("kayos")`` and friends; see docs/spark.md for the options."""

    @classmethod
    def name(cls) -> str:
        return "kayos"

    def schema(self) -> str:
        include = SourceOptions.parse(self.options, streaming=False).include_headers
        return SCHEMA + (HEADERS_FIELD if include else "")

    def reader(self, schema: Any) -> DataSourceReader:
        return KayosBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KayosStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return KayosBatchWriter(SourceOptions.parse(self.options, streaming=False))

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return KayosStreamWriter(SourceOptions.parse(self.options, streaming=True))


def _resolve(
    options: SourceOptions, spec: str, what: str, *, default_latest: bool
) -> tuple[Positions, Positions]:
    """Positions of ``spec`` (earliest | latest | committed | JSON) for every shard of the
    queue, with the shards' current boundaries: ``(positions, boundaries)``."""
    client = io.client_for(options)
    shards = io.shards_of(client, options.queue)
    bounds = {shard: io.boundary(client, options.queue, shard) for shard in shards}
    word = spec.lower()
    if word == "earliest":
        return {shard: io.earliest(client, options.queue, shard) for shard in shards}, bounds
    if word == "latest":
        return dict(bounds), bounds
    if word == "committed":
        assert options.consumer_group is not None  # checked with the options
        group = options.consumer_group
        return {shard: client.group(options.queue, group, shard=shard).hwm for shard in shards}, (
            bounds
        )
    given = parse_offset(spec, options.queue, what)
    unknown = set(given) - set(shards)
    if unknown:
        raise InvalidRequest(f"{what} names shards {sorted(unknown)} that hold no {options.queue}")
    positions: Positions = {}
    for shard in shards:
        seq = given.get(shard, LATEST if default_latest else EARLIEST)
        if seq == EARLIEST:
            seq = io.earliest(client, options.queue, shard)
        positions[shard] = bounds[shard] if seq == LATEST else seq
    return positions, bounds


class KayosBatchReader(DataSourceReader):  # type: ignore[misc, unused-ignore]
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        start, _ = _resolve(
            self.options, self.options.starting, "startingOffsets", default_latest=False
        )
        end, _ = _resolve(self.options, self.options.ending, "endingOffsets", default_latest=True)
        ranges = split_ranges(self.options.queue, start, end, self.options.min_partitions)
        return [KayosPartition(rng) for rng in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KayosPartition)
        client = io.client_for(self.options)
        yield from io.read_range(
            client, partition.rng, self.options.page_rows, self.options.include_headers
        )


class KayosStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc, unused-ignore]
    """Offsets ``{"<queue>": {"<shard>": seq}}``; a micro-batch reads ``(start, end]`` per
    shard as of ``end``. Lives in the query's planner process between triggers."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Positions | None = None  # availableNow: never plan past this
        self._latest: Positions | None = None  # the uncut ends of the last plan
        self._committed: Positions | None = None  # what commit() last wrote to the group

    def initialOffset(self) -> dict[str, Any]:
        positions, _ = _resolve(
            self.options, self.options.starting, "startingOffsets", default_latest=True
        )
        return to_offset(self.options.queue, positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        client = io.client_for(self.options)
        shards = io.shards_of(client, self.options.queue)
        self._target = {shard: io.boundary(client, self.options.queue, shard) for shard in shards}

    def _checked_start(self, start: Positions) -> Positions:
        """``start`` with every shard checked to hold it (docs/spark.md, "Data loss")."""
        client = io.client_for(self.options)
        checked: Positions = {}
        for shard in io.shards_of(client, self.options.queue):
            seq = start.get(shard, 0)
            if seq > 0 and not io.committed_through(client, shard, seq):
                now = io.boundary(client, self.options.queue, shard)
                message = (
                    f"queue {self.options.queue} shard {shard}: the query resumes after seq "
                    f"{seq} but the shard is committed only through {now}; rows may be lost"
                )
                if self.options.fail_on_data_loss:
                    raise DataLossError(message + " (failOnDataLoss=false to go on from there)")
                log.warning("%s; going on from %d (failOnDataLoss=false)", message, now)
                seq = now
            checked[shard] = seq
        return checked

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        client = io.client_for(self.options)
        begin = (
            parse_offset(start, self.options.queue, "start offset")
            if start is not None
            else parse_offset(self.initialOffset(), self.options.queue, "initial offset")
        )
        begin = self._checked_start(begin)
        ends: Positions = {}
        for shard, after in begin.items():
            upto = None if self._target is None else self._target.get(shard, after)
            if upto is not None and upto <= after:
                ends[shard] = after
                continue
            found = io.probe(client, self.options.queue, shard, after, upto)
            # Nothing of this queue past the start (other queues' entries, group commits): the
            # offset stays, so Spark plans no empty batch.
            ends[shard] = found.boundary if found.has_rows else after
        self._latest = dict(ends)
        if isinstance(limit, ReadMaxRows):
            ends = share_limit(begin, ends, limit.max_rows)
        return to_offset(self.options.queue, ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else to_offset(self.options.queue, self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = parse_offset(start, self.options.queue, "start offset")
        finish = parse_offset(end, self.options.queue, "end offset")
        ranges = split_ranges(self.options.queue, begin, finish, self.options.min_partitions)
        return [KayosPartition(rng) for rng in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KayosPartition)
        client = io.client_for(self.options)
        yield from io.read_range(
            client, partition.rng, self.options.page_rows, self.options.include_headers
        )

    def commit(self, end: dict[str, Any]) -> None:
        """Advisory: the consumer group's high-water mark follows the checkpoint, one batch
        late (docs/spark.md); failures are logged, never fail the query."""
        group = self.options.consumer_group
        if group is None:
            return
        positions = parse_offset(end, self.options.queue, "end offset")
        if positions == self._committed:
            return
        try:
            client = io.client_for(self.options)
            for shard, seq in positions.items():
                client.commit(self.options.queue, group, seq, shard=shard)
            self._committed = positions
        except Exception as exc:  # the checkpoint is authoritative; the mark can wait
            log.warning("consumer group %s: commit of %s failed: %s", group, positions, exc)

    def stop(self) -> None:
        pass  # the process's client is shared; it goes with the process


@dataclass(frozen=True)
class KayosCommitMessage(WriterCommitMessage):  # type: ignore[misc, unused-ignore]
    rows: int
    max_seq: int
    skipped: bool = False
    query_id: str | None = None


def _ours(messages: list[WriterCommitMessage | None]) -> list[KayosCommitMessage]:
    return [m for m in messages if isinstance(m, KayosCommitMessage)]


def _task_property(name: str) -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(name)


class KayosBatchWriter(DataSourceArrowWriter):  # type: ignore[misc, unused-ignore]
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> KayosCommitMessage:
        done = io.write_batches(self.options, iterator)
        return KayosCommitMessage(done.rows, done.max_seq, False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every row was acknowledged at acks before its task succeeded

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        written = sum(m.rows for m in _ours(messages))
        log.warning("kayos write aborted; %d rows of finished tasks stay written", written)


class KayosStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc, unused-ignore]
    """Writes a micro-batch unless the query's sink already committed it (the replay marker)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> KayosCommitMessage:
        batch_text = _task_property("streaming.sql.batchId")
        query_id = _task_property("sql.streaming.queryId")
        if batch_text is not None and query_id is not None:
            client = io.client_for(self.options)
            if int(batch_text) <= io.last_committed_batch(client, self.options.queue, query_id):
                for _ in iterator:
                    pass  # a replay of a committed batch: written already
                return KayosCommitMessage(0, 0, True, query_id)
        done = io.write_batches(self.options, iterator)
        return KayosCommitMessage(done.rows, done.max_seq, False, query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records the batch as committed (the replay marker), unless every task found it
        recorded already. Runs on the driver once every task succeeded."""
        done = _ours(messages)
        query_ids = {m.query_id for m in done if m.query_id is not None}
        if not query_ids:
            log.warning("kayos sink: no query id for batch %d; replay marker not written", batchId)
            return
        if all(m.skipped for m in done):
            return
        max_seq = max((m.max_seq for m in done), default=0)
        client = io.client_for(self.options)
        for query_id in sorted(query_ids):
            io.record_committed_batch(client, self.options.queue, query_id, batchId, max_seq)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        written = sum(m.rows for m in _ours(messages))
        log.warning("kayos sink: batch %d aborted; %d rows stay written", batchId, written)
