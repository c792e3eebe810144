"""Append times of consumed messages from the time-index samples a page carries
(docs/node-api.md, "Append times"): the reply's ``times`` checked, and expanded to one time per
message by the floor rule. Pure functions; ``kayos.client.types`` calls them while decoding a
page.

The rule: a message's append time is the time of the last sample at or below its seq; None when
that sample's time is unknown (null) or no sample is at or below it. The node samples the first
batch its replica takes in within each ``limits.time_index_interval_ms``, so every seq from one
sample to the next came in within one interval after the sample: the time found is never later
than when the answering tail took the message in, and at most one interval earlier.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import islice
from operator import lt
from typing import Any

from kayos import limits

Sample = tuple[int, int | None]


def samples_from_reply(raw: Any) -> list[Sample]:
    """A reply's ``times``: at most ``limits.consume_page_time_samples_max`` pairs ``[seq,
    unix_ms or null]`` of non-negative integers, seqs strictly increasing. Raises ``TypeError``
    or ``ValueError`` (the page decoder makes it a ``ProtocolError``)."""
    if not isinstance(raw, list | tuple):
        raise TypeError(f"times must be a list, not {type(raw).__name__}")
    if len(raw) > limits.consume_page_time_samples_max:
        raise ValueError(
            f"times holds {len(raw)} samples, over {limits.consume_page_time_samples_max}"
        )
    samples: list[Sample] = []
    for pair in raw:
        seq, ms = pair  # a pair or a TypeError/ValueError
        if type(seq) is not int or seq < 0 or not (ms is None or (type(ms) is int and ms >= 0)):
            raise ValueError(f"a times sample must be [seq, unix_ms or null], not {pair!r}")
        samples.append((seq, ms))
    seqs = [seq for seq, _ in samples]
    if not all(map(lt, seqs, islice(seqs, 1, None))):
        raise ValueError("times samples must be in strictly increasing seq order")
    return samples


def times_of(seqs: Sequence[int], samples: Sequence[Sample]) -> list[int | None]:
    """Each of ``seqs``' (ascending) append time in unix ms by the floor rule over ``samples``
    (ascending by seq): the time of the last sample at or below the seq, None when there is none
    or its time is unknown. One bisect per sample, not a step per message."""
    times: list[int | None] = []
    current: int | None = None  # below the first sample: unknown
    for seq, ms in samples:
        reached = bisect_left(seqs, seq, len(times))
        times += [current] * (reached - len(times))
        current = ms
    times += [current] * (len(seqs) - len(times))
    return times


def known_times(appended: Sequence[int | None]) -> Sequence[int | None] | None:
    """A page's ``append_ms`` column, or None when no message has a known time."""
    return None if appended.count(None) == len(appended) else appended
