"""The copy pacer's decisions (kayos.replication.logic.pacing and its driver
kayos.replication.link.pacer; docs/performance.md, "Pacing a copy"): transcripts of (state, event)
-> (state, actions) with the time given, and the live-rate counter it reads its baseline from."""

from __future__ import annotations

import asyncio

import pytest

from kayos import limits
from kayos.replication.link.pacer import CopyPacer
from kayos.replication.logic import pacing
from kayos.replication.logic.pacing import Marks, Pause, Piece, ShareChanged

pytestmark = pytest.mark.unit

WINDOW_S = limits.copy_pace_window_ms / 1000


def _pauses(actions: list[pacing.PacerAction]) -> list[float]:
    return [a.seconds for a in actions if isinstance(a, Pause)]


def _run_windows(
    state: pacing.PacerState, rates: list[float], busy_s: float = 0.01
) -> tuple[pacing.PacerState, list[float]]:
    """Feeds one piece at the end of each window, the live total having grown by ``rate`` a
    window; returns the state and the share after each window."""
    shares = []
    now, total = state.window_start_s, state.window_start_total
    for rate in rates:
        now += WINDOW_S
        total += int(rate * WINDOW_S)
        state, _ = pacing.step(state, Piece(now, busy_s, total, live_s_ago=0.0))
        shares.append(state.share)
    return state, shares


def test_no_live_traffic_copies_unthrottled() -> None:
    state = pacing.start(100.0, 0.05, baseline_per_s=0.0, live_total=0)
    # Nothing live within catchup_live_window_ms: no pause at any share.
    later = 100.0 + limits.catchup_live_window_ms / 1000 + 0.5
    state, actions = pacing.step(state, Piece(later, 0.2, 0, live_s_ago=50.0))
    assert _pauses(actions) == []
    assert state.share == 0.05  # nothing to judge: the share stays


def test_pause_holds_the_copy_to_its_share() -> None:
    state = pacing.start(0.0, 0.05, baseline_per_s=300.0, live_total=0)
    _, actions = pacing.step(state, Piece(0.1, 0.02, 30, live_s_ago=0.01))
    [pause] = _pauses(actions)
    assert 0.02 / (0.02 + pause) == pytest.approx(0.05)


def test_doubles_until_the_first_cut_then_grows_additively() -> None:
    state = pacing.start(0.0, 0.05, baseline_per_s=300.0, live_total=0)
    # 250/s is within 20% of 300/s: a slow start doubles the share a window, up to the ceiling.
    state, shares = _run_windows(state, [250.0] * 3)
    assert shares == pytest.approx([0.1, 0.2, 0.4])
    state, shares = _run_windows(state, [250.0] * 10)
    assert shares[-1] == limits.copy_pace_share_max
    # A drop: cut; from then on growth is a step a window.
    state, shares = _run_windows(state, [100.0])
    assert shares == pytest.approx([limits.copy_pace_share_max * limits.copy_pace_cut])
    assert state.cut
    state, shares = _run_windows(state, [290.0] * 3)
    after_cut = limits.copy_pace_share_max * limits.copy_pace_cut
    assert shares == pytest.approx([after_cut + limits.copy_pace_step * k for k in (1, 2, 3)])


def test_cuts_multiplicatively_when_live_traffic_drops() -> None:
    state = pacing.start(0.0, 0.4, baseline_per_s=300.0, live_total=0)
    # 200/s is a drop of a third (> 0.2): halve per window, down to the floor and no lower.
    state, shares = _run_windows(state, [200.0] * 12)
    assert shares[:2] == pytest.approx([0.4 * limits.copy_pace_cut, 0.4 * limits.copy_pace_cut**2])
    assert min(shares) == limits.copy_pace_share_min
    # Traffic recovers: growth resumes from the floor, a step at a time (it was cut).
    state, shares = _run_windows(state, [300.0])
    assert shares == pytest.approx([limits.copy_pace_share_min + limits.copy_pace_step])


def test_drop_bound_is_the_limit() -> None:
    baseline = 1000.0
    edge = (1 - limits.catchup_produce_drop_max) * baseline
    state = pacing.start(0.0, 0.1, baseline_per_s=baseline, live_total=0)
    _, grown = _run_windows(state, [edge + 1])
    _, cut = _run_windows(state, [edge - 2])
    assert grown == pytest.approx([0.2])
    assert cut == pytest.approx([0.1 * limits.copy_pace_cut])


def test_window_is_judged_only_once_whole() -> None:
    state = pacing.start(0.0, 0.1, baseline_per_s=300.0, live_total=0)
    half = WINDOW_S / 2
    state, actions = pacing.step(state, Piece(half, 0.01, 10, live_s_ago=0.0))
    assert state.share == 0.1
    assert not [a for a in actions if isinstance(a, ShareChanged)]
    state, actions = pacing.step(state, Piece(WINDOW_S, 0.01, 20, live_s_ago=0.0))
    [changed] = [a for a in actions if isinstance(a, ShareChanged)]
    assert changed.rate_per_s == pytest.approx(20 / WINDOW_S)
    assert state.share < 0.1


def test_traffic_starting_during_the_copy_becomes_the_baseline() -> None:
    state = pacing.start(0.0, 0.05, baseline_per_s=0.0, live_total=0)
    state, shares = _run_windows(state, [400.0])
    assert state.baseline_per_s == pytest.approx(400.0)
    assert shares == [0.05]
    state, shares = _run_windows(state, [390.0, 100.0])
    assert shares == pytest.approx([0.1, 0.1 * limits.copy_pace_cut])


def test_start_share_is_clamped_to_the_bounds() -> None:
    assert pacing.start(0.0, 0.0, 1.0, 0).share == limits.copy_pace_share_min
    assert pacing.start(0.0, 1.0, 1.0, 0).share == limits.copy_pace_share_max


def test_live_rate_baseline_is_the_median_of_whole_windows() -> None:
    rate = pacing.LiveRate()
    n = limits.copy_pace_baseline_windows
    # One entry batch every 10 ms: 100/s, except one burst window of 5000 entries (noise the
    # median ignores) and the window under way (not whole, not counted).
    for window in range(n):
        for k in range(100):
            rate.note(window * WINDOW_S + k * WINDOW_S / 100, 1)
        if window == 3:
            rate.note(window * WINDOW_S + 0.999 * WINDOW_S, 5000)
    rate.note(n * WINDOW_S + 0.1, 10_000)
    assert rate.baseline_per_s(n * WINDOW_S + 0.2) == pytest.approx(100 / WINDOW_S)
    assert rate.total == 100 * n + 5000 + 10_000
    # Long silent: the whole windows before now hold nothing.
    assert rate.baseline_per_s(10 * n * WINDOW_S) == 0.0


def test_live_rate_with_half_the_windows_silent() -> None:
    rate = pacing.LiveRate()
    n = limits.copy_pace_baseline_windows
    for window in range(n - n // 2 + 2, n + 1):
        rate.note(window * WINDOW_S, 50)
    # Fewer than half the windows held anything: the median is 0 (traffic too new to judge by).
    assert rate.baseline_per_s((n + 1) * WINDOW_S) == 0.0
    # One more window with traffic, and half or more hold 50.
    rate.note((n + 1) * WINDOW_S, 50)
    assert rate.baseline_per_s((n + 2) * WINDOW_S) >= 25 / WINDOW_S


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now_s(self) -> float:
        return self.t

    def monotonic_s(self) -> float:
        return self.t


def test_driver_pauses_only_while_live() -> None:
    clock = _Clock()
    rate = pacing.LiveRate()
    pacer = CopyPacer("test", clock, rate, 0.25)
    assert pacer.decide(0.1) == 0.0  # nothing live ever
    rate.note(clock.t, 5)
    assert pacer.decide(0.1) == pytest.approx(0.1 * 0.75 / 0.25)
    paused_before = pacer.paused_s
    clock.t += 10
    asyncio.run(pacer.after_piece(0.1))  # live 10 s ago: no pause taken
    assert pacer.paused_s == paused_before


# --- the member's own measurements: commit latency and CPU share ---------------------------------


def _window(
    state: pacing.PacerState,
    *,
    rate: float = 300.0,
    commit_ms: float = 1.0,
    commits: int = 100,
    cpu_share: float = 0.3,
    copy_bytes: int = 0,
) -> tuple[pacing.PacerState, list[pacing.PacerAction]]:
    """One whole window of live traffic at ``rate``, ``commits`` store commits of ``commit_ms``
    each, the process at ``cpu_share`` of a core and ``copy_bytes`` copied; one piece at its
    end."""
    before = state.window_start
    now = state.window_start_s + WINDOW_S
    total = state.window_start_total + int(rate * WINDOW_S)
    marks = Marks(
        total,
        before.commit_s + commits * commit_ms / 1000,
        before.commits + commits,
        before.cpu_s + cpu_share * WINDOW_S,
        before.copied_bytes + copy_bytes,
    )
    return pacing.step(state, Piece(now, 0.01, total, 0.0, copy_bytes, marks))


def test_commits_slowing_past_their_bound_cut_the_share() -> None:
    state = pacing.start(0.0, 0.2, baseline_per_s=300.0, live_total=0, baseline_commit_ms=4.0)
    # Twice the baseline and 5 ms more (the slack) is the bound: 8.5 ms is within it, 9.5 is not.
    grown, _ = _window(state, commit_ms=8.5)
    assert grown.share == pytest.approx(0.4)
    cut, actions = _window(state, commit_ms=9.5)
    assert cut.share == pytest.approx(0.2 * limits.copy_pace_cut)
    [changed] = [a for a in actions if isinstance(a, ShareChanged)]
    assert changed.limited_by == "commit latency"
    assert changed.commit_ms == pytest.approx(9.5)


def test_sub_millisecond_commits_are_not_cut_over_noise() -> None:
    # 0.2 ms doubling to 0.6 ms is 3x its baseline but under the slack: no cut.
    state = pacing.start(0.0, 0.2, baseline_per_s=300.0, live_total=0, baseline_commit_ms=0.2)
    state, _ = _window(state, commit_ms=0.6)
    assert state.share == pytest.approx(0.4)


def test_process_cpu_at_its_bound_holds_the_share() -> None:
    state = pacing.start(0.0, 0.4, baseline_per_s=300.0, live_total=0)
    below, _ = _window(state, cpu_share=limits.copy_pace_cpu_share_max - 0.05)
    at, actions = _window(state, cpu_share=limits.copy_pace_cpu_share_max)
    assert below.share == pytest.approx(0.8)
    # No room to grow, but live work did not slow: neither grown nor cut.
    assert at.share == pytest.approx(0.4)
    assert not at.cut
    assert [a.limited_by for a in actions if isinstance(a, ShareChanged)] == ["cpu"]
    assert at.cpu_share == pytest.approx(limits.copy_pace_cpu_share_max)


def test_live_rate_drop_is_named_first() -> None:
    state = pacing.start(0.0, 0.4, baseline_per_s=300.0, live_total=0, baseline_commit_ms=1.0)
    _, actions = _window(state, rate=100.0, commit_ms=50.0, cpu_share=1.0)
    assert [a.limited_by for a in actions if isinstance(a, ShareChanged)] == ["live rate"]


def test_commit_baseline_is_taken_from_the_first_window_when_none_was_known() -> None:
    state = pacing.start(0.0, 0.1, baseline_per_s=300.0, live_total=0)
    state, _ = _window(state, commit_ms=3.0)
    assert state.baseline_commit_ms == pytest.approx(3.0)
    state, _ = _window(state, commit_ms=12.0)  # > 2 x 3 and > 3 + 5
    assert state.cut


def test_idle_windows_leave_share_and_baselines_alone() -> None:
    state = pacing.start(0.0, 0.1, baseline_per_s=300.0, live_total=0, baseline_commit_ms=2.0)
    state, actions = _window(state, rate=0.0, commit_ms=80.0, cpu_share=1.0)
    assert state.share == 0.1
    assert state.baseline_commit_ms == 2.0
    assert not [a for a in actions if isinstance(a, ShareChanged)]


# --- the ceiling ---------------------------------------------------------------------------------


def test_ceiling_pauses_a_copy_even_with_no_live_traffic() -> None:
    state = pacing.start(0.0, 1.0, baseline_per_s=0.0, live_total=0, ceiling_mb_per_s=100.0)
    # 4 MB in 10 ms is 400 MB/s: the piece must last 40 ms at 100 MB/s.
    _, actions = pacing.step(state, Piece(0.01, 0.01, 0, 60.0, 4_000_000))
    assert _pauses(actions) == pytest.approx([0.03])
    # A piece slower than the ceiling already: no pause.
    _, actions = pacing.step(state, Piece(0.01, 0.05, 0, 60.0, 4_000_000))
    assert _pauses(actions) == []


def test_ceiling_and_share_take_the_longer_pause() -> None:
    state = pacing.start(0.0, 0.05, baseline_per_s=300.0, live_total=0, ceiling_mb_per_s=100.0)
    # Share 0.05 after 10 ms of work: 190 ms; the ceiling's 30 ms is shorter.
    _, actions = pacing.step(state, Piece(0.01, 0.01, 3, 0.0, 4_000_000))
    assert _pauses(actions) == pytest.approx([0.19])
    # At 1 GB a piece the ceiling's 10 s wins.
    _, actions = pacing.step(state, Piece(0.01, 0.01, 3, 0.0, 1_000_000_000))
    assert _pauses(actions) == pytest.approx([10.0 - 0.01])


def test_negative_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="ceiling"):
        pacing.start(0.0, 0.1, 0.0, 0, ceiling_mb_per_s=-1.0)


def test_window_reports_the_copy_rate() -> None:
    state = pacing.start(0.0, 0.1, baseline_per_s=300.0, live_total=0)
    state, actions = _window(state, copy_bytes=50_000_000)
    [changed] = [a for a in actions if isinstance(a, ShareChanged)]
    assert changed.copy_mb_per_s == pytest.approx(50 / WINDOW_S)
    assert state.copy_mb_per_s == pytest.approx(50 / WINDOW_S)


def test_commit_baseline_is_the_median_of_window_means() -> None:
    rate = pacing.LiveRate()
    n = limits.copy_pace_baseline_windows
    for window in range(n):
        took_s = 0.5 if window == 2 else 0.002  # one stalled window: noise the median ignores
        rate.note_commit(window * WINDOW_S + 0.1, took_s)
        rate.note_commit(window * WINDOW_S + 0.2, took_s)
    assert rate.baseline_commit_ms(n * WINDOW_S + 0.1) == pytest.approx(2.0)
    assert rate.commits_total == 2 * n
    assert pacing.LiveRate().baseline_commit_ms(5.0) == 0.0


def test_driver_reports_the_copy_and_ends_it() -> None:
    clock = _Clock()
    rate = pacing.LiveRate()
    cpu = [0.0]
    reports: dict[str, pacing.CopyReport] = {}
    pacer = CopyPacer(
        "shard 3: snapshot",
        clock,
        rate,
        0.05,
        ceiling_mb_per_s=200.0,
        reports=reports,
        cpu_s=lambda: cpu[0],
    )
    assert reports["shard 3: snapshot"] is pacer.report
    for _ in range(10):
        clock.t += WINDOW_S / 4
        cpu[0] += 0.1
        rate.note(clock.t, 50)
        rate.note_commit(clock.t, 0.003)
        pacer.decide(0.01, 8_000_000)
    report = pacer.finish()
    assert report.ended
    assert report.kind == "snapshot"
    assert report.copied_bytes == 80_000_000
    assert report.mean_mb_per_s == pytest.approx(80 / (10 * WINDOW_S / 4))
    assert report.cpu_share == pytest.approx(0.4)
    assert report.commit_ms == pytest.approx(3.0)
    assert report.paused_s > 0
    assert report.to_json()["ceiling_mb_per_s"] == 200.0


def test_a_copy_whose_commits_are_its_own_ignores_their_time() -> None:
    # A learner's catch-up commits: slow commits are its own big pieces, not live work slowing.
    state = pacing.start(
        0.0, 0.2, baseline_per_s=300.0, live_total=0, baseline_commit_ms=4.0, judge_commits=False
    )
    assert state.baseline_commit_ms == 0.0
    state, _ = _window(state, commit_ms=3.0)
    state, actions = _window(state, commit_ms=400.0)
    assert state.share == pytest.approx(0.8)
    assert not state.cut
    assert [a.limited_by for a in actions if isinstance(a, ShareChanged)] == [""]
