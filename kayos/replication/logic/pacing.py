"""The copy pacer (docs/performance.md, "Pacing a copy"): how much of a member's time a copy (a
store snapshot, a learner or repair link, a learner's own catch-up commits) may take while its shard
takes live writes.

What it watches, all measured by the member about itself (``LiveRate`` counts them; nothing is
asked of other nodes):

- the live entries committed through this member (fed where a replica accepts a live batch, or
  where a learner hears its upstream's commit point move). On a chain every acknowledged write
  passes through every member, so this count is the producers' acks as this member sees them, at
  one addition per batch. Baseline: the median of the last ``copy_pace_baseline_windows``
  one-window rates before the copy.
- its store's commit latency (every group commit, fsync included, timed where it lands): the
  disk's answer to the copy's reads and writes. Baseline: the median of the same windows' mean
  commit times. Not judged where the commits are the copy's own (a learner's catch-up commits).
- its own process's CPU share over the window (``time.process_time``, which the caller passes
  in): at ``copy_pace_cpu_share_max`` the event loop that serves live traffic has no time left.

The rule (AIMD, per ``copy_pace_window_ms``, judged while live traffic flows): live work slowed
when the live rate fell by more than ``catchup_produce_drop_max`` below its baseline, or the mean
commit took more than ``copy_pace_commit_rise_max`` times its baseline (and at least
``copy_pace_commit_slack_ms`` more): the share is multiplied by ``copy_pace_cut``, down to
``copy_pace_share_min``. Else, if the process's CPU share reached ``copy_pace_cpu_share_max``,
there is no room: the share holds. Else it grows, doubling until the first cut (a slow start: a
short copy is not over before it speeds up) and by ``copy_pace_step`` after it, up to
``copy_pace_share_max``. With no live batch within ``catchup_live_window_ms`` the share does not
hold the copy back at all.

The ceiling: whatever the share, live traffic or not, a copy with a ceiling (its node's
``copy_rate_mb_per_s_max``; 0 is none) pauses after each piece until the piece has taken at least
its bytes at that rate.

``step(state, event) -> (state, actions)`` is pure (the caller passes the time);
``kayos.replication.link.pacer.CopyPacer`` is the thin asyncio driver the copy loops call after
each piece.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TypeAlias

from kayos import limits
from kayos.replication.logic import chain

# --- what the member counts ---------------------------------------------------------------------


@dataclass(slots=True)
class LiveRate:
    """What a member measures about itself for the pacer: live entries committed through it and
    its store's commit times, as running totals and per whole window (``copy_pace_window_ms``)
    for the last ``copy_pace_baseline_windows`` windows."""

    total: int = 0
    at_s: float = -1e18  # when a live entry was last counted (monotonic s)
    commit_s_total: float = 0.0  # seconds spent in store commits (fsync included)
    commits_total: int = 0
    _window: int = 0  # index of the window being counted
    _count: int = 0
    _commit_s: float = 0.0
    _commits: int = 0
    # (window, live entries, commit seconds, commits) of the last whole windows
    _done: deque[tuple[int, int, float, int]] = field(default_factory=deque)

    def _roll(self, now_s: float) -> None:
        index = int(now_s * 1000 // limits.copy_pace_window_ms)
        if index != self._window:
            if self._count or self._commits:
                self._done.append((self._window, self._count, self._commit_s, self._commits))
                if len(self._done) > limits.copy_pace_baseline_windows:
                    self._done.popleft()
            self._window, self._count, self._commit_s, self._commits = index, 0, 0.0, 0

    def note(self, now_s: float, entries: int) -> None:
        self._roll(now_s)
        self.total += entries
        self.at_s = now_s
        self._count += entries

    def note_commit(self, now_s: float, seconds: float) -> None:
        """A store commit (live or a copy's own) took ``seconds``."""
        self._roll(now_s)
        self.commit_s_total += seconds
        self.commits_total += 1
        self._commit_s += seconds
        self._commits += 1

    def _windows(self, now_s: float) -> tuple[list[int], dict[int, tuple[int, float, int]]]:
        current = int(now_s * 1000 // limits.copy_pace_window_ms)
        found = {w: (count, commit_s, commits) for w, count, commit_s, commits in self._done}
        if self._window < current and (self._count or self._commits):
            found[self._window] = (self._count, self._commit_s, self._commits)
        return list(range(current - limits.copy_pace_baseline_windows, current)), found

    def baseline_per_s(self, now_s: float) -> float:
        """The median live rate (entries/s) of the last ``copy_pace_baseline_windows`` whole
        windows before ``now_s`` (a window with nothing counted counts as 0)."""
        indexes, found = self._windows(now_s)
        rates = [found.get(i, (0, 0.0, 0))[0] for i in indexes]
        return statistics.median(rates) * 1000 / limits.copy_pace_window_ms

    def baseline_commit_ms(self, now_s: float) -> float:
        """The median of the mean commit time (ms) of those of the same windows that held a
        commit; 0 when none did."""
        indexes, found = self._windows(now_s)
        means = [found[i][1] / found[i][2] * 1000 for i in indexes if i in found and found[i][2]]
        return statistics.median(means) if means else 0.0


# --- the pure pacer -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Marks:
    """The member's running totals at one instant: live entries, commit seconds and commits,
    its process's CPU seconds, and the copy's bytes."""

    live_total: int = 0
    commit_s: float = 0.0
    commits: int = 0
    cpu_s: float = 0.0
    copied_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PacerState:
    """``share``: of the member's time the copy may take while live traffic flows;
    ``baseline_per_s``: live entries/s before the copy (0: none seen, the first window with
    traffic becomes it); ``baseline_commit_ms``: the mean store commit before it (0: likewise);
    the window being measured starts at ``window_start_s`` with the totals ``window_start``;
    ``cut``: the share was cut at least once (growth is then additive, before it doubling);
    ``ceiling_mb_per_s``: the copy's byte-rate ceiling (0: none); ``copy_mb_per_s`` and
    ``cpu_share``: the last whole window's copy rate and process CPU share (for reports);
    ``judge_commits``: whether the member's commit time is a signal (not where the commits are
    the copy's own: a learner's catch-up commits)."""

    share: float
    baseline_per_s: float
    window_start_s: float
    window_start_total: int
    cut: bool = False
    baseline_commit_ms: float = 0.0
    window_start: Marks = Marks()
    ceiling_mb_per_s: float = 0.0
    copy_mb_per_s: float = 0.0
    cpu_share: float = 0.0
    judge_commits: bool = True


@dataclass(frozen=True, slots=True)
class Piece:
    """The copy did ``busy_s`` of work (read, send, or commit one piece of ``piece_bytes``) and it
    is ``now_s``; the member's live total is ``live_total`` and its last live entry came
    ``live_s_ago``; ``marks`` are its running totals now (``live_total`` is read from the
    argument, not from them)."""

    now_s: float
    busy_s: float
    live_total: int
    live_s_ago: float
    piece_bytes: int = 0
    marks: Marks = Marks()


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class ShareChanged:
    """For the log, once per whole window: the window's live rate against the baseline, its mean
    commit time (ms; 0 without a commit) against the baseline, the process's CPU share, the copy's
    rate, the share it led to and what limited it (``limited_by``: "live rate" or "commit
    latency": cut; "cpu": held; "": grown)."""

    share: float
    rate_per_s: float
    baseline_per_s: float
    commit_ms: float = 0.0
    baseline_commit_ms: float = 0.0
    cpu_share: float = 0.0
    copy_mb_per_s: float = 0.0
    limited_by: str = ""


PacerAction: TypeAlias = Pause | ShareChanged


def start(
    now_s: float,
    share: float,
    baseline_per_s: float,
    live_total: int,
    *,
    baseline_commit_ms: float = 0.0,
    marks: Marks = Marks(),
    ceiling_mb_per_s: float = 0.0,
    judge_commits: bool = True,
) -> PacerState:
    if ceiling_mb_per_s < 0:
        raise ValueError(f"a copy's rate ceiling is >= 0 MB/s (0: none), not {ceiling_mb_per_s}")
    share = min(max(share, limits.copy_pace_share_min), limits.copy_pace_share_max)
    return PacerState(
        share,
        baseline_per_s,
        now_s,
        live_total,
        baseline_commit_ms=baseline_commit_ms if judge_commits else 0.0,
        window_start=marks,
        ceiling_mb_per_s=ceiling_mb_per_s,
        judge_commits=judge_commits,
    )


def limited_by(
    rate: float, baseline: float, commit_ms: float, baseline_commit_ms: float, cpu_share: float
) -> str:
    """What keeps a window with live traffic from growing the share ("" when nothing does): live
    work slowed (live entries below the drop bound: "live rate", commits slower than their bound:
    "commit latency"; the share is cut), or no room ("cpu": the process at its bound; the share
    holds)."""
    if rate < (1 - limits.catchup_produce_drop_max) * baseline:
        return "live rate"
    if baseline_commit_ms > 0 and commit_ms > max(
        limits.copy_pace_commit_rise_max * baseline_commit_ms,
        baseline_commit_ms + limits.copy_pace_commit_slack_ms,
    ):
        return "commit latency"
    if cpu_share >= limits.copy_pace_cpu_share_max:
        return "cpu"
    return ""


def _judge(state: PacerState, event: Piece, elapsed_s: float) -> tuple[PacerState, ShareChanged]:
    """A whole window: the share after it (AIMD, see the module's docstring)."""
    before, now = state.window_start, event.marks
    rate = (event.live_total - state.window_start_total) / elapsed_s
    commits = now.commits - before.commits
    commit_ms = (now.commit_s - before.commit_s) / commits * 1000 if commits > 0 else 0.0
    cpu_share = max(0.0, now.cpu_s - before.cpu_s) / elapsed_s
    copy_mb_per_s = max(0, now.copied_bytes - before.copied_bytes) / elapsed_s / 1e6
    share, baseline, cut = state.share, state.baseline_per_s, state.cut
    baseline_commit_ms = state.baseline_commit_ms
    first_commit_ms = commit_ms if state.judge_commits else 0.0
    limit = ""
    if rate > 0:
        if baseline <= 0:
            baseline = rate  # traffic began during the copy: judged against its first window
            baseline_commit_ms = baseline_commit_ms or first_commit_ms
        else:
            baseline_commit_ms = baseline_commit_ms or first_commit_ms
            limit = limited_by(rate, baseline, commit_ms, state.baseline_commit_ms, cpu_share)
            if limit in ("live rate", "commit latency"):
                share = max(limits.copy_pace_share_min, share * limits.copy_pace_cut)
                cut = True
            elif not limit:
                grown = share + limits.copy_pace_step if cut else share * 2
                share = min(limits.copy_pace_share_max, grown)
    judged = PacerState(
        share,
        baseline,
        event.now_s,
        event.live_total,
        cut,
        baseline_commit_ms,
        now,
        state.ceiling_mb_per_s,
        copy_mb_per_s,
        cpu_share,
        state.judge_commits,
    )
    changed = ShareChanged(
        share, rate, baseline, commit_ms, baseline_commit_ms, cpu_share, copy_mb_per_s, limit
    )
    return judged, changed


def ceiling_pause_s(piece_bytes: int, busy_s: float, ceiling_mb_per_s: float) -> float:
    """The pause that makes a piece of ``piece_bytes`` that took ``busy_s`` last at least its
    bytes at ``ceiling_mb_per_s`` (none without a ceiling)."""
    if ceiling_mb_per_s <= 0 or piece_bytes <= 0:
        return 0.0
    return max(0.0, piece_bytes / (ceiling_mb_per_s * 1e6) - busy_s)


def step(state: PacerState, event: Piece) -> tuple[PacerState, list[PacerAction]]:
    """After a piece of copy work: judges the window if it is whole (AIMD on the share, see the
    module's docstring), then the pause that holds the piece to the share (none while no live
    batch came within ``catchup_live_window_ms``) and to the ceiling (always)."""
    actions: list[PacerAction] = []
    elapsed_s = event.now_s - state.window_start_s
    if elapsed_s * 1000 >= limits.copy_pace_window_ms:
        state, changed = _judge(state, event, elapsed_s)
        if changed.rate_per_s > 0:
            actions.append(changed)
    pause_s = max(
        chain.copy_pause_s(
            event.busy_s,
            live_s_ago=event.live_s_ago,
            live_window_s=limits.catchup_live_window_ms / 1000,
            share=state.share,
        ),
        ceiling_pause_s(event.piece_bytes, event.busy_s, state.ceiling_mb_per_s),
    )
    if pause_s > 0:
        actions.append(Pause(pause_s))
    return state, actions


# --- what a copy reports ------------------------------------------------------------------------


@dataclass(slots=True)
class CopyReport:
    """One copy as its node's status and metrics show it (docs/node-api.md, "Status"): the share
    and the rates the pacer chose, updated after each piece by its driver."""

    what: str
    started_s: float
    ceiling_mb_per_s: float
    share: float
    copied_bytes: int = 0
    seconds: float = 0.0
    paused_s: float = 0.0
    copy_mb_per_s: float = 0.0  # over the last whole window
    cpu_share: float = 0.0  # the process's, over the last whole window
    commit_ms: float = 0.0  # the mean store commit over the last whole window with traffic
    limited_by: str = ""  # what kept the last judged window from growing the share ("": nothing)
    ended: bool = False

    @property
    def kind(self) -> str:
        """The copy's kind, its name past the shard ("snapshot", "copy link", ...)."""
        return self.what.rpartition(": ")[2]

    @property
    def mean_mb_per_s(self) -> float:
        return self.copied_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "share": round(self.share, 3),
            "copy_mb_per_s": round(self.copy_mb_per_s, 1),
            "mean_mb_per_s": round(self.mean_mb_per_s, 1),
            "ceiling_mb_per_s": self.ceiling_mb_per_s,
            "cpu_share": round(self.cpu_share, 3),
            "commit_ms": round(self.commit_ms, 2),
            "limited_by": self.limited_by,
            "copied_bytes": self.copied_bytes,
            "seconds": round(self.seconds, 2),
            "paused_s": round(self.paused_s, 2),
            "ended": self.ended,
        }
