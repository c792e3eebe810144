"""The campaign's pure parts: the seeded fault schedule and the unavailability figures."""

from __future__ import annotations

import itertools
import signal

import pytest

from chaos.history import Note, Produce
from chaos.procs import faults
from chaos.procs.campaign import FaultSpan, fault_spans, longest_gaps, longest_gaps_by_kind
from kayos import limits

pytestmark = pytest.mark.chaos

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


def test_fault_spans_run_from_each_fault_note_to_its_done_note() -> None:
    events = [
        Note(1, "fault", {"index": 0, "kind": "kill9", "node": "a", "hold_s": 1.0}, at_s=2.0),
        Note(2, "fault done", {"index": 0, "exit_code": -9}, at_s=3.5),
        Note(3, "fault", {"index": 1, "kind": "pause", "node": "b", "hold_s": 0.5}, at_s=4.0),
    ]  # the second never finished: it ends where it began
    assert fault_spans(events) == [FaultSpan("kill9", 2.0, 3.5), FaultSpan("pause", 4.0, 4.0)]
    short = Note(4, "fault", {"index": 2, "kind": "kill9", "node": "c", "whole": False}, at_s=5.0)
    assert fault_spans([*events, short])[-1] == FaultSpan("kill9", 5.0, 5.0, whole=False)


def test_the_unavailability_by_kind_charges_each_stretch_to_the_fault_it_waited_out() -> None:
    shard_of = {"q0": 0, "q1": 1}
    spans = [
        FaultSpan("kill9", 2.0, 3.0),
        FaultSpan("stranger", 3.2, 3.3),
        FaultSpan("pause", 6.0, 6.5),
        FaultSpan("hostile_http", 8.0, 8.1),
    ]
    produces = [
        produce("q0", 0.5),  # 0.0 -> 0.5 and 0.5 -> 1.9 ended before any fault: charged to none
        produce("q0", 1.9),  # the last ack before the kill ...
        produce("q0", 2.5, "unknown"),  # (not an acknowledgement)
        produce("q0", 3.1),  # ... the first after: 1.2 s, the kill's
        produce("q0", 5.9),  # 3.1 -> 5.9: no fault in progress at 3.1, the stranger began last
        produce("q0", 6.2),  # 5.9 -> 6.2: the pause
        produce("q0", 8.05),  # 6.2 -> 8.05: in progress under the pause at 6.2 (1.85)
        produce("q1", 1.0),  # 8.05 -> 10.0 (the phase's end): under hostile_http (1.95)
        produce("q1", 2.1),  # 1.0 -> 2.1: the kill (1.1)
        produce("q1", 4.0),  # 2.1 -> 4.0: in progress under the kill (1.9), not the stranger's
        produce("q1", 9.0),  # 4.0 -> 9.0: hostile_http began last before 9.0 (5.0)
    ]
    found = longest_gaps_by_kind(produces, shard_of, spans, 0.0, 10.0)
    assert found == {"hostile_http": 5.0, "kill9": 1.9, "pause": 1.85, "stranger": 2.8}
    # Alone: only stretches no other fault was in progress in or in the second before. The kill
    # alone: 1.9 -> 3.1 (1.2) and 1.0 -> 2.1; 3.1 -> 5.9 follows the kill's end by 0.1 s, and
    # 2.1 -> 4.0 has the stranger in it: neither counts; 6.2 -> 8.05 and 4.0 -> 9.0 hold two.
    alone = longest_gaps_by_kind(produces, shard_of, spans, 0.0, 10.0, alone=True)
    assert alone == {"hostile_http": 1.95, "kill9": 1.2, "pause": 0.3, "stranger": None}
    # A fault that began while a chain was still short (a member out after an earlier fault)
    # is never alone: what it stops may be the last member of a shard.
    short = [FaultSpan(s.kind, s.start_s, s.end_s, whole=s.kind != "kill9") for s in spans]
    alone = longest_gaps_by_kind(produces, shard_of, short, 0.0, 10.0, alone=True)
    assert alone == {"hostile_http": 1.95, "kill9": None, "pause": 0.3, "stranger": None}


def test_a_stretch_after_a_fault_ended_is_charged_to_the_next_fault_writes_waited_out() -> None:
    """Writes that stop after a fault's span ended (a killed node rejoining after its restart)
    and stay stopped through a later pause are charged to the pause, the last fault begun before
    they resumed, not to the harmless one begun in between."""
    spans = [
        FaultSpan("kill9", 1.0, 2.0),
        FaultSpan("stranger", 2.3, 2.3),
        FaultSpan("pause", 2.6, 6.0),
    ]
    produces = [produce("q0", t) for t in (0.5, 0.9, 1.5, 2.1, 6.1, 6.2)]
    found = longest_gaps_by_kind(produces, {"q0": 0}, spans, 0.0, 6.25)
    assert found == {"kill9": 0.6, "pause": 4.0, "stranger": None}


def test_the_unavailability_by_kind_is_short_for_a_fault_that_stops_no_write() -> None:
    produces = [produce("q0", n / 100) for n in range(1000)]
    found = longest_gaps_by_kind(produces, {"q0": 0}, [FaultSpan("stranger", 4.0, 4.5)], 0.0, 9.99)
    assert found == {"stranger": 0.01}


class _SignalLog:
    """A stand-in for LocalCluster that records the signals each node gets."""

    ids = NODES

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []
        self.started: list[str] = []

    def pid(self, node: str) -> int:
        return 1000 + NODES.index(node)

    def kill(self, node: str, sig: int) -> int:
        self.sent.append((node, sig))
        return 0

    def wait_exit(self, node: str) -> int:
        return 0

    def start(self, node: str, *, wait: bool = True) -> None:
        self.started.append(node)

    def wait_ready(self, nodes: list[str]) -> None:
        pass


def test_restart_all_sends_each_node_one_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second SIGTERM, sent while the first one's clean stop has already closed the node's
    event loop (its handler gone), killed the node by default: campaign seed 11, fault 52,
    "node c exited -15 on SIGTERM" (docs/campaigns.md, Findings)."""
    cluster = _SignalLog()
    by_pid = {cluster.pid(n): n for n in NODES}
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: cluster.sent.append((by_pid[pid], sig)))
    report = faults.inject(cluster, faults.Fault(0, "restart_all", "a", 0.0))  # type: ignore[arg-type]
    assert sorted(cluster.sent) == [(n, signal.SIGTERM) for n in NODES]
    assert cluster.started == NODES
    assert report["exit_codes"] == dict.fromkeys(NODES, 0)


class _SlowStatus:
    """A cluster whose node gives no reply to its first ``missed`` status requests (each timed
    out, as on a loaded box), then answers, if ``answers``."""

    def __init__(self, missed: int, *, answers: bool = True) -> None:
        self.missed = missed
        self.answers = answers
        self.asked = 0

    def status(self, node: str) -> dict[str, object] | None:
        self.asked += 1
        return {"node": node} if self.answers and self.asked > self.missed else None


def test_a_missed_status_reply_is_no_verdict_that_a_node_stopped_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A single ``/v1/status`` request that timed out was reported as the node having stopped
    answering after the hostile requests: the node is asked again within a bound."""
    monkeypatch.setattr(faults, "status_poll_s", 0.0)
    slow = _SlowStatus(missed=2)
    assert faults.answers_status(slow, "a", within_s=30.0)  # type: ignore[arg-type]
    assert slow.asked == 3
    silent = _SlowStatus(missed=0, answers=False)
    assert not faults.answers_status(silent, "a", within_s=0.0)  # type: ignore[arg-type]
    assert silent.asked == 1
