"""Pure decisions of the client: which Kayos error a reply means, and what to do about it
(follow a redirect, back off and retry, or give up), with the backoff delays.

No I/O, no clock, no global randomness: the driver (``kayos.client.routing``) sleeps and sends;
tests drive these functions with a seeded ``random.Random``.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any, Final

from kayos import errors, limits
from kayos.errors import KayosError, RetentionGapError, WrongRoleError, error_from_code
from kayos.replication.wire.frames import ErrorFrame
from kayos.topology import Topology


def error_from_frame(frame: ErrorFrame) -> KayosError:
    return error_from_code(frame.code, frame.message, redirect=frame.redirect, epoch=frame.epoch)


# HTTP statuses for replies without a Kayos error body (a proxy, or aiohttp's own 404/405).
_CODE_BY_STATUS: Final = {
    400: "invalid_request",
    404: "invalid_request",
    405: "invalid_request",
    410: "retention_gap",
    413: "limit_exceeded",
    421: "wrong_role",
    500: "storage_error",
    502: "unavailable",
    503: "unavailable",
    504: "timeout",
    507: "disk_full",
}


def error_from_http(status: int, body: Any) -> KayosError:
    """The error an HTTP error reply means: its ``{"error": {...}}`` body when it has one, else
    the status alone."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        epoch = detail.get("epoch")
        # A 421 names the right node twice: ``redirect`` (its URL) and ``node`` (its id). The id
        # is what a binary ERROR frame gives too, so the driver resolves one kind of name.
        redirect = _str_or_none(detail.get("node")) or _str_or_none(detail.get("redirect"))
        error = error_from_code(
            detail["code"],
            str(detail.get("message", "")),
            redirect=redirect,
            epoch=epoch if isinstance(epoch, int) else 0,
        )
        floor = detail.get("floor")
        if isinstance(error, RetentionGapError) and isinstance(floor, int):
            error.floor = floor
        return error
    code = _CODE_BY_STATUS.get(status, "unavailable" if status >= 500 else "invalid_request")
    text = body if isinstance(body, str) else repr(body)
    return error_from_code(code, f"HTTP {status}: {text[:200]}")


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class Action(enum.Enum):
    """What the client does after a failed attempt."""

    REDIRECT = "redirect"  # refresh the topology, then try the node that has the role
    BACKOFF = "backoff"  # wait, then try again (possibly another node)
    FAIL = "fail"  # hand the error to the caller


def action_for(error: BaseException) -> Action:
    """``wrong_role`` redirects; ``unavailable`` and connection failures (reported as
    ``UnavailableError``) back off. Everything else is the caller's: input errors would fail
    again, and ``timeout``/storage errors leave an outcome only the caller can judge."""
    if isinstance(error, WrongRoleError):
        return Action.REDIRECT
    if isinstance(error, errors.UnavailableError):
        return Action.BACKOFF
    return Action.FAIL


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter (bounds: ``limits`` "client")."""

    attempts_max: int = limits.client_retry_attempts_max
    delay_ms_min: int = limits.client_retry_delay_ms_min
    delay_ms_max: int = limits.client_retry_delay_ms_max
    redirects_max: int = limits.client_redirects_max

    def __post_init__(self) -> None:
        if self.attempts_max < 1 or self.redirects_max < 0:
            raise errors.InvalidRequest("attempts_max must be >= 1 and redirects_max >= 0")
        if not 0 < self.delay_ms_min <= self.delay_ms_max:
            raise errors.InvalidRequest("retry delays need 0 < delay_ms_min <= delay_ms_max")

    def delay_s(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (1 for the first): the ceiling doubles from
        ``delay_ms_min`` up to ``delay_ms_max``; the wait is the ceiling's upper half, drawn
        uniformly ("equal jitter": never zero, never above the ceiling)."""
        assert retry >= 1, retry
        ceiling_ms = min(self.delay_ms_max, self.delay_ms_min << min(retry - 1, 30))
        delay_ms = ceiling_ms / 2 + rng.random() * ceiling_ms / 2
        assert 0 < delay_ms <= self.delay_ms_max
        return delay_ms / 1000


class RetryState:
    """One operation's retry budget. ``next_delay_s(error)`` says what comes next: None gives
    the error to the caller, 0.0 redirects at once, a positive number backs off that long."""

    __slots__ = ("_policy", "_rng", "attempts", "redirects")

    def __init__(self, policy: RetryPolicy, rng: random.Random) -> None:
        self._policy = policy
        self._rng = rng
        self.attempts = 1  # the first try is under way
        self.redirects = 0

    def next_delay_s(self, error: BaseException) -> float | None:
        action = action_for(error)
        if action is Action.FAIL:
            return None
        if action is Action.REDIRECT:
            if self.redirects >= self._policy.redirects_max:
                return None
            self.redirects += 1
            return 0.0
        if self.attempts >= self._policy.attempts_max:
            return None
        self.attempts += 1
        return self._policy.delay_s(self.attempts - 1, self._rng)


def newest_topology(
    urls: list[str], answers: list[Topology | BaseException], min_epoch: int
) -> tuple[Topology | None, list[str]]:
    """Of the nodes' answers to ``GET /v1/topology`` (a topology or the error asking gave), the
    one with the highest epoch, if it is at least ``min_epoch``; and why each other URL gave
    nothing usable. A chain change reaches the nodes one by one, so the newest view wins, and
    a node removed from the cluster (still answering with its old epoch) is outvoted."""
    best: Topology | None = None
    failures: list[str] = []
    for url, answer in zip(urls, answers, strict=True):
        if isinstance(answer, BaseException):
            failures.append(f"{url}: {answer}")
        elif answer.epoch < min_epoch:
            failures.append(f"{url}: epoch {answer.epoch} < {min_epoch}")
        elif best is None or answer.epoch > best.epoch:
            best = answer
    return best, failures
