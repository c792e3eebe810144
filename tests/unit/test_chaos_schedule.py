"""The campaign's pure parts: the seeded fault schedule and the unavailability figure."""

from __future__ import annotations

import itertools

from chaos.history import Produce
from chaos.procs import faults
from chaos.procs.campaign import longest_gaps
from kayos import limits

NODES = ["a", "b", "c"]


def first(seed: int, count: int, kinds: tuple[str, ...] = faults.KINDS) -> list[faults.Fault]:
    return list(itertools.islice(faults.schedule(seed, NODES, kinds), count))


def test_a_seed_replays_the_same_faults() -> None:
    assert first(7, 200) == first(7, 200)
    assert first(7, 200) != first(8, 200)


def test_the_schedule_draws_every_kind_and_pauses_past_the_silence_bound() -> None:
    drawn = first(1, 2000)
    assert {fault.kind for fault in drawn} == set(faults.KINDS)
    assert {fault.node for fault in drawn} == set(NODES)
    pauses = [fault.hold_s for fault in drawn if fault.kind == "pause"]
    silence_s = limits.peer_silence_ms_max / 1000
    assert any(hold > silence_s for hold in pauses)
    assert any(hold < silence_s for hold in pauses)
    assert all(faults.pause_s_min <= hold <= faults.pause_s_max for hold in pauses)


def test_kinds_can_be_narrowed() -> None:
    assert {fault.kind for fault in first(3, 300, ("kill9", "stranger"))} == {"kill9", "stranger"}


def produce(queue: str, at_s: float, outcome: str = "ok") -> Produce:
    return Produce(0, queue, (("k", "v"),), False, "all", outcome, 1, 1, 0, 0, at_s)  # type: ignore[arg-type]


def test_longest_gaps_per_shard() -> None:
    shard_of = {"q0": 0, "q1": 1}
    produces = [
        produce("q0", 1.0),
        produce("q0", 2.0),
        produce("q0", 7.5, "unknown"),  # not an acknowledgement: the gap runs on
        produce("q0", 8.0),
        produce("q1", 9.0),
    ]
    assert longest_gaps(produces, shard_of, 0.0, 10.0) == {"0": 6.0, "1": 9.0}
