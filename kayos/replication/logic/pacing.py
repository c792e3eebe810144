"""The copy pacer (docs/performance.md, "Pacing a copy"): how much of a member's time a copy (a
store snapshot, a learner or repair link, a learner's own catch-up commits) may take while its shard
takes live writes.

What it watches: the live entries committed through this member (``LiveRate``, fed where a replica
accepts a live batch, or where a learner hears its upstream's commit point move). On a chain every
acknowledged write passes through every member, so this count is the producers' acks as this
member sees them, it costs one addition per batch, and it needs nothing from other nodes. Its
baseline is the median of the last ``copy_pace_baseline_windows`` one-window rates before the copy.

The rule (AIMD, per ``copy_pace_window_ms``): while the live rate stays within
``catchup_produce_drop_max`` of the baseline, the copy's share grows, doubling until the first
cut (a slow start: a short copy is not over before it speeds up) and by ``copy_pace_step`` after
it, up to ``copy_pace_share_max``; when it does not, the share is multiplied by ``copy_pace_cut``
down to ``copy_pace_share_min``. With no live batch within ``catchup_live_window_ms`` the copy is
not paused at all.

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
    """Live entries committed through a member: a running total and the counts of the last
    ``copy_pace_baseline_windows`` whole windows (``copy_pace_window_ms`` each)."""

    total: int = 0
    at_s: float = -1e18  # when a live entry was last counted (monotonic s)
    _window: int = 0  # index of the window being counted
    _count: int = 0
    _done: deque[tuple[int, int]] = field(default_factory=deque)

    def note(self, now_s: float, entries: int) -> None:
        self.total += entries
        self.at_s = now_s
        index = int(now_s * 1000 // limits.copy_pace_window_ms)
        if index != self._window:
            if self._count:
                self._done.append((self._window, self._count))
                if len(self._done) > limits.copy_pace_baseline_windows:
                    self._done.popleft()
            self._window, self._count = index, 0
        self._count += entries

    def baseline_per_s(self, now_s: float) -> float:
        """The median live rate (entries/s) of the last ``copy_pace_baseline_windows`` whole
        windows before ``now_s`` (a window with nothing counted counts as 0)."""
        current = int(now_s * 1000 // limits.copy_pace_window_ms)
        counts = dict(self._done)
        if self._window < current and self._count:
            counts[self._window] = self._count
        first = current - limits.copy_pace_baseline_windows
        rates = [counts.get(i, 0) for i in range(first, current)]
        return statistics.median(rates) * 1000 / limits.copy_pace_window_ms


# --- the pure pacer -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PacerState:
    """``share``: of the member's time the copy may take while live traffic flows;
    ``baseline_per_s``: live entries/s before the copy (0: none seen, the first window with
    traffic becomes it); the window being measured starts at ``window_start_s`` with the live
    total at ``window_start_total``; ``cut``: the share was cut at least once (growth is then
    additive, before it doubling)."""

    share: float
    baseline_per_s: float
    window_start_s: float
    window_start_total: int
    cut: bool = False


@dataclass(frozen=True, slots=True)
class Piece:
    """The copy did ``busy_s`` of work (read, send, or commit one piece) and it is ``now_s``; the
    member's live total is ``live_total`` and its last live entry came ``live_s_ago``."""

    now_s: float
    busy_s: float
    live_total: int
    live_s_ago: float


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class ShareChanged:
    """For the log: the window's live rate against the baseline, and the share it led to."""

    share: float
    rate_per_s: float
    baseline_per_s: float


PacerAction: TypeAlias = Pause | ShareChanged


def start(now_s: float, share: float, baseline_per_s: float, live_total: int) -> PacerState:
    share = min(max(share, limits.copy_pace_share_min), limits.copy_pace_share_max)
    return PacerState(share, baseline_per_s, now_s, live_total)


def step(state: PacerState, event: Piece) -> tuple[PacerState, list[PacerAction]]:
    """After a piece of copy work: judges the window if it is whole (AIMD on the share, see the
    module's docstring), then the pause that holds the piece to the share (none while no live
    batch came within ``catchup_live_window_ms``)."""
    actions: list[PacerAction] = []
    elapsed_s = event.now_s - state.window_start_s
    if elapsed_s * 1000 >= limits.copy_pace_window_ms:
        rate = (event.live_total - state.window_start_total) / elapsed_s
        share, baseline, cut = state.share, state.baseline_per_s, state.cut
        if rate > 0:
            if baseline <= 0:
                baseline = rate  # traffic began during the copy: judged against its first window
            elif rate >= (1 - limits.catchup_produce_drop_max) * baseline:
                grown = share + limits.copy_pace_step if cut else share * 2
                share = min(limits.copy_pace_share_max, grown)
            else:
                share = max(limits.copy_pace_share_min, share * limits.copy_pace_cut)
                cut = True
        state = PacerState(share, baseline, event.now_s, event.live_total, cut)
        if rate > 0:
            actions.append(ShareChanged(share, rate, baseline))
    pause_s = chain.copy_pause_s(
        event.busy_s,
        live_s_ago=event.live_s_ago,
        live_window_s=limits.catchup_live_window_ms / 1000,
        share=state.share,
    )
    if pause_s > 0:
        actions.append(Pause(pause_s))
    return state, actions
