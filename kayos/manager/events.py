"""What the manager is told (events) and what it asks for (actions): plain frozen records.

Times are integer milliseconds on the manager's clock, carried in the events themselves (the
log entry that carries an event carries its time), so applying an event never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.topology import check_node_id, check_queue_name

TakeoverEntries: TypeAlias = tuple[tuple[bytes, int], ...]

# --- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """``node`` was heard from at ``at_ms``."""

    node: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class TimerTick:
    """Time has reached ``now_ms``: silences are measured against it. ``heard`` carries the
    heartbeats the leader received since its last tick, (node, at_ms) pairs applied first, so the
    log holds one entry per tick rather than one per heartbeat. ``incarnations``: (node,
    incarnation) for each heard node whose incarnation differs from the one the view holds."""

    now_ms: int
    heard: tuple[tuple[str, int], ...] = ()
    incarnations: tuple[tuple[str, str], ...] = ()


# The causes of a NodeGone: the leader's own probe found nothing listening on the node's port,
# the node said goodbye on its watch (a clean stop), its supervisor saw the process exit.
GONE_CAUSES = ("refused", "stopped", "exited")
# An incarnation: 64 random bits as 16 lowercase hex digits ("" in a view: none heard yet).
INCARNATION_CHARS = 16


@dataclass(frozen=True, slots=True)
class NodeGone:
    """The leader has proof that ``node``'s process ``incarnation`` is gone at ``at_ms``
    (``cause``, one of ``GONE_CAUSES``; docs/manager.md, "Evidence and proof of death"): the node
    is down at once, unless the view holds another incarnation for it (the report is stale)."""

    node: str
    at_ms: int
    cause: str
    incarnation: str


@dataclass(frozen=True, slots=True)
class LatencyReport:
    """``reporter``, a chain neighbour of ``node``, measured ``node``'s p99 produce-path latency
    as ``p99_ms`` over the last ``window_ms``."""

    reporter: str
    node: str
    p99_ms: int
    window_ms: int


@dataclass(frozen=True, slots=True)
class HeadTookOver:
    """``node``, head of ``shard``, recorded the takeover entry (``master_id``, ``seq``)."""

    shard: int
    node: str
    master_id: bytes
    seq: int


@dataclass(frozen=True, slots=True)
class ShardReport:
    """A returning node's summary of its copy of one shard: last seq and takeover table."""

    shard: int
    last_seq: int
    takeover: TakeoverEntries


@dataclass(frozen=True, slots=True)
class NodeReturned:
    """``node`` is back (restarted, resumed, reconnected) at ``at_ms`` with these shard copies."""

    node: str
    at_ms: int
    reports: tuple[ShardReport, ...] = ()


@dataclass(frozen=True, slots=True)
class DiskFull:
    """``node`` reports its disk full (docs/manager.md, rule 9): it cannot commit, so it leaves
    every chain below the head until it reports room again (then it returns, ``NodeReturned``)."""

    node: str


@dataclass(frozen=True, slots=True)
class CatchUpDone:
    """``node`` has caught up on ``shard`` from its upstream and can join the chain, answering
    the catch-up order ``order`` (``StartCatchUp.order``): a report about an earlier order (one
    the node may since have been sent again, to roll back first) is ignored."""

    node: str
    shard: int
    order: int


@dataclass(frozen=True, slots=True)
class ManagerLeaderChanged:
    """A new manager leader took over at ``at_ms`` (applied by every member, like any event)."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class RemoveNode:
    """An operator removes ``node`` for good (``kayos ctl remove-node``)."""

    node: str


@dataclass(frozen=True, slots=True)
class AddNode:
    """An operator adds a brand-new node (``kayos ctl add-node``) at this address."""

    node: str
    host: str
    http_port: int
    bin_port: int


@dataclass(frozen=True, slots=True)
class MoveReplica:
    """An operator moves ``shard``'s replica from ``source`` to ``target`` (``kayos ctl
    move-shard``): the target catches up and joins as tail before the source leaves."""

    shard: int
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class Drain:
    """An operator empties ``node``: every replica it holds moves to another node."""

    node: str


@dataclass(frozen=True, slots=True)
class Rebalance:
    """An operator asks for replicas to be spread evenly (``plan_rebalance``)."""


@dataclass(frozen=True, slots=True)
class SetQueueShards:
    """An operator gives ``queue`` ``shards`` shards (``kayos ctl queue create/alter``). A count
    below the view's for the queue, or above the number of shards, is ignored: a queue's shard
    count never goes down (docs/node-api.md, "Queues over several shards")."""

    queue: str
    shards: int


OperatorEvent: TypeAlias = RemoveNode | AddNode | MoveReplica | Drain | Rebalance | SetQueueShards

Event: TypeAlias = (
    Heartbeat
    | TimerTick
    | LatencyReport
    | HeadTookOver
    | NodeReturned
    | DiskFull
    | NodeGone
    | CatchUpDone
    | ManagerLeaderChanged
    | RemoveNode
    | AddNode
    | MoveReplica
    | Drain
    | Rebalance
    | SetQueueShards
)

# --- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpliceChain:
    """Every member of ``shard`` adopts ``chain`` (head first) at ``epoch``."""

    shard: int
    chain: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class Alert:
    """An alert was raised (see ``AlertKey`` kinds in view.py)."""

    kind: str
    shard: int
    node: str


@dataclass(frozen=True, slots=True)
class ClearAlert:
    """An alert no longer holds."""

    kind: str
    shard: int
    node: str


@dataclass(frozen=True, slots=True)
class StartCatchUp:
    """``node`` rolls back to ``rollback_to`` (None: nothing to roll back, as far as the manager
    knows; the link handshake checks again) and catches ``shard`` up from ``upstream``. ``order``
    numbers the order (view-wide, rising): only a ``CatchUpDone`` naming it rejoins the node; a
    new order (a new upstream, a new return) gets a new number; a resent one keeps its own."""

    node: str
    shard: int
    upstream: str
    rollback_to: int | None
    order: int


@dataclass(frozen=True, slots=True)
class RejoinAsTail:
    """``node`` is the new tail of ``shard`` from ``epoch`` on."""

    node: str
    shard: int
    epoch: int


@dataclass(frozen=True, slots=True)
class PublishTopology:
    """Clients and nodes are told the topology at ``epoch``."""

    epoch: int


Action: TypeAlias = SpliceChain | Alert | ClearAlert | StartCatchUp | RejoinAsTail | PublishTopology


def check_event(event: Event) -> Event:
    """Refuses a malformed event with ``InvalidRequest`` before it is logged, so ``decide`` only
    ever sees well-formed ones (it ignores events about unknown nodes or shards, which are stale,
    not malformed). Returns the event so it chains."""
    times: list[int] = []
    nodes: list[str] = []
    if isinstance(event, Heartbeat):
        times, nodes = [event.at_ms], [event.node]
    elif isinstance(event, TimerTick):
        if max(len(event.heard), len(event.incarnations)) > limits.manager_nodes_max:
            raise InvalidRequest(f"a tick carries at most {limits.manager_nodes_max} heartbeats")
        times = [event.now_ms, *(at for _, at in event.heard)]
        nodes = [node for node, _ in (*event.heard, *event.incarnations)]
        for _, incarnation in event.incarnations:
            check_incarnation(incarnation)
    elif isinstance(event, NodeGone):
        times, nodes = [event.at_ms], [event.node]
        if event.cause not in GONE_CAUSES:
            raise InvalidRequest(f"a node_gone cause is one of {', '.join(GONE_CAUSES)}")
        if event.incarnation:
            check_incarnation(event.incarnation)
    elif isinstance(event, LatencyReport):
        nodes = [event.reporter, event.node]
        if event.p99_ms < 0 or event.window_ms <= 0:
            raise InvalidRequest("a latency report needs p99_ms >= 0 and window_ms > 0")
    elif isinstance(event, HeadTookOver):
        nodes = [event.node]
        _check_entries(((event.master_id, event.seq),))
    elif isinstance(event, NodeReturned):
        times, nodes = [event.at_ms], [event.node]
        if len(event.reports) > limits.manager_shards_max:
            raise InvalidRequest(f"a return carries at most {limits.manager_shards_max} reports")
        for report in event.reports:
            if report.last_seq < 0:
                raise InvalidRequest("a shard report's last_seq must be >= 0")
            if len(report.takeover) > limits.takeover_table_entries_max:
                raise InvalidRequest("a takeover table is longer than its bound")
            _check_entries(report.takeover)
    elif isinstance(event, CatchUpDone):
        nodes = [event.node]
        if event.order < 1:
            raise InvalidRequest("a catch-up order number is >= 1")
    elif isinstance(event, RemoveNode | Drain | DiskFull):
        nodes = [event.node]
    elif isinstance(event, AddNode):
        nodes = [event.node]
        if (
            not 0 < len(event.host) <= limits.manager_node_host_chars_max
            or not event.host.isprintable()
        ):
            raise InvalidRequest(
                f"a node's host is 1 to {limits.manager_node_host_chars_max} printable characters"
            )
        for port in (event.http_port, event.bin_port):
            if not 0 < port < 65_536:
                raise InvalidRequest("a node's ports must be in 1..65535")
        if event.http_port == event.bin_port:
            raise InvalidRequest("a node's http and binary ports must differ")
    elif isinstance(event, MoveReplica):
        nodes = [event.source, event.target]
        if event.shard < 0:
            raise InvalidRequest("a shard id must be >= 0")
        if event.source == event.target:
            raise InvalidRequest("a move needs two different nodes")
    elif isinstance(event, ManagerLeaderChanged):
        times = [event.at_ms]
    elif isinstance(event, SetQueueShards):
        check_queue_name(event.queue)
        if not 1 <= event.shards <= limits.manager_shards_max:
            raise InvalidRequest(f"a queue's shard count must be 1 .. {limits.manager_shards_max}")
    if any(t < 0 for t in times):
        raise InvalidRequest("event times must be >= 0")
    for node in nodes:
        check_node_id(node)
    return event


def check_incarnation(incarnation: str) -> str:
    """Refuses anything but 16 lowercase hex digits (a node's incarnation) with
    ``InvalidRequest``; returns it so it chains."""
    if (
        not isinstance(incarnation, str)
        or len(incarnation) != INCARNATION_CHARS
        or incarnation.strip("0123456789abcdef")
    ):
        raise InvalidRequest(f"an incarnation is {INCARNATION_CHARS} lowercase hex digits")
    return incarnation


def _check_entries(entries: TakeoverEntries) -> None:
    for master_id, seq in entries:
        if not 1 <= len(master_id) <= _MASTER_ID_BYTES_MAX or seq < 0:
            raise InvalidRequest("a takeover entry needs a 1-16 byte master id and a seq >= 0")


# A master id is a UUID (16 bytes); shorter ids are accepted for tests and hand-written tables.
_MASTER_ID_BYTES_MAX = 16
