"""The count and the log of refused requests (docs/security.md, "Refusals"), shared by a node's
door and a manager member's: every refusal is counted per reason in
``kayos_auth_refusals_total{reason}``, and at most ``auth_refusal_log_lines_per_minute_max`` a
minute are logged, naming what was asked, the peer, the status and the reason: never a header,
a proof or a secret. The clock and the logger are the caller's.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter

from kayos import limits
from kayos.auth.proof import REASONS
from kayos.clock import Clock


class Refusals:
    """One door's refusal counter (registered in ``registry``) and its bounded log lines."""

    def __init__(self, registry: CollectorRegistry, clock: Clock, log: logging.Logger) -> None:
        self.clock = clock
        self.log = log
        self.counter = Counter(
            "kayos_auth_refusals",  # exposed as kayos_auth_refusals_total
            "Requests refused for their credential, by reason (docs/security.md)",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.counter.labels(reason=reason)  # every reason shows, at 0 until it happens
        self.minute = -1
        self.logged = 0

    def refused(self, what: str, peer: object, status: int, reason: str) -> None:
        """Counts a refusal; logs it unless this minute's lines are spent."""
        self.counter.labels(reason=reason).inc()
        minute = int(self.clock.monotonic_s() // 60)
        if minute != self.minute:
            self.minute, self.logged = minute, 0
        self.logged += 1
        if self.logged <= limits.auth_refusal_log_lines_per_minute_max:
            self.log.warning("refused %s from %s: %d %s", what, peer, status, reason)
        elif self.logged == limits.auth_refusal_log_lines_per_minute_max + 1:
            self.log.warning(
                "more refusals this minute are counted only (kayos_auth_refusals_total)"
            )
