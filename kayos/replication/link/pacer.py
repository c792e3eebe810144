"""The copy pacer's asyncio driver: ``CopyPacer`` steps the pure rule of
``kayos.replication.logic.pacing`` after each piece of a copy's work and sleeps the pause it asks
for (docs/performance.md, "Pacing a copy"). A learner or repair link's sender, a copy's catch-up
commits and a store snapshot being served each run one.
"""

from __future__ import annotations

import asyncio
import logging

from kayos.clock import Clock
from kayos.replication.logic.pacing import LiveRate, Pause, Piece, start, step

log = logging.getLogger("kayos.replication")


class CopyPacer:
    """Paces one copy: ``await after_piece(busy_s)`` after each piece of its work."""

    def __init__(self, what: str, clock: Clock, rate: LiveRate, start_share: float) -> None:
        self.what = what
        self.clock = clock
        self.rate = rate
        now = clock.monotonic_s()
        self.state = start(now, start_share, rate.baseline_per_s(now), rate.total)
        self.paused_s = 0.0
        log.info(
            "%s: pacing from share %.3f, live baseline %.1f entries/s",
            what,
            self.state.share,
            self.state.baseline_per_s,
        )

    def decide(self, busy_s: float) -> float:
        """Steps the pacer; returns the pause due now in seconds."""
        now = self.clock.monotonic_s()
        event = Piece(now, busy_s, self.rate.total, now - self.rate.at_s)
        self.state, actions = step(self.state, event)
        pause_s = 0.0
        for action in actions:
            if isinstance(action, Pause):
                pause_s = action.seconds
            else:
                log.debug(
                    "%s: live %.1f/s against %.1f/s: share %.3f",
                    self.what,
                    action.rate_per_s,
                    action.baseline_per_s,
                    action.share,
                )
        return pause_s

    async def after_piece(self, busy_s: float) -> None:
        pause_s = self.decide(busy_s)
        if pause_s > 0:
            self.paused_s += pause_s
            await asyncio.sleep(pause_s)
