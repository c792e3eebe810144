"""The figures of ``kayos bench failover`` (kayos.bench.membership.failover_figures) from recorded
calls given here: when writes resume, the longest gap between a thread's acknowledgements, the
spreads over repetitions with cases that never resumed, lost and duplicated messages, the stall
schedule, the manager's removals and the targets. No cluster runs."""

from __future__ import annotations

import itertools

import pytest

from kayos.bench.membership.failover import FailoverBenchParameters
from kayos.bench.membership.failover_figures import (
    Call,
    all_resumed_at,
    case_summary,
    count_versions,
    key_of,
    longest_gap_s,
    read_back_figures,
    removals,
    spread,
    stall_schedule,
    targets,
    unread_seqs,
    writes_resume_s,
)

pytestmark = pytest.mark.unit

FAULT_S = 10.0


def acked(thread: int, n: int, sent_s: float, done_s: float) -> Call:
    return Call(thread, n, sent_s, done_s, ok=True)


def raised(thread: int, n: int, sent_s: float, done_s: float) -> Call:
    return Call(thread, n, sent_s, done_s, ok=False)


# Two threads. Thread 0's call in flight at the fault (sent 9.99) is acknowledged at 10.5, before
# any call sent after the fault; its next call (sent 10.5) at 11.2. Thread 1's call in flight
# raises at 10.8, its next one (sent 10.8) is acknowledged at 11.0.
RECORD = [
    acked(0, 1, 9.90, 9.95),
    acked(0, 2, 9.95, 9.99),
    acked(0, 3, 9.99, 10.50),
    acked(0, 4, 10.50, 11.20),
    acked(1, 1, 9.90, 9.97),
    raised(1, 2, 9.97, 10.80),
    acked(1, 3, 10.80, 11.00),
    acked(1, 4, 11.00, 11.05),
]


def test_writes_resume_at_the_first_ack_of_a_call_sent_after_the_fault() -> None:
    # Thread 0's ack at 10.5 was of a call sent before the fault: it does not count.
    assert writes_resume_s(RECORD, FAULT_S, end_s=20.0) == 1.0


def test_writes_that_resume_only_after_the_case_ended_did_not_resume() -> None:
    assert writes_resume_s(RECORD, FAULT_S, end_s=10.9) is None
    assert writes_resume_s(RECORD[:3], FAULT_S, end_s=20.0) is None


def test_every_thread_resumed_once_each_had_a_call_sent_after_the_fault_acknowledged() -> None:
    assert all_resumed_at(RECORD, FAULT_S, threads=[0, 1]) == 11.2
    without_thread_0s_next = [call for call in RECORD if (call.thread, call.n) != (0, 4)]
    assert all_resumed_at(without_thread_0s_next, FAULT_S, threads=[0, 1]) is None
    assert all_resumed_at(RECORD, FAULT_S, threads=[0, 1, 2]) is None


def test_the_longest_gap_is_one_threads_and_runs_through_a_call_that_raised() -> None:
    # Thread 1: 9.97 -> 11.00 (its raised call is no ack) = 1.03; thread 0: at most 0.7.
    assert longest_gap_s(RECORD, FAULT_S, end_s=20.0, threads=[0, 1]) == 1.03


def test_the_longest_gap_counts_only_gaps_ending_after_the_fault() -> None:
    before = [acked(0, 1, 0.0, 1.0), acked(0, 2, 1.0, 9.0), acked(0, 3, 9.0, 10.2)]
    # 1.0 -> 9.0 is longer, but ended before the fault; 9.0 -> 10.2 spans it.
    assert longest_gap_s(before, FAULT_S, end_s=20.0, threads=[0]) == 1.2


def test_a_thread_without_an_ack_after_the_fault_leaves_the_gap_unknown() -> None:
    assert longest_gap_s(RECORD, FAULT_S, end_s=10.4, threads=[0, 1]) is None
    assert longest_gap_s(RECORD, FAULT_S, end_s=20.0, threads=[0, 1, 2]) is None


def test_a_spread_counts_a_case_that_never_resumed_as_the_longest() -> None:
    assert spread([0.3, 0.1, 0.2]) == {
        "median": 0.2,
        "worst": 0.3,
        "values": [0.3, 0.1, 0.2],
        "did_not_resume": 0,
    }
    one_null = spread([0.3, None, 0.1])
    assert (one_null["median"], one_null["worst"], one_null["did_not_resume"]) == (0.3, None, 1)
    assert spread([0.1, None])["median"] is None  # half did not resume: no median
    assert spread([0.1, 0.3, 0.2, None])["median"] == 0.25
    assert spread([None, None, 0.1, 0.2])["median"] is None
    assert spread([])["median"] is None


def test_lost_and_duplicated_messages_from_the_versions_read_back() -> None:
    keys = [key_of(0, 1), key_of(0, 2), key_of(0, 2), key_of(1, 1), "_start", "other"]
    wanted = [key_of(0, 1), key_of(0, 2), key_of(1, 1), key_of(1, 2), key_of(1, 3)]
    versions = count_versions(keys, wanted)
    assert versions == {"p0-1": 1, "p0-2": 2, "p1-1": 1}
    # p1-2 was acknowledged and is missing; p1-3 raised and is missing (not a loss).
    acked_keys = ["p0-1", "p0-2", "p1-1", "p1-2"]
    assert read_back_figures(acked_keys, versions) == {"lost": 1, "duplicates": 1}


def test_the_seqs_read_alone_are_those_between_the_markers_holding_no_live_message() -> None:
    assert unread_seqs(10, 16, [11, 12, 14, 16]) == [13, 15]
    assert unread_seqs(10, 11, []) == []


def test_the_stall_schedule_is_the_seeds_takes_the_nodes_in_turn_and_ends_within_the_phase() -> (
    None
):
    schedule = stall_schedule(7, ["a", "b", "c"], 30.0, 0.3, (2.0, 3.0))
    assert schedule == stall_schedule(7, ["a", "b", "c"], 30.0, 0.3, (2.0, 3.0))
    assert schedule != stall_schedule(8, ["a", "b", "c"], 30.0, 0.3, (2.0, 3.0))
    assert [node for _at, node in schedule[:4]] == ["a", "b", "c", "a"]
    times = [at for at, _node in schedule]
    assert 2.0 <= times[0] <= 3.0
    assert all(2.0 - 1e-3 <= b - a <= 3.0 + 1e-3 for a, b in itertools.pairwise(times))
    assert times[-1] + 0.3 <= 30.0
    assert 9 <= len(schedule) <= 14
    with pytest.raises(ValueError, match="spacing"):
        stall_schedule(7, ["a"], 30.0, 0.3, (3.0, 2.0))


def test_removals_are_the_nodes_a_change_after_the_epoch_took_out_of_a_chain() -> None:
    changes = [
        {"epoch": 4, "shards": [{"id": 0, "chain": ["a", "b"]}]},  # before the phase: ignored
        {"epoch": 6, "shards": [{"id": 0, "chain": ["b", "c"]}]},
        {"epoch": 7, "shards": [{"id": 0, "chain": ["b", "c", "a"]}]},  # a rejoined
        {"epoch": 8, "shards": [{"id": 0, "chain": ["c", "a"]}]},
    ]
    found = removals({0: ["a", "b", "c"]}, 5, changes)
    assert found == [
        {"epoch": 6, "shard": 0, "node": "a"},
        {"epoch": 8, "shard": 0, "node": "b"},
    ]
    assert removals({0: ["a", "b", "c"]}, 8, changes) == []


def _case(resumes: list[float | None], lost: int | None = 0) -> dict[str, object]:
    records = [
        {
            "writes_resume_s": resume,
            "longest_gap_s": resume,
            "acks": 10,
            "errors": 0,
            "lost": lost,
            "duplicates": 0,
        }
        for resume in resumes
    ]
    return case_summary(records)


def test_targets_judge_every_role_and_miss_on_a_case_that_never_resumed() -> None:
    cases = {
        "kill9": {"head": _case([0.1, 0.2, 0.15]), "tail": _case([0.1, 0.4, 0.1])},
        "sigstop": {"head": _case([0.5, None, 0.6]), "tail": _case([0.9, 1.0, 1.1])},
    }
    found = targets(cases, false_removals=0)
    assert found["kill9_resume_median_s"] == {
        "value": 0.15,
        "target": "<= 0.2 s, every role",
        "met": True,
    }
    assert found["kill9_resume_worst_s"]["met"] is True
    assert found["sigstop_resume_median_s"]["met"] is True  # medians 0.6 and 1.0
    assert found["sigstop_resume_worst_s"] == {
        "value": None,
        "target": "<= 1.5 s, every role",
        "met": False,
    }
    assert found["lost"]["met"] is True
    assert found["false_removals"]["met"] is True
    assert targets(cases, false_removals=None)["false_removals"]["met"] is None
    lossy = {"kill9": {"head": _case([0.1], lost=2)}}
    assert targets(lossy, 0)["lost"] == {"value": 2, "target": "0", "met": False}


def test_a_case_summary_sums_the_counts_and_an_unknown_count_stays_unknown() -> None:
    summary = _case([0.1, 0.2])
    assert (summary["acks"], summary["lost"], summary["repetitions"]) == (20, 0, 2)
    assert _case([0.1, 0.2], lost=None)["lost"] is None


def test_parameters_refuse_what_the_bench_cannot_run() -> None:
    with pytest.raises(ValueError, match="faults"):
        FailoverBenchParameters(faults=("kill8",))
    with pytest.raises(ValueError, match="roles"):
        FailoverBenchParameters(roles=())
    with pytest.raises(ValueError, match="repeat"):
        FailoverBenchParameters(repeat=0)
    with pytest.raises(ValueError, match="stall_every_s"):
        FailoverBenchParameters(stall_every_s=(0.2, 0.3))
