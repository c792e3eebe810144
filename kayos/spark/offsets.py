"""The Spark source's pure parts (docs/spark.md): options, offsets, the read limit's share-out
and the split of ranges into partitions. No pyspark, no network: unit-tested alone."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.topology import check_queue_name

# A shard's position: the last seq already read (the next range starts after it).
Positions = dict[int, int]

EARLIEST = -2  # inside JSON offsets, as in Kafka's source
LATEST = -1


def _option(options: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = options.get(name)
        if value is not None:
            return str(value)
    return None


def _int_option(options: Mapping[str, str], *names: str, low: int = 1) -> int | None:
    text = _option(options, *names)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidRequest(f"option {names[0]} must be an integer, not {text!r}") from None
    if value < low:
        raise InvalidRequest(f"option {names[0]} must be >= {low}, not {value}")
    return value


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _option(options, name)
    if text is None:
        return default
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise InvalidRequest(f"option {name} must be true or false, not {text!r}")
    return word == "true"


def endpoints(text: str) -> list[str]:
    """``kayos.cluster`` (or ``kayos.endpoints``): comma-separated HTTP URLs or ``host:port``, as
    client seeds."""
    seeds = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        seeds.append(part if "://" in part else f"http://{part}")
    if not seeds:
        raise InvalidRequest("option kayos.cluster names no node")
    return seeds


@dataclass(frozen=True)
class SourceOptions:
    """The options of a read or a write, checked (every value Spark gives is a string)."""

    seeds: tuple[str, ...]
    queue: str
    starting: str  # earliest | latest | committed | JSON
    ending: str  # latest | JSON
    max_rows_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    consumer_group: str | None
    include_headers: bool
    acks: str
    timeout_s: float | None
    retries: int | None
    page_rows: int
    # A client credentials file (docs/security.md), readable at that path on every executor.
    credentials: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        # kayos.cluster, as the command line's --cluster; kayos.endpoints and seeds are older names.
        seeds_text = _option(options, "kayos.cluster", "kayos.endpoints", "seeds")
        if seeds_text is None:
            raise InvalidRequest("option kayos.cluster is required (node URLs, comma-separated)")
        queue = _option(options, "queue")
        if queue is None:
            raise InvalidRequest("option queue is required")
        check_queue_name(queue)
        starting = (
            _option(options, "startingOffsets") or ("latest" if streaming else "earliest")
        ).strip()
        ending = (_option(options, "endingOffsets") or "latest").strip()
        group = _option(options, "consumerGroup")
        if starting.lower() == "committed" and group is None:
            raise InvalidRequest("startingOffsets=committed needs the option consumerGroup")
        acks = (_option(options, "acks") or "all").strip().lower()
        if acks not in ("all", "0", "1"):
            raise InvalidRequest(f"option acks must be all, 1 or 0, not {acks!r}")
        timeout_text = _option(options, "kayos.timeoutS")
        timeout_s: float | None = None
        if timeout_text is not None:
            try:
                timeout_s = float(timeout_text)
            except ValueError:
                raise InvalidRequest(
                    f"option kayos.timeoutS must be a number, not {timeout_text!r}"
                ) from None
            if not timeout_s > 0:
                raise InvalidRequest("option kayos.timeoutS must be > 0")
        page_rows = _int_option(options, "kayos.pageRows") or limits.spark_read_page_rows_default
        if page_rows > limits.consume_page_entries_max:
            raise InvalidRequest(
                f"option kayos.pageRows must be <= {limits.consume_page_entries_max}"
            )
        parsed = cls(
            seeds=tuple(endpoints(seeds_text)),
            queue=queue,
            starting=starting,
            ending=ending,
            max_rows_per_trigger=_int_option(options, "maxRowsPerTrigger", "maxOffsetsPerTrigger"),
            min_partitions=_int_option(options, "minPartitions"),
            fail_on_data_loss=_bool_option(options, "failOnDataLoss", True),
            consumer_group=group,
            include_headers=_bool_option(options, "includeHeaders", False),
            acks=acks,
            timeout_s=timeout_s,
            retries=_int_option(options, "kayos.retries"),
            page_rows=page_rows,
            credentials=_option(options, "kayos.credentials"),
        )
        # Malformed JSON offsets are refused now, not at the first trigger.
        if parsed.starting.lower() not in ("earliest", "latest", "committed"):
            parse_offset(parsed.starting, queue, "startingOffsets")
        if parsed.ending.lower() != "latest":
            spec = parse_offset(parsed.ending, queue, "endingOffsets")
            if EARLIEST in spec.values():
                raise InvalidRequest("endingOffsets cannot use -2 (earliest)")
        return parsed

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"name": "kayos-spark"}
        if self.timeout_s is not None:
            options["timeout_s"] = self.timeout_s
        if self.retries is not None:
            options["retries"] = self.retries
        if self.credentials is not None:
            options["credentials"] = self.credentials
        return options


def parse_offset(text: str | Mapping[str, Any], queue: str, what: str) -> Positions:
    """An offset ``{"<queue>": {"<shard>": seq}}`` (JSON text or Spark's decoded dict) as
    ``{shard: seq}``; -2/-1 (earliest/latest) are kept for the caller to resolve."""
    if isinstance(text, str):
        try:
            raw: Any = json.loads(text)
        except ValueError:
            raise InvalidRequest(f"{what} is neither a keyword nor JSON: {text!r}") from None
    else:
        raw = text
    if not isinstance(raw, dict) or set(raw) != {queue} or not isinstance(raw[queue], dict):
        raise InvalidRequest(f'{what} must be {{"{queue}": {{"<shard>": <seq>}}}}, not {text!r}')
    positions: Positions = {}
    for shard_text, seq in raw[queue].items():
        try:
            shard = int(shard_text)
        except (TypeError, ValueError):
            raise InvalidRequest(f"{what}: shard {shard_text!r} is not a number") from None
        if type(seq) is not int or seq < EARLIEST or seq > limits.u64_max:
            raise InvalidRequest(f"{what}: shard {shard}'s seq must be an integer >= -2")
        positions[shard] = seq
    return positions


def to_offset(queue: str, positions: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """The offset Spark stores: string keys in sorted order (Spark compares offsets as JSON
    text), integer seqs."""
    keys = sorted(str(shard) for shard in positions)
    return {queue: {key: int(positions[int(key)]) for key in keys}}


def share_limit(start: Mapping[int, int], ends: Mapping[int, int], max_rows: int) -> Positions:
    """Ends cut so that all shards together advance at most ``max_rows`` seqs: the backlog is
    shared in proportion to each shard's, each shard with backlog getting at least one."""
    backlog = {shard: max(0, ends[shard] - start.get(shard, 0)) for shard in ends}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(ends)
    cut: Positions = {}
    left = max_rows
    for shard in sorted(backlog):
        share = backlog[shard] * max_rows // total
        if backlog[shard] > 0:
            share = max(1, share)
        share = min(share, left, backlog[shard])
        left -= share
        cut[shard] = start.get(shard, 0) + share
    return cut


@dataclass(frozen=True)
class SeqRange:
    """One Spark partition: the queue's entries of ``shard`` with ``after < seq <= upto``,
    read as of ``upto`` (the node's snapshot of a consume page range)."""

    queue: str
    shard: int
    after: int
    upto: int


def split_ranges(
    queue: str, start: Mapping[int, int], end: Mapping[int, int], min_partitions: int | None
) -> list[SeqRange]:
    """One range per shard with ``end > start``; with ``min_partitions``, shards are cut into
    seq sub-ranges (largest backlogs cut most) until there are at least that many."""
    spans = {
        shard: (start.get(shard, 0), end[shard])
        for shard in sorted(end)
        if end[shard] > start.get(shard, 0)
    }
    if not spans:
        return []
    total = sum(upto - after for after, upto in spans.values())
    want = max(min_partitions or 0, len(spans))
    ranges: list[SeqRange] = []
    for shard, (after, upto) in spans.items():
        pieces = max(1, min(upto - after, math.ceil((upto - after) * want / total)))
        step = (upto - after) / pieces
        bounds = [after + round(step * i) for i in range(pieces)] + [upto]
        for low, high in itertools.pairwise(bounds):
            if high > low:
                ranges.append(SeqRange(queue, shard, low, high))
    return ranges
