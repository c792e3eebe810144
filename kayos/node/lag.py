"""Every consumer group's lag on a node, in messages and in seconds, computed when asked.

A scrape of ``/metrics`` (``kayos_consumer_lag_messages``, ``kayos_consumer_lag_seconds``) and
``GET /v1/status?groups=1`` (what ``kayos ctl status`` shows) call ``group_lags``; nothing is
counted as messages come, so produce and consume pay nothing for it. Only the replicas a shard's
consumers read from report (its tails: a one-member chain's head is its tail), from their committed
data, so each group of each shard has one answer per tail (docs/node-api.md, "Metrics").

The count is ``pages.scan_unread``'s (the entries of the group's queue in ``(hwm, commit
point]``), run in one worker thread for all groups with a shared budget of
``limits.group_lag_metrics_scan_entries_max`` entries, groups closest to their boundary first. A
group the budget does not reach, or reaches only in part, gets estimates that err high: the
entries counted plus every seq not looked at, and the age of the first seq not looked at when no
entry of its queue was found. The ages come from the replica's time index (at most
``limits.time_index_interval_ms`` too old), read back on the event loop that owns it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from kayos import limits
from kayos.node.pages import Unread, scan_unread
from kayos.replication.shard.replica import ShardReplica

# The metadata key prefix of a group's high-water mark: ``hwm/<queue>/<group>``.
HWM_META = "hwm/"


@dataclass(frozen=True, slots=True)
class GroupLag:
    """One group's lag on one shard as its tail sees it. ``seconds`` is None when the time of its
    oldest unread entry is unknown here; ``exact`` is False when the figures are estimates."""

    shard: int
    queue: str
    group: str
    hwm: int
    boundary: int
    messages: int
    seconds: float | None
    exact: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "group": self.group,
            "hwm": self.hwm,
            "boundary": self.boundary,
            "lag_messages": self.messages,
            "lag_seconds": self.seconds,
            "lag_exact": self.exact,
        }


def marks_of(replica: ShardReplica) -> list[tuple[str, str, int]]:
    """``(queue, group, hwm)`` of every group with a mark in the replica's metadata."""
    found = []
    for name, value in replica.store.meta.items():
        if name.startswith(HWM_META) and isinstance(value, int):
            queue, _, group = name[len(HWM_META) :].partition("/")
            found.append((queue, group, value))
    return found


def reports_lag(replica: ShardReplica) -> bool:
    """Whether this replica reports its shard's groups: it is one of the shard's tails (where
    consumers read), in service."""
    return (
        replica.role != "learner"
        and replica.shard.is_tail(replica.node_id)
        and not replica.repairing
        and not replica.catching_up
    )


Job = tuple[ShardReplica, str, str, int]


def _scan_all(jobs: list[Job], budget: int) -> list[Unread]:
    """Each job's ``scan_unread`` in order, sharing ``budget`` entries (worker thread)."""
    found = []
    for replica, queue, _, hwm in jobs:
        unread = scan_unread(replica, queue, hwm, max(1, budget))
        budget -= unread.scanned
        found.append(unread)
    return found


def _age(replica: ShardReplica, seq: int, now_s: float) -> float | None:
    accepted_ms = replica.time_index.time_of(seq)
    if accepted_ms is None:
        return None
    return round(max(0.0, now_s - accepted_ms / 1000), 3)


def lag_of(job: Job, unread: Unread, now_s: float) -> GroupLag:
    """A job's figures from what the scan found (on the event loop: it reads the time index)."""
    replica, queue, group, hwm = job
    messages = unread.lag
    if not unread.complete:
        messages += unread.boundary - unread.through
    if unread.oldest is not None:
        seconds = _age(replica, unread.oldest, now_s)
    elif unread.complete:
        seconds = 0.0
    else:
        seconds = _age(replica, unread.through + 1, now_s)
    shard = replica.shard_id
    return GroupLag(shard, queue, group, hwm, unread.boundary, messages, seconds, unread.complete)


async def group_lags(
    replicas: dict[int, ShardReplica],
    now_s: float,
    budget: int = limits.group_lag_metrics_scan_entries_max,
) -> list[GroupLag]:
    """Every group's lag on the shards this node tails, in shard, queue and group order."""
    jobs: list[Job] = [
        (replica, queue, group, hwm)
        for replica in replicas.values()
        if reports_lag(replica)
        for queue, group, hwm in marks_of(replica)
    ]
    # Closest to the boundary first: caught-up groups cost a few entries and get exact figures.
    jobs.sort(key=lambda job: job[0].commit_point - job[3])
    found = await asyncio.to_thread(_scan_all, jobs, budget) if jobs else []
    lags = [lag_of(job, unread, now_s) for job, unread in zip(jobs, found, strict=True)]
    return sorted(lags, key=lambda lag: (lag.shard, lag.queue, lag.group))
