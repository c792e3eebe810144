"""Pure decisions of the client: which Kayos error a reply means, and what to do about it
(follow a redirect, send again at once, wait for a newer topology, back off, or give up), with
the backoff delays; which requests in flight a newer topology abandons; when a connection is
silent; how a topology watch goes on after each answer (docs/node-api.md, "Clients").

No I/O, no clock, no global randomness: the drivers (``kayos.client.routing``,
``kayos.client.watch``) sleep and send; tests drive these functions with a seeded
``random.Random`` and times of their own.
"""

from __future__ import annotations

import enum
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

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
    RESEND = "resend"  # at once, to the role's holder: the node left the role
    AWAIT_TOPOLOGY = "await_topology"  # the node was lost: wait (bounded) for a newer topology
    BACKOFF = "backoff"  # wait, then try again (possibly another node)
    FAIL = "fail"  # hand the error to the caller


def action_for(error: BaseException) -> Action:
    """``wrong_role`` redirects. ``unavailable`` backs off when a node said it; a request the
    client abandoned (its node left the role) is sent again at once; one whose connection was
    lost waits for a newer topology. Everything else is the caller's: input errors would fail
    again, and ``timeout``/storage errors leave an outcome only the caller can judge."""
    if isinstance(error, WrongRoleError):
        return Action.REDIRECT
    if isinstance(error, errors.UnavailableError):
        if error.failure == "abandoned":
            return Action.RESEND
        if error.failure == "lost":
            return Action.AWAIT_TOPOLOGY
        return Action.BACKOFF
    return Action.FAIL


@dataclass(frozen=True, slots=True)
class Step:
    """The retry loop's next step: ``delay_s`` is the backoff (``BACKOFF``), the longest wait
    for a newer topology (``AWAIT_TOPOLOGY``), or 0 (``REDIRECT``, ``RESEND``)."""

    action: Action
    delay_s: float


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

    def next_step(self, error: BaseException, *, managed: bool, epoch: int = 0) -> Step | None:
        """The step after ``error``; None gives it to the caller. Redirects count against
        ``redirects_max``, every other retry against ``attempts_max``. ``managed``: the topology
        names manager members, so a lost node is spliced out within ``client_silence_ms`` and a
        lost request waits that long for the new topology; else only its backoff (no one may
        change the topology, and the node may come back where it was). ``epoch``: the client's
        topology's; a ``wrong_role`` from a node at an older epoch backs off instead of
        following its redirect (the node has not adopted the change yet, and names the holder
        of the role before it: often a dead node)."""
        action = action_for(error)
        if action is Action.FAIL:
            return None
        if isinstance(error, WrongRoleError) and error.epoch < epoch:
            action = Action.BACKOFF
        if action is Action.REDIRECT:
            if self.redirects >= self._policy.redirects_max:
                return None
            self.redirects += 1
            return Step(action, 0.0)
        if self.attempts >= self._policy.attempts_max:
            return None
        self.attempts += 1
        if action is Action.RESEND:
            return Step(action, 0.0)
        backoff_s = self._policy.delay_s(self.attempts - 1, self._rng)
        if action is Action.AWAIT_TOPOLOGY and managed:
            return Step(action, limits.client_silence_ms / 1000)
        return Step(action, backoff_s)


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


# --- following the cluster ---------------------------------------------------------------------


class Purpose(NamedTuple):
    """The role a request was sent to a node for: the head of ``shard`` (a produce, a group
    commit) or one of its tails (a ``WAIT_COMMITTED``, a consume page). A named tuple: one is
    made per request sent."""

    shard: int
    role: Literal["head", "tail"]


def holds_role(topology: Topology, node: str, purpose: Purpose) -> bool:
    """Whether ``node`` holds, in ``topology``, the role ``purpose`` names."""
    shard = topology.shards.get(purpose.shard)
    if shard is None:
        return False
    return shard.head == node if purpose.role == "head" else node in shard.tails


def abandoned(
    old: Topology | None, new: Topology, sent: Sequence[tuple[str, Purpose]]
) -> list[int]:
    """Indexes of the requests in flight ``sent`` (node, purpose) that installing ``new`` over
    ``old`` abandons: those whose node does not hold, in ``new``, the role they were sent for.
    Only a newer epoch abandons anything."""
    if old is not None and new.epoch <= old.epoch:
        return []
    return [i for i, (node, purpose) in enumerate(sent) if not holds_role(new, node, purpose)]


def manager_urls(topology: Topology | None) -> list[str]:
    """The cluster manager members' HTTP URLs the topology names (its ``managers``, once
    topologies carry them; none before)."""
    urls = getattr(topology, "managers", None) or ()
    return [str(url).rstrip("/") for url in urls]


def silent(last_heard_s: float, busy_since_s: float, now_s: float, silence_s: float) -> bool:
    """A connection with requests outstanding is silent once it has heard nothing from its node
    for ``silence_s``, counted from when its first outstanding request was sent if later."""
    return now_s - max(last_heard_s, busy_since_s) >= silence_s


def check_counts(due_s: float, now_s: float, interval_s: float) -> bool:
    """A silence check that runs more than another interval after it was due judges nobody:
    the client's own event loop was held up, and replies may be waiting unread."""
    return now_s - due_s <= interval_s


def report_due(last_s: float | None, now_s: float, interval_s: float) -> bool:
    """A lost node is reported to the manager at most once per ``interval_s``."""
    return last_s is None or now_s - last_s >= interval_s


def watch_urls(seeds: Sequence[str], topology: Topology | None, salt: int, most: int) -> list[str]:
    """The URLs a client's watch long-polls: its seeds, then its topology's nodes in an order
    of its own (``salt``, drawn once per client, so clients of a large cluster spread over its
    nodes), each once, at most ``most``."""
    urls = list(dict.fromkeys(seed.rstrip("/") for seed in seeds))
    if topology is not None:
        nodes = sorted(topology.nodes.values(), key=lambda n: zlib.crc32(f"{salt}:{n.id}".encode()))
        urls += [node.http_url for node in nodes if node.http_url not in urls]
    return urls[:most]


Outcome = Literal["newer", "same", "failed"]


def next_poll(
    failures: int,
    outcome: Outcome,
    elapsed_s: float,
    wait_s: float,
    policy: RetryPolicy,
    rng: random.Random,
) -> tuple[int, float]:
    """After one long poll of a node: its failures in a row and the pause before the next.
    ``newer``: it answered a topology past the epoch asked about (at once again). ``same``: it
    did not; at once again if it waited, but after ``client_topology_max_age_ms`` if it answered
    in under half the wait asked for (a node older than the long poll answers at once).
    ``failed``: after the retry backoff, which grows with the failures in a row."""
    if outcome == "failed":
        return failures + 1, policy.delay_s(failures + 1, rng)
    if outcome == "same" and elapsed_s < wait_s / 2:
        return 0, limits.client_topology_max_age_ms / 1000
    return 0, 0.0
