"""Pure chain decisions (docs/replication-protocol.md, "Commit progress", "Catch-up handshake").

Nothing here does I/O or reads a clock: ``step(progress, event) -> (progress, actions)`` decides
what a replica tells its upstream and when its committed seq advances; ``rollback_point`` decides
where a rejoining replica's history diverged; ``LinkWindow`` is a link's flow-control ledger.
The asyncio drivers in ``kayos.replication.replica`` feed events in and carry actions out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from kayos import limits

# --- commit progress -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    """One replica's view of its shard's commit progress.

    ``durable`` is its own store's last seq; ``committed`` the seq durable on it and on every
    member below it (for a head: the shard's committed seq). Neither ever decreases.
    """

    has_upstream: bool
    downstreams: tuple[str, ...]
    durable: int = 0
    committed: int = 0
    acked: dict[str, int] = field(default_factory=dict)
    downstream_committed: dict[str, int] = field(default_factory=dict)

    @property
    def is_tail(self) -> bool:
        return not self.downstreams


@dataclass(frozen=True, slots=True)
class Durable:
    """The replica's own store committed (fsynced) through ``seq``."""

    seq: int


@dataclass(frozen=True, slots=True)
class DownstreamAck:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class DownstreamCommitted:
    node: str
    seq: int


@dataclass(frozen=True, slots=True)
class DownstreamLinked:
    """A downstream (re)subscribed: its earlier reports belong to a link that is gone."""

    node: str


@dataclass(frozen=True, slots=True)
class UpstreamLinked:
    """The link to the upstream is (re)established: tell it where this replica stands."""


Event: TypeAlias = Durable | DownstreamAck | DownstreamCommitted | DownstreamLinked | UpstreamLinked


@dataclass(frozen=True, slots=True)
class SendAck:
    seq: int


@dataclass(frozen=True, slots=True)
class SendCommitted:
    seq: int


@dataclass(frozen=True, slots=True)
class CommittedAdvanced:
    """Answer the producers and waiters whose seqs are now covered."""

    seq: int


@dataclass(frozen=True, slots=True)
class Violation:
    """A downstream broke the protocol (a report went backwards); close its link."""

    node: str
    reason: str


Action: TypeAlias = SendAck | SendCommitted | CommittedAdvanced | Violation


def _advance(progress: Progress, candidate: int, actions: list[Action]) -> Progress:
    if candidate <= progress.committed:
        return progress
    actions.append(CommittedAdvanced(candidate))
    if progress.has_upstream:
        actions.append(SendCommitted(candidate))
    return replace(progress, committed=candidate)


def _below(progress: Progress) -> int:
    """The seq every downstream reports committed (a tail has none: its own durable seq)."""
    if progress.is_tail:
        return progress.durable
    return min(progress.downstream_committed.get(node, 0) for node in progress.downstreams)


def step(progress: Progress, event: Event) -> tuple[Progress, list[Action]]:
    actions: list[Action] = []
    if isinstance(event, Durable):
        if event.seq <= progress.durable:
            return progress, actions
        progress = replace(progress, durable=event.seq)
        if progress.has_upstream and not progress.is_tail:
            actions.append(SendAck(event.seq))
        progress = _advance(progress, min(_below(progress), progress.durable), actions)
    elif isinstance(event, DownstreamAck | DownstreamCommitted):
        table = (
            progress.acked if isinstance(event, DownstreamAck) else progress.downstream_committed
        )
        if event.node not in progress.downstreams:
            actions.append(Violation(event.node, "not a downstream of this replica"))
            return progress, actions
        if event.seq < table.get(event.node, 0):
            actions.append(Violation(event.node, f"report went back to {event.seq}"))
            return progress, actions
        if event.seq > progress.durable:
            # Persist-before-forward: nothing below can be ahead of this replica.
            actions.append(Violation(event.node, f"report {event.seq} is past {progress.durable}"))
            return progress, actions
        if isinstance(event, DownstreamAck):
            progress = replace(progress, acked={**progress.acked, event.node: event.seq})
        else:
            reported = {**progress.downstream_committed, event.node: event.seq}
            progress = replace(progress, downstream_committed=reported)
            progress = _advance(progress, min(_below(progress), progress.durable), actions)
    elif isinstance(event, DownstreamLinked):
        progress = replace(
            progress,
            acked={k: v for k, v in progress.acked.items() if k != event.node},
            downstream_committed={
                k: v for k, v in progress.downstream_committed.items() if k != event.node
            },
        )
    elif isinstance(event, UpstreamLinked) and progress.has_upstream:
        if not progress.is_tail:
            actions.append(SendAck(progress.durable))
        if progress.committed:
            actions.append(SendCommitted(progress.committed))
    return progress, actions


# --- divergence ----------------------------------------------------------------------------------

TakeoverTable: TypeAlias = list[tuple[bytes, int]]


def rollback_point(
    downstream: TakeoverTable, upstream: TakeoverTable, down_last: int, up_last: int
) -> int | None:
    """Where a rejoining downstream must roll back to before it follows ``upstream``; None when
    its log is already a prefix of the upstream's, 0 for a full reset."""
    if down_last == 0:
        return None
    up_index = {uuid: i for i, (uuid, _) in enumerate(upstream)}
    common = None
    for d_index in range(len(downstream) - 1, -1, -1):
        if downstream[d_index][0] in up_index:
            common = d_index
            break
    if common is None:
        return 0
    u_index = up_index[downstream[common][0]]
    candidates = []
    if u_index + 1 < len(upstream):
        candidates.append(upstream[u_index + 1][1])
    if common + 1 < len(downstream):
        candidates.append(downstream[common + 1][1])
    agreed = min(candidates) if candidates else up_last
    agreed = min(agreed, up_last)
    return agreed if down_last > agreed else None


def with_takeover(table: TakeoverTable, uuid: bytes, seq: int) -> TakeoverTable:
    """The table after a member becomes head at ``seq`` (oldest entries dropped past the cap)."""
    return [*table, (uuid, seq)][-limits.takeover_table_entries_max :]


# --- link flow control ---------------------------------------------------------------------------


@dataclass(slots=True)
class LinkWindow:
    """Unacknowledged BATCH frames on one link: at most ``link_in_flight_batches_max`` of them and
    ``link_in_flight_bytes_max`` bytes, but one batch may always be in flight."""

    in_flight: deque[tuple[int, int]] = field(default_factory=deque)
    bytes_in_flight: int = 0

    def can_send(self) -> bool:
        if not self.in_flight:
            return True
        return (
            len(self.in_flight) < limits.link_in_flight_batches_max
            and self.bytes_in_flight < limits.link_in_flight_bytes_max
        )

    def sent(self, last_seq: int, size_bytes: int) -> None:
        self.in_flight.append((last_seq, size_bytes))
        self.bytes_in_flight += size_bytes

    def acknowledged(self, seq: int) -> None:
        while self.in_flight and self.in_flight[0][0] <= seq:
            _, size = self.in_flight.popleft()
            self.bytes_in_flight -= size
