"""Pure chain decisions (docs/replication-protocol.md, "Commit progress", "Catch-up handshake").

Nothing here does I/O or reads a clock: ``step(progress, event) -> (progress, actions)`` decides
what a replica tells its upstream and when its committed seq advances; ``rollback_point`` decides
where a rejoining replica's history diverged; ``LinkWindow`` is a link's flow-control ledger.
The asyncio drivers in ``kayos.replication.shard.replica`` and its links
(``kayos.replication.link.upstream``, ``kayos.replication.link.downstream``) feed events in and
carry actions out.
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

    ``durable`` is its own store's last seq; ``accepted`` the last seq it has taken in and may have
    forwarded (at least ``durable``: members forward before they persist); ``committed`` the seq
    durable on it and on every member below it (for a head: the shard's committed seq);
    ``commit_point`` the shard's committed seq as this member knows it, which consumers may see.
    ``upstream_point`` is the last commit point the upstream sent. None of them ever decreases
    on one history: ``Discarded`` brings ``accepted`` back to ``durable``, and a rollback starts
    a new ``Progress``.
    """

    has_upstream: bool
    downstreams: tuple[str, ...]
    durable: int = 0
    accepted: int = 0
    committed: int = 0
    commit_point: int = 0
    upstream_point: int = 0
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
class Accepted:
    """The replica took in a batch through ``seq`` (seqs assigned at a head, received below it)."""

    seq: int


@dataclass(frozen=True, slots=True)
class Discarded:
    """What was accepted but is not durable will never be: the upstream link ended, or a head's
    commit failed."""


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


@dataclass(frozen=True, slots=True)
class UpstreamCommitPoint:
    """The upstream sent the shard's commit point (``COMMIT_POINT``)."""

    seq: int


@dataclass(frozen=True, slots=True)
class DownstreamsChanged:
    """The members counted in the commit below this one changed without a new chain: a catch-up
    follower counted, or counted no more (docs/replication-protocol.md, "Counting a catch-up
    follower"). Reports of the ones gone are dropped; a new one counts from its first report."""

    downstreams: tuple[str, ...]


Event: TypeAlias = (
    Durable
    | Accepted
    | Discarded
    | DownstreamAck
    | DownstreamCommitted
    | DownstreamLinked
    | UpstreamLinked
    | UpstreamCommitPoint
    | DownstreamsChanged
)


@dataclass(frozen=True, slots=True)
class SendAck:
    seq: int


@dataclass(frozen=True, slots=True)
class SendCommitted:
    seq: int


@dataclass(frozen=True, slots=True)
class SendCommitPoint:
    """Tell ``node`` (None: every downstream) the commit point."""

    seq: int
    node: str | None = None


@dataclass(frozen=True, slots=True)
class CommitPointAdvanced:
    """Answer the producers and waiters whose seqs are now covered; consumers may see more."""

    seq: int


@dataclass(frozen=True, slots=True)
class Violation:
    """A downstream broke the protocol (a report went backwards); close its link."""

    node: str
    reason: str


Action: TypeAlias = SendAck | SendCommitted | SendCommitPoint | CommitPointAdvanced | Violation


def _advance_point(progress: Progress, candidate: int, actions: list[Action]) -> Progress:
    if candidate <= progress.commit_point:
        return progress
    actions.append(CommitPointAdvanced(candidate))
    if progress.downstreams:
        actions.append(SendCommitPoint(candidate))
    return replace(progress, commit_point=candidate)


def _advance(progress: Progress, actions: list[Action]) -> Progress:
    """Moves ``committed`` to what this member and every member below it hold, and the commit
    point with it: a head's is its committed seq, another member's what its upstream said (never
    past what it holds itself)."""
    candidate = min(_below(progress), progress.durable)
    if candidate > progress.committed:
        progress = replace(progress, committed=candidate)
        if progress.has_upstream:
            actions.append(SendCommitted(candidate))
    if progress.has_upstream:
        point = min(progress.upstream_point, progress.durable)
    else:
        point = progress.committed
    return _advance_point(progress, point, actions)


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
        progress = replace(progress, durable=event.seq, accepted=max(progress.accepted, event.seq))
        if progress.has_upstream and not progress.is_tail:
            actions.append(SendAck(event.seq))
        progress = _advance(progress, actions)
    elif isinstance(event, Accepted):
        if event.seq > progress.accepted:
            progress = replace(progress, accepted=event.seq)
    elif isinstance(event, Discarded):
        # The links below are being closed: what they reported may name seqs of the lost part,
        # and must not count for the seqs given out anew (DownstreamLinked starts them afresh).
        progress = replace(progress, accepted=progress.durable, acked={}, downstream_committed={})
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
        if event.seq > progress.accepted:
            # Nothing below can hold what this replica never took in.
            actions.append(Violation(event.node, f"report {event.seq} is past {progress.accepted}"))
            return progress, actions
        if isinstance(event, DownstreamAck):
            progress = replace(progress, acked={**progress.acked, event.node: event.seq})
        else:
            reported = {**progress.downstream_committed, event.node: event.seq}
            progress = replace(progress, downstream_committed=reported)
            progress = _advance(progress, actions)
    elif isinstance(event, DownstreamLinked):
        progress = replace(
            progress,
            acked={k: v for k, v in progress.acked.items() if k != event.node},
            downstream_committed={
                k: v for k, v in progress.downstream_committed.items() if k != event.node
            },
        )
        if progress.commit_point and event.node in progress.downstreams:
            actions.append(SendCommitPoint(progress.commit_point, event.node))
    elif isinstance(event, DownstreamsChanged):
        kept = event.downstreams
        progress = replace(
            progress,
            downstreams=kept,
            acked={k: v for k, v in progress.acked.items() if k in kept},
            downstream_committed={
                k: v for k, v in progress.downstream_committed.items() if k in kept
            },
        )
        progress = _advance(progress, actions)
    elif isinstance(event, UpstreamLinked) and progress.has_upstream:
        if not progress.is_tail:
            actions.append(SendAck(progress.durable))
        if progress.committed:
            actions.append(SendCommitted(progress.committed))
    elif (
        isinstance(event, UpstreamCommitPoint)
        and progress.has_upstream
        and event.seq > progress.upstream_point
    ):
        progress = replace(progress, upstream_point=event.seq)
        progress = _advance(progress, actions)
    return progress, actions


def mark_servable(progress: Progress, written_at: int) -> bool:
    """Whether a consumer group's mark, written into this member's store by the commit of seq
    ``written_at``, may start a snapshot here: only once the commit point covers that seq. A mark
    that is only durable on this member (forward, then persist: a tail may hold a group commit
    before the members above it do) was acknowledged to nobody and may be rolled back (a middle
    discards what it had not begun to commit when its upstream link ends, or a new head lacks
    it); served, the group's next snapshot would start below this one (docs/node-api.md,
    "Consume")."""
    return progress.commit_point >= written_at


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


def reset_explained_by_cap(
    downstream: TakeoverTable, upstream: TakeoverTable, *, up_last: int, point: int
) -> bool:
    """Whether a full-reset verdict (``rollback_point`` 0) only says that the upstream's table,
    trimmed to ``limits.takeover_table_entries_max`` entries, no longer names a master the
    downstream knows: the table is full, shares no master with the downstream's, every master
    the downstream knows began at or before the upstream's oldest entry, and the upstream holds
    at least ``point``, the commit point the downstream knows. Every head since held every
    committed seq, so the reset loses nothing acknowledged; a downstream takes it even below
    its commit point (docs/replication-protocol.md, "After SUBSCRIBED")."""
    if len(upstream) < limits.takeover_table_entries_max or not downstream or up_last < point:
        return False
    if {uuid for uuid, _ in downstream} & {uuid for uuid, _ in upstream}:
        return False
    return max(seq for _, seq in downstream) <= upstream[0][1]


def upstream_lacks_committed(
    downstream: TakeoverTable,
    upstream: TakeoverTable,
    *,
    verdict: int | None,
    up_last: int,
    point: int,
) -> bool:
    """Whether an upstream whose divergence verdict for a subscribing downstream is ``verdict``
    lost committed entries: the verdict would drop seqs at or below ``point``, the commit point
    the downstream knows (within what it holds), which were durable on every member, the
    upstream included. A reset the table cap explains drops nothing committed
    (docs/replication-protocol.md, "An upstream that lacks committed entries")."""
    if verdict is None or verdict >= point:
        return False
    return not (
        verdict == 0 and reset_explained_by_cap(downstream, upstream, up_last=up_last, point=point)
    )


def may_drop_past(agreed: int, own_point: int, *, marked: int = 0) -> bool:
    """Whether a head found lacking committed entries may drop what it holds past ``agreed`` to
    re-fetch them: only when none of it is committed as far as it knows (``own_point``, its own
    commit point, and ``marked``, its durable mark: what it knew committed before a re-make or a
    restart set its commit point back to 0). Otherwise it committed seqs alone that its
    downstream holds other committed values at, and dropping either side's loses acknowledged
    entries."""
    return max(own_point, marked) <= agreed


def with_takeover(table: TakeoverTable, uuid: bytes, seq: int) -> TakeoverTable:
    """The table after a member becomes head at ``seq``: entries past ``seq`` dropped (they name
    masters of seqs this member never held, which the new master now writes), then the new entry
    added, then the oldest entries dropped past the cap. A table's seqs never decrease."""
    kept = [entry for entry in table if entry[1] <= seq]
    return [*kept, (uuid, seq)][-limits.takeover_table_entries_max :]


# --- learner and repair links -----------------------------------------------------------------


def copy_pause_s(busy_s: float, *, live_s_ago: float, live_window_s: float, share: float) -> float:
    """How long a learner or repair link pauses after a piece that took ``busy_s`` to read back
    and send: none while the shard takes no live writes (none accepted within
    ``live_window_s``), else enough that the link takes at most ``share`` of the time."""
    if live_s_ago > live_window_s or busy_s <= 0:
        return 0.0
    return busy_s * (1.0 - share) / share


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
