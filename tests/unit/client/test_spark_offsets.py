"""The Spark source's pure parts (kayos/spark/offsets.py): options, offsets, the read limit's
share-out and range splitting. No pyspark, no network."""

from __future__ import annotations

import itertools
import json

import pytest

from kayos.errors import InvalidRequest
from kayos.spark.offsets import (
    SeqRange,
    SourceOptions,
    endpoints,
    parse_offset,
    share_limit,
    split_ranges,
    to_offset,
)

pytestmark = pytest.mark.unit

BASE = {"kayos.endpoints": "127.0.0.1:7101, http://127.0.0.1:7102", "queue": "orders"}


def test_options_defaults_and_aliases() -> None:
    batch = SourceOptions.parse(BASE, streaming=False)
    assert batch.seeds == ("http://127.0.0.1:7101", "http://127.0.0.1:7102")
    assert (batch.starting, batch.ending, batch.acks) == ("earliest", "latest", "all")
    assert batch.fail_on_data_loss
    assert not batch.include_headers
    stream = SourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "7"}, streaming=True)
    assert stream.starting == "latest"
    assert stream.max_rows_per_trigger == 7


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"queue": None}, "queue is required"),
        ({"kayos.endpoints": None}, "kayos.cluster is required"),
        ({"kayos.endpoints": " , "}, "names no node"),
        ({"maxRowsPerTrigger": "lots"}, "maxRowsPerTrigger"),
        ({"maxRowsPerTrigger": "0"}, "maxRowsPerTrigger"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"acks": "2"}, "acks"),
        ({"startingOffsets": "yesterday"}, "startingOffsets"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets"),
        ({"startingOffsets": '{"orders": {"0": -3}}'}, "startingOffsets"),
        ({"endingOffsets": '{"orders": {"0": -2}}'}, "endingOffsets"),
        ({"startingOffsets": "committed"}, "consumerGroup"),
        ({"kayos.timeoutS": "soon"}, "kayos.timeoutS"),
        ({"kayos.pageRows": "1000000"}, "kayos.pageRows"),
    ],
)
def test_bad_options_name_the_option(extra: dict[str, str | None], named: str) -> None:
    options = {**BASE, **extra}
    options = {k: v for k, v in options.items() if v is not None}
    with pytest.raises(InvalidRequest, match=named):
        SourceOptions.parse(options, streaming=True)  # type: ignore[arg-type]


def test_endpoints_take_urls_and_host_ports() -> None:
    assert endpoints("a:1,http://b:2") == ["http://a:1", "http://b:2"]


def test_kayos_cluster_names_the_nodes_as_kayos_endpoints_did() -> None:
    """``kayos.cluster`` is the command line's ``--cluster``; ``kayos.endpoints`` and ``seeds``
    still work, and ``kayos.cluster`` wins when both are given."""
    nodes = {"queue": "orders", "kayos.cluster": "c:3"}
    assert SourceOptions.parse(nodes, streaming=False).seeds == ("http://c:3",)
    both = {**BASE, "kayos.cluster": "c:3"}
    assert SourceOptions.parse(both, streaming=False).seeds == ("http://c:3",)
    older = {"queue": "orders", "seeds": "d:4"}
    assert SourceOptions.parse(older, streaming=False).seeds == ("http://d:4",)


def test_offsets_have_sorted_string_keys_and_round_trip() -> None:
    offset = to_offset("orders", {10: 5, 2: 7, 1: 0})
    assert json.dumps(offset) == '{"orders": {"1": 0, "10": 5, "2": 7}}'
    assert parse_offset(json.loads(json.dumps(offset)), "orders", "x") == {1: 0, 10: 5, 2: 7}
    assert parse_offset('{"orders": {"0": -2}}', "orders", "x") == {0: -2}


def test_share_limit_is_proportional_and_never_over() -> None:
    assert share_limit({0: 0}, {0: 1000}, 250) == {0: 250}
    assert share_limit({0: 0}, {0: 100}, 250) == {0: 100}
    cut = share_limit({0: 0, 1: 100}, {0: 900, 1: 200}, 100)
    assert cut == {0: 90, 1: 110}
    # A small shard still advances; the total stays within the limit.
    cut = share_limit({0: 0, 1: 0}, {0: 10_000, 1: 1}, 10)
    assert cut[1] == 1
    assert sum(cut.values()) <= 10


def test_split_ranges_cover_each_range_once() -> None:
    assert split_ranges("q", {0: 5}, {0: 5}, None) == []
    assert split_ranges("q", {0: 5}, {0: 9}, None) == [SeqRange("q", 0, 5, 9)]
    ranges = split_ranges("q", {0: 0, 1: 0}, {0: 1000, 1: 10}, 6)
    assert len(ranges) >= 6
    for shard, end in ((0, 1000), (1, 10)):
        pieces = [r for r in ranges if r.shard == shard]
        assert pieces[0].after == 0
        assert pieces[-1].upto == end
        assert all(a.upto == b.after for a, b in itertools.pairwise(pieces))
    # Never more pieces than seqs.
    assert len(split_ranges("q", {0: 0}, {0: 2}, 50)) == 2
