"""The idempotent producer in the simulator (docs/node-api.md, the idempotent producer;
docs/testing.md, "The simulator"): the head's producer window, and the checks on the final logs.

**Modelled here until the product has it**: ``window_decision`` and ``record`` stand for the
head's producer window of the product (per shard, per producer id, the last
``producer_window_entries`` accepted producer seqs with their batch's first and last seq). The
simulator's store keeps the window as a function of its own log (every entry carries its producer
id and producer seq), which is what the product's replicated metadata amounts to: every replica
has it, it is durable with the batch, a rollback restores it and a new head holds it at once.

``check_logs`` judges a run's producer calls against each shard's final log: ``exactly_once``
(every call in the log at most once, every acknowledged one exactly once at the seqs its
acknowledgement named) and ``producer_order`` (a producer's acknowledged calls to one shard lie
in the log in the order it made them).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# producer seq -> (first seq, last seq) of its batch, oldest accepted first.
Window = dict[int, tuple[int, int]]

PROPERTIES = ("exactly_once", "producer_order")
EXAMPLES_MAX = 10


def window_decision(
    window: Window | None, pseq: int, entries_max: int
) -> tuple[str, tuple[int, int] | None]:
    """What the head does with a produce carrying ``pseq``: ``("duplicate", (first, last))``
    (written before: answer with those seqs once committed), ``("too_old", None)`` (below the
    oldest of a full window: the outcome of that call cannot be known), else ``("write",
    None)``."""
    if not window:
        return "write", None
    found = window.get(pseq)
    if found is not None:
        return "duplicate", found
    if len(window) >= entries_max and pseq < min(window):
        return "too_old", None
    return "write", None


def record(window: Window, pseq: int, seq: int, entries_max: int) -> None:
    """Adds one written entry (at ``seq``) of a producer's call to its window (a call's entries
    extend one range), forgetting the oldest past ``entries_max``."""
    found = window.get(pseq)
    if found is not None:
        window[pseq] = (min(found[0], seq), max(found[1], seq))
        return
    window[pseq] = (seq, seq)
    while len(window) > entries_max:
        del window[next(iter(window))]


@dataclass(frozen=True)
class CallRecord:
    """A finished producer call, as the client saw it."""

    op: int
    producer: str
    pseq: int
    shard: int
    items: int
    outcome: str  # "ok" or "unknown"
    first: int
    last: int
    invoked: int


def _violation(prop: str, message: str, examples: list[Any]) -> dict[str, Any]:
    return {
        "property": prop,
        "message": message,
        "detail": {"count": len(examples), "examples": examples[:EXAMPLES_MAX]},
    }


def check_logs(
    logs: Mapping[int, Sequence[tuple[int, str, int]]], calls: Iterable[CallRecord]
) -> list[dict[str, Any]]:
    """The violations of ``exactly_once`` and ``producer_order`` by ``calls`` in ``logs`` (each
    shard's final log as (seq, producer id, producer seq) per entry)."""
    seqs: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    for shard, log in logs.items():
        for seq, producer, pseq in log:
            if producer:
                seqs[(shard, producer, pseq)].append(seq)
    twice: list[Any] = []
    missing: list[Any] = []
    order: list[Any] = []
    acked: dict[tuple[str, int], list[CallRecord]] = defaultdict(list)
    for call in calls:
        found = sorted(seqs.get((call.shard, call.producer, call.pseq), ()))
        example = {
            "op": call.op,
            "producer": call.producer,
            "producer_seq": call.pseq,
            "shard": call.shard,
            "outcome": call.outcome,
            "acked": [call.first, call.last],
            "in_log": found,
        }
        if len(found) > call.items:
            twice.append(example)
        elif call.outcome == "ok" and found != list(range(call.first, call.last + 1)):
            missing.append(example)
        if call.outcome == "ok":
            acked[(call.producer, call.shard)].append(call)
    for (producer, shard), done in sorted(acked.items()):
        done.sort(key=lambda call: call.invoked)
        for before, after in itertools.pairwise(done):
            if after.first <= before.last:
                order.append(
                    {
                        "producer": producer,
                        "shard": shard,
                        "earlier": [before.op, before.pseq, before.first, before.last],
                        "later": [after.op, after.pseq, after.first, after.last],
                    }
                )
    out = []
    if twice:
        out.append(_violation("exactly_once", "a producer call is in the log twice", twice))
    if missing:
        message = "an acknowledged producer call is not in the log at its acknowledged seqs"
        out.append(_violation("exactly_once", message, missing))
    if order:
        message = "a producer's acknowledged calls are not in the log in its order"
        out.append(_violation("producer_order", message, order))
    return out
