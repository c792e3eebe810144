"""kayos/spark/io.py's Arrow conversions, without Spark or a cluster (pyarrow only)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kayos.client.types import Page, PageColumns
from kayos.errors import InvalidRequest
from kayos.spark.io import arrow_schema, batch_items, page_batch

pytestmark = pytest.mark.spark


def test_a_page_becomes_one_record_batch_of_the_schema() -> None:
    columns = PageColumns(
        [3, 5, 9],
        [b"a", b"b", b"c"],
        [b"1", None, b"3"],
        None,
        [{"h": b"x"}, None, None],
        [False, True, False],
    )
    page = Page.from_columns(2, "_read", 0, 9, columns, 9, True)
    batch = page_batch(page, "orders", arrow_schema(True))
    assert batch.schema == arrow_schema(True)
    assert batch.column("seq").to_pylist() == [3, 5, 9]
    assert batch.column("value").to_pylist() == [b"1", None, b"3"]  # a delete is a null value
    assert batch.column("queue").to_pylist() == ["orders"] * 3
    assert batch.column("shard").to_pylist() == [2] * 3
    assert batch.column("timestamp").null_count == 3
    assert batch.column("headers").to_pylist() == [[("h", b"x")], None, None]
    assert page_batch(page, "orders", arrow_schema(False)).num_columns == 6


def test_the_timestamp_column_holds_the_append_times_null_where_unknown() -> None:
    columns = PageColumns([3, 5, 9], [b"a", b"b", b"c"], [b"1", b"2", b"3"])
    page = Page.from_columns(
        2, "_read", 0, 9, columns._replace(append_ms=[None, 1_500, 1_500]), 9, True
    )
    stamps = page_batch(page, "orders", arrow_schema(False)).column("timestamp")
    assert stamps.type == pa.timestamp("us", tz="UTC")
    assert stamps.cast(pa.int64()).to_pylist() == [None, 1_500_000, 1_500_000]


def test_rows_go_to_their_queue_column_or_the_option() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"key": ["k1", "k2", "k3"], "value": ["v", None, "w"], "queue": ["a", None, "b"]}
    )
    assert batch_items(batch, "default") == {
        "a": [(b"k1", b"v")],
        "default": [(b"k2", None)],
        "b": [(b"k3", b"w")],
    }
    plain = pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"], "other": [1]})
    assert batch_items(plain, "q") == {"q": [(b"k", b"v")]}


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"key": ["k"]}, "columns key and value"),
        ({"key": [None], "value": ["v"]}, "key is null"),
        ({"key": ["k"], "value": ["v"], "queue": ["no/slash"]}, "queue"),
    ],
)
def test_bad_rows_are_refused_before_anything_is_sent(
    columns: dict[str, list[object]], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        batch_items(pa.RecordBatch.from_pydict(columns), "q")
