"""The copy pacer's asyncio driver: ``CopyPacer`` steps the pure rule of
``kayos.replication.logic.pacing`` after each piece of a copy's work and sleeps the pause it asks
for (docs/performance.md, "Pacing a copy"). A learner or repair link's sender, a copy's catch-up
commits and a store snapshot being served each run one. It reads what the rule is fed: the
replica's live entries and commit times (``LiveRate``), the process's CPU seconds
(``time.process_time``) and the bytes of each piece; and keeps the copy's ``CopyReport`` (the
node's status and metrics read it) up to date.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kayos.clock import Clock
from kayos.replication.logic.pacing import (
    CopyReport,
    LiveRate,
    Marks,
    Pause,
    Piece,
    ShareChanged,
    start,
    step,
)

log = logging.getLogger("kayos.replication")


class CopyPacer:
    """Paces one copy: ``await after_piece(busy_s, piece_bytes)`` after each piece of its work,
    ``finish()`` once it is over. ``reports``: where the copy's report is kept under ``what``
    (the replica's ``copies``), replacing the previous copy of that name; ``judge_commits``:
    False where the replica's commits are the copy's own."""

    def __init__(
        self,
        what: str,
        clock: Clock,
        rate: LiveRate,
        start_share: float,
        *,
        ceiling_mb_per_s: float = 0.0,
        reports: dict[str, CopyReport] | None = None,
        cpu_s: Callable[[], float] = time.process_time,
        judge_commits: bool = True,
    ) -> None:
        self.what = what
        self.clock = clock
        self.rate = rate
        self.cpu_s = cpu_s
        self.copied_bytes = 0
        now = clock.monotonic_s()
        self.state = start(
            now,
            start_share,
            rate.baseline_per_s(now),
            rate.total,
            baseline_commit_ms=rate.baseline_commit_ms(now),
            marks=self._marks(),
            ceiling_mb_per_s=ceiling_mb_per_s,
            judge_commits=judge_commits,
        )
        self.report = CopyReport(what, now, ceiling_mb_per_s, self.state.share)
        if reports is not None:
            reports[what] = self.report
        log.info(
            "%s: pacing from share %.3f, live baseline %.1f entries/s, commit %.2f ms, ceiling %s",
            what,
            self.state.share,
            self.state.baseline_per_s,
            self.state.baseline_commit_ms,
            f"{ceiling_mb_per_s:g} MB/s" if ceiling_mb_per_s > 0 else "none",
        )

    @property
    def paused_s(self) -> float:
        return self.report.paused_s

    def _marks(self) -> Marks:
        rate = self.rate
        return Marks(
            rate.total, rate.commit_s_total, rate.commits_total, self.cpu_s(), self.copied_bytes
        )

    def decide(self, busy_s: float, piece_bytes: int = 0) -> float:
        """Steps the pacer after a piece of ``piece_bytes`` that took ``busy_s``; returns the
        pause due now in seconds (the caller sleeps it, or ``after_piece`` does)."""
        now = self.clock.monotonic_s()
        self.copied_bytes += piece_bytes
        event = Piece(
            now, busy_s, self.rate.total, now - self.rate.at_s, piece_bytes, self._marks()
        )
        self.state, actions = step(self.state, event)
        report = self.report
        report.copied_bytes, report.seconds = self.copied_bytes, now - report.started_s
        report.share = self.state.share
        report.copy_mb_per_s, report.cpu_share = self.state.copy_mb_per_s, self.state.cpu_share
        pause_s = 0.0
        for action in actions:
            if isinstance(action, Pause):
                pause_s = action.seconds
            elif isinstance(action, ShareChanged):
                report.commit_ms, report.limited_by = action.commit_ms, action.limited_by
                log.debug(
                    "%s: live %.1f/s against %.1f/s, commit %.2f ms against %.2f, cpu %.2f, "
                    "copy %.1f MB/s: share %.3f%s",
                    self.what,
                    action.rate_per_s,
                    action.baseline_per_s,
                    action.commit_ms,
                    action.baseline_commit_ms,
                    action.cpu_share,
                    action.copy_mb_per_s,
                    action.share,
                    f" (limited by {action.limited_by})" if action.limited_by else "",
                )
        report.paused_s += pause_s
        return pause_s

    async def after_piece(self, busy_s: float, piece_bytes: int = 0) -> None:
        pause_s = self.decide(busy_s, piece_bytes)
        if pause_s > 0:
            await asyncio.sleep(pause_s)

    def finish(self) -> CopyReport:
        """The copy is over: its report is marked ended and its figures logged."""
        report = self.report
        if not report.ended:
            report.ended = True
            report.seconds = self.clock.monotonic_s() - report.started_s
            log.info(
                "%s: copy paced: %d bytes in %.2f s, %.1f MB/s (last window %.1f MB/s), "
                "end share %.3f, paused %.1f s, cpu %.2f, ceiling %s",
                self.what,
                report.copied_bytes,
                report.seconds,
                report.mean_mb_per_s,
                report.copy_mb_per_s,
                report.share,
                report.paused_s,
                report.cpu_share,
                f"{report.ceiling_mb_per_s:g} MB/s" if report.ceiling_mb_per_s > 0 else "none",
            )
        return report
