"""The floor of ``kayos bench spark``: a Python data source (``kayos-bench-floor``) that reads
nothing and yields one Arrow record batch of the kayos schema over and over, so its rows/s is
what Spark itself costs to move rows out of a Python source (workers, Arrow to the JVM, the
aggregate), with no cluster and no decoding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from kayos.spark.source import SCHEMA

# Rows per yielded batch: the source's page size (one page of 10,000 is one batch there too).
floor_batch_rows = 10_000


class FloorSource(DataSource):  # type: ignore[misc, unused-ignore]
    @classmethod
    def name(cls) -> str:
        return "kayos-bench-floor"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        options = self.options
        return FloorReader(
            int(options["rows"]), int(options["partitions"]), int(options["value_bytes"])
        )


class FloorReader(DataSourceReader):  # type: ignore[misc, unused-ignore]
    def __init__(self, rows: int, partitions: int, value_bytes: int) -> None:
        self.rows = rows
        self.partitions_count = partitions
        self.value_bytes = value_bytes

    def partitions(self) -> Sequence[InputPartition]:
        share = -(-self.rows // self.partitions_count)
        counts = [min(share, self.rows - i * share) for i in range(self.partitions_count)]
        return [InputPartition(count) for count in counts if count > 0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from kayos.client.types import Page, PageColumns
        from kayos.spark.io import arrow_schema, page_batch

        rows = int(partition.value)
        count = min(floor_batch_rows, rows)
        columns = PageColumns(
            list(range(1, count + 1)),
            [b"k%012d" % n for n in range(count)],
            [b"x" * self.value_bytes] * count,
        )
        page = Page.from_columns(0, "_read", 0, count, columns, count, True)
        batch = page_batch(page, "bench", arrow_schema(False))
        while rows > 0:
            yield batch if rows >= count else batch.slice(0, rows)
            rows -= count
