"""The figures of ``kayos bench failover`` as pure functions of what was recorded: the producers'
calls (when each was sent, when it ended, whether it was acknowledged), the messages read back,
the manager's chain change records, and the seeded stall schedule. No clock, no I/O: the same
record always gives the same figures (docs/performance.md, "Failover as connected producers see
it", defines each one).

Times are seconds on one monotonic clock; a figure that cannot be known within the case's bound
is None (JSON null), and in a spread a None counts as longer than any measured value.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The targets, in seconds, by fault: (median at most, worst at most) of writes_resume_s.
RESUME_TARGETS_S: dict[str, tuple[float, float]] = {"kill9": (0.2, 0.5), "sigstop": (1.0, 1.5)}


@dataclass(frozen=True, slots=True)
class Call:
    """One produce call of producer thread ``thread``: its ``n``-th message, sent at ``sent_s``,
    returned (acknowledged if ``ok``, else raised) at ``done_s``."""

    thread: int
    n: int
    sent_s: float
    done_s: float
    ok: bool


def key_of(thread: int, n: int) -> str:
    """The key of thread ``thread``'s ``n``-th message: ``p<thread>-<n>``."""
    return f"p{thread}-{n}"


def _acks_by_thread(calls: Iterable[Call]) -> dict[int, list[Call]]:
    by_thread: dict[int, list[Call]] = {}
    for call in calls:
        if call.ok:
            by_thread.setdefault(call.thread, []).append(call)
    for acks in by_thread.values():
        acks.sort(key=lambda call: call.done_s)
    return by_thread


def writes_resume_s(calls: Iterable[Call], fault_s: float, end_s: float) -> float | None:
    """From the fault to the first acknowledgement, on any thread, of a call sent after it (by
    ``end_s``); None if there is none. A call in flight at the fault never counts."""
    resumed = [c.done_s for c in calls if c.ok and c.sent_s > fault_s and c.done_s <= end_s]
    return round(min(resumed) - fault_s, 3) if resumed else None


def all_resumed_at(calls: Iterable[Call], fault_s: float, threads: Iterable[int]) -> float | None:
    """When the last of ``threads`` had its first call sent after the fault acknowledged; None
    while one has not."""
    firsts: dict[int, float] = {}
    for call in calls:
        if call.ok and call.sent_s > fault_s:
            firsts[call.thread] = min(call.done_s, firsts.get(call.thread, math.inf))
    wanted = list(threads)
    if any(thread not in firsts for thread in wanted):
        return None
    return max((firsts[thread] for thread in wanted), default=None)


def longest_gap_s(
    calls: Iterable[Call], fault_s: float, end_s: float, threads: Iterable[int]
) -> float | None:
    """For each of ``threads``, the longest time between two consecutive acknowledgements of its
    calls among the gaps ending in ``(fault_s, end_s]`` (the gap across the fault included); the
    longest of the threads. None if some thread had no acknowledgement in ``(fault_s, end_s]``.
    Calls that raised are not acknowledgements: a gap runs on through them."""
    by_thread = _acks_by_thread(calls)
    longest = 0.0
    for thread in threads:
        times = [call.done_s for call in by_thread.get(thread, []) if call.done_s <= end_s]
        if not any(t > fault_s for t in times):
            return None
        for before, after in itertools.pairwise(times):
            if after > fault_s:
                longest = max(longest, after - before)
    return round(longest, 3)


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``median`` and ``worst`` of the repetitions' ``values``, a None counting as longer than
    any number (so a worst with a None is None, and so is a median when half or more are);
    ``did_not_resume`` counts the Nones."""
    ordered = sorted(math.inf if value is None else value for value in values)
    if not ordered:
        return {"median": None, "worst": None, "values": [], "did_not_resume": 0}
    upper_median = ordered[len(ordered) // 2]  # a None at or past the middle makes it unknown
    median = None if math.isinf(upper_median) else statistics.median(ordered)
    worst = ordered[-1]
    return {
        "median": None if median is None else round(median, 3),
        "worst": None if math.isinf(worst) else worst,
        "values": list(values),
        "did_not_resume": sum(1 for value in values if value is None),
    }


def unread_seqs(start_seq: int, end_seq: int, live_seqs: Iterable[int]) -> list[int]:
    """The seqs strictly between the two markers that held no live message of the queue: where a
    superseded version (a duplicate) may lie."""
    live = set(live_seqs)
    return [seq for seq in range(start_seq + 1, end_seq) if seq not in live]


def read_back_figures(acked: Iterable[str], versions: Mapping[str, int]) -> dict[str, int]:
    """``lost``: acknowledged keys with no version in the queue; ``duplicates``: versions beyond
    the first of each key (``versions``: key -> versions found, live and superseded)."""
    lost = sum(1 for key in set(acked) if versions.get(key, 0) == 0)
    duplicates = sum(count - 1 for count in versions.values() if count > 1)
    return {"lost": lost, "duplicates": duplicates}


def count_versions(keys: Iterable[str], wanted: Iterable[str]) -> Counter[str]:
    """How many times each key of ``wanted`` occurs in ``keys`` (the versions read back)."""
    known = set(wanted)
    return Counter(key for key in keys if key in known)


def stall_schedule(
    seed: int, nodes: Sequence[str], duration_s: float, stall_s: float, every_s: tuple[float, float]
) -> list[tuple[float, str]]:
    """The stall phase's schedule: (seconds from the phase's start, node), the nodes in turn, each
    stall ``every_s`` (drawn uniformly) after the one before, the first one that long after the
    start; only stalls that end within ``duration_s``."""
    if not nodes:
        raise ValueError("the stall schedule needs at least one node")
    low, high = every_s
    if not 0 < low <= high:
        raise ValueError("the stalls' spacing needs 0 < low <= high seconds")
    rng = random.Random(seed)  # noqa: S311 - a replayable schedule, not a secret
    stalls: list[tuple[float, str]] = []
    at_s = rng.uniform(low, high)
    while at_s + stall_s <= duration_s:
        stalls.append((round(at_s, 3), nodes[len(stalls) % len(nodes)]))
        at_s += rng.uniform(low, high)
    return stalls


def removals(
    chains: Mapping[int, Sequence[str]], epoch: int, changes: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Every node a chain change after ``epoch`` took out of a shard's chain, in epoch order:
    ``chains`` are the chains at ``epoch``, ``changes`` the manager's change records (``GET
    /v1/manager/changes``: each ``{"epoch", "shards": [{"id", "chain"}]}``)."""
    current = {shard: list(chain) for shard, chain in chains.items()}
    found: list[dict[str, Any]] = []
    for record in sorted(changes, key=lambda record: int(record["epoch"])):
        if int(record["epoch"]) <= epoch:
            continue
        for shard in record["shards"]:
            number, chain = int(shard["id"]), list(shard["chain"])
            before = current.get(number, chain)
            for node in before:
                if node not in chain:
                    found.append({"epoch": int(record["epoch"]), "shard": number, "node": node})
            current[number] = chain
    return found


def case_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One fault and role over its repetitions: the spreads of the two timings, the sums of the
    counts (a None count, one that could not be made, makes the sum None)."""
    summary: dict[str, Any] = {
        "writes_resume_s": spread([record["writes_resume_s"] for record in records]),
        "longest_gap_s": spread([record["longest_gap_s"] for record in records]),
        "repetitions": len(records),
    }
    for name in ("acks", "errors", "lost", "duplicates"):
        counts = [record[name] for record in records]
        summary[name] = None if any(count is None for count in counts) else sum(counts)
    return summary


def targets(
    cases: Mapping[str, Mapping[str, Mapping[str, Any]]], false_removals: int | None
) -> dict[str, dict[str, Any]]:
    """The issue's targets, each with the value it judges, the target and whether it is ``met``
    (None when a value is unknown)."""

    def verdict(value: Any, met: bool | None, target: str) -> dict[str, Any]:
        return {"value": value, "target": target, "met": met}

    found: dict[str, dict[str, Any]] = {}
    for fault, roles in cases.items():
        if fault not in RESUME_TARGETS_S:
            continue
        median_max, worst_max = RESUME_TARGETS_S[fault]
        medians = [case["writes_resume_s"]["median"] for case in roles.values()]
        worsts = [case["writes_resume_s"]["worst"] for case in roles.values()]
        found[f"{fault}_resume_median_s"] = verdict(
            _worst_of(medians), _all_within(medians, median_max), f"<= {median_max} s, every role"
        )
        found[f"{fault}_resume_worst_s"] = verdict(
            _worst_of(worsts), _all_within(worsts, worst_max), f"<= {worst_max} s, every role"
        )
    lost = [case["lost"] for roles in cases.values() for case in roles.values()]
    found["lost"] = verdict(
        None if None in lost else sum(lost), None if None in lost else sum(lost) == 0, "0"
    )
    found["false_removals"] = verdict(
        false_removals, None if false_removals is None else false_removals == 0, "0"
    )
    return found


def _worst_of(values: Sequence[float | None]) -> float | None:
    return None if not values or None in values else max(v for v in values if v is not None)


def _all_within(values: Sequence[float | None], bound: float) -> bool:
    """A None (did not resume within the case's bound, which is above every target) misses."""
    return all(value is not None and value <= bound for value in values)
