"""The leader driver's choosing (docs/manager.md, "The driver loop"), pure: it reads no clock
and does no I/O. ``plan_round`` takes the view, one round's answers and the driver's small memory,
and gives the events to log and the messages to send; ``sends_for`` what a batch of actions
sends, ``lease_grants`` the lease answers, ``topology_of`` the topology a view describes.
``kayos.manager.member.driver`` is the asyncio part that asks, logs, sends and sleeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kayos import limits
from kayos.identity import ClusterIdentity
from kayos.manager import (
    Action,
    CatchUpDone,
    DiskFull,
    Event,
    HeadTookOver,
    LatencyReport,
    ManagerView,
    NodeReturned,
    PublishTopology,
    RejoinAsTail,
    ShardReport,
    SpliceChain,
    StartCatchUp,
    TimerTick,
)
from kayos.manager.member.evidence import tick_incarnations
from kayos.signing import sign
from kayos.topology import NodeAddr, ShardChain, Topology


@dataclass(frozen=True, slots=True)
class Answer:
    """One node's answer in a round: its ``GET /v1/status`` body (None: no answer within the
    bound), the time it arrived, and how long it took."""

    status: Mapping[str, Any] | None
    at_ms: int
    elapsed_ms: int


@dataclass(frozen=True, slots=True)
class Memory:
    """What the driver remembers between rounds (leader-local, lost on a leader change, which
    only costs a re-send): who answered last round, how many fast answers in a row each slow
    node gave, when each message was last sent, and when each node last answered a poll late
    (over ``slow_p99_ms``) or not at all, within the slow window."""

    answered: frozenset[str] = frozenset()
    fast_answers: Mapping[str, int] = field(default_factory=dict)
    sent_topology_ms: Mapping[str, int] = field(default_factory=dict)
    sent_catch_up_ms: Mapping[tuple[str, int], int] = field(default_factory=dict)
    late_answer_ms: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CatchUpOrder:
    node: str
    shard: int
    upstream: str


@dataclass(frozen=True, slots=True)
class FollowersNote:
    """Tell the tail ``node`` the shard's catch-up list (``followers``) at ``epoch``: it ends the
    count of a follower no longer in it (docs/replication-protocol.md, "Counting a catch-up
    follower")."""

    node: str
    shard: int
    epoch: int
    followers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    events: list[Event]
    send_topology: list[str]
    send_catch_up: list[CatchUpOrder]
    memory: Memory
    send_followers: list[FollowersNote] = field(default_factory=list)


def _shard_status(status: Mapping[str, Any] | None, shard: int) -> Mapping[str, Any] | None:
    if status is None:
        return None
    shards = status.get("shards")
    entry = shards.get(str(shard)) if isinstance(shards, dict) else None
    return entry if isinstance(entry, dict) else None


def durable_seq(entry: Mapping[str, Any]) -> int | None:
    """A shard's durable seq from a status entry (``durable_seq``, else ``last_seq``)."""
    value = entry.get("durable_seq", entry.get("last_seq"))
    return value if type(value) is int and value >= 0 else None


def _reports(status: Mapping[str, Any]) -> tuple[ShardReport, ...]:
    shards = status.get("shards")
    if not isinstance(shards, dict):
        return ()
    reports = []
    for key, entry in sorted(shards.items()):
        if not (isinstance(key, str) and key.isdigit() and isinstance(entry, dict)):
            continue
        seq = durable_seq(entry)
        if seq is None:
            continue
        takeover = _takeover(entry.get("takeover"))
        if takeover is None:
            continue  # unreadable: no report (an empty table would read as a lost store)
        reports.append(
            ShardReport(int(key), seq, tuple(takeover[: limits.takeover_table_entries_max]))
        )
    return tuple(reports[: limits.manager_shards_max])


def _takeover(raw: Any) -> list[tuple[bytes, int]] | None:
    """A status's takeover table as (master, seq) pairs; None where any item is malformed."""
    takeover: list[tuple[bytes, int]] = []
    for item in raw or ():
        try:
            master, at = item
            if type(at) is not int or at < 0 or not 1 <= len(bytes.fromhex(master)) <= 16:
                return None
        except (TypeError, ValueError):
            return None
        takeover.append((bytes.fromhex(master), at))
    return takeover


def _latency_events(view: ManagerView, reporter: str, status: Mapping[str, Any]) -> list[Event]:
    """The reporter's measurements worth logging: a neighbour over the slow bound for the slow
    window, or one the view holds slow (so it can recover). Healthy reports are not logged."""
    table = status.get("latency")
    if not isinstance(table, dict):
        return []
    states = {n.id: n.state for n in view.nodes}
    events: list[Event] = []
    for peer, entry in sorted(table.items()):
        if peer not in states or peer == reporter or not isinstance(entry, dict):
            continue
        measured = _sustained_p99(view, entry)
        if measured is None:
            continue
        p99_ms, window = measured
        if p99_ms > view.config.slow_p99_ms or states[peer] == "slow":
            events.append(LatencyReport(reporter, peer, p99_ms, window))
    return events


def _sustained_p99(view: ManagerView, entry: Mapping[str, Any]) -> tuple[int, int] | None:
    """(p99 ms, window ms) a neighbour's latency entry shows over the slow window
    (docs/manager.md, rule 4), or None for no verdict. From the per-bucket p99s
    (``recent_p99_ms``) of the last ``slow_window_ms``, those holding samples: with at least
    ``limits.manager_slow_buckets_min`` of them, and two thirds of them, over the bound, the
    smallest of those (it stayed slow); with at least that many and none over, the largest (it
    stayed quick). An entry without buckets (a node of an earlier version): its p99 over its
    whole window."""
    bound = view.config.slow_p99_ms
    recent, bucket_ms = entry.get("recent_p99_ms"), entry.get("bucket_ms")
    if isinstance(recent, list) and type(bucket_ms) is int and bucket_ms > 0:
        wanted = max(1, math.ceil(view.config.slow_window_ms / bucket_ms))
        found = [
            float(x)
            for x in recent[-wanted:]
            if isinstance(x, int | float)
            and not isinstance(x, bool)
            and math.isfinite(x)
            and x >= 0
        ]
        over = [x for x in found if x > bound]
        if len(over) >= max(limits.manager_slow_buckets_min, math.ceil(2 * len(found) / 3)):
            return math.ceil(min(over)), wanted * bucket_ms  # stayed slow
        if not over and len(found) >= limits.manager_slow_buckets_min:
            return math.ceil(max(found)), wanted * bucket_ms  # stayed quick
        return None
    p99, window, samples = entry.get("p99_ms"), entry.get("window_ms"), entry.get("samples")
    if not isinstance(p99, int | float) or type(window) is not int or type(samples) is not int:
        return None
    if samples <= 0 or window < view.config.slow_window_ms or not math.isfinite(p99) or p99 < 0:
        return None
    return math.ceil(p99), window


def _takeovers(view: ManagerView, answers: Mapping[str, Answer]) -> list[Event]:
    """A head whose takeover table ends in an entry the view has not seen: ``HeadTookOver``, so
    the view holds the head's table (the rollback point of a returning node is computed from
    it)."""
    events: list[Event] = []
    for shard in view.shards:
        head = shard.chain[0]
        answer = answers.get(head)
        entry = _shard_status(answer.status if answer is not None else None, shard.id)
        if entry is None or entry.get("role") != "head":
            continue
        reports = [r for r in _reports({"shards": {str(shard.id): entry}}) if r.takeover]
        if not reports:
            continue
        last = reports[0].takeover[-1]
        if not shard.takeover or shard.takeover[-1] != last:
            events.append(HeadTookOver(shard.id, head, last[0], last[1]))
    return events


def _learning_from(entry: Mapping[str, Any] | None, upstream: str) -> bool:
    """The node copies the shard as a learner of ``upstream`` over a live link: its link
    handshake (which rolls back a divergent suffix) is done. Only then does its seq say how far
    it is from the tail: a copy from before the order (a replica of the old chain, a learner of
    an old tail) may hold a divergent suffix that looks caught up (simulator seeds 1523, 517)."""
    return (
        entry is not None
        and entry.get("role") == "learner"
        and entry.get("upstream") == upstream
        and entry.get("upstream_linked") is True
    )


def _counted(entry: Mapping[str, Any] | None) -> set[str]:
    """The catch-up followers a tail's status says it counts in its commit."""
    names = entry.get("counted_followers") if entry is not None else None
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _followers_notes(view: ManagerView, answers: Mapping[str, Answer]) -> list[FollowersNote]:
    """A tail at the view's epoch that counts a follower the shard's catch-up list no longer
    holds is told the list: only the manager's word ends a count."""
    notes = []
    for shard in view.shards:
        status = answers[shard.tail].status if shard.tail in answers else None
        if status is None or status.get("epoch") != view.epoch:
            continue
        counted = _counted(_shard_status(status, shard.id))
        if counted - set(shard.catching_up):
            notes.append(FollowersNote(shard.tail, shard.id, view.epoch, shard.catching_up))
    return notes


def _disk(status: Mapping[str, Any]) -> tuple[bool, int] | None:
    """(full, bytes free beyond the reserve) from a status's ``disk`` (docs/node-api.md); None
    from a node that does not report it (an earlier version) or reports no ``full``."""
    disk = status.get("disk")
    if not isinstance(disk, dict):
        return None
    full, free, reserve = disk.get("full"), disk.get("free_bytes"), disk.get("reserve_bytes")
    if type(full) is not bool:
        return None
    if type(free) is not int or type(reserve) is not int:
        return full, 0  # free space unreadable: it may go full, it cannot return
    return full, free - reserve


def _disk_event(state: str, node: str, answer: Answer) -> Event | None:
    """Rule 9: a node reporting its disk full is ``DiskFull`` (from any state but full or
    removed; a down node that answers full is not returned); a ``full`` node returns once it
    reports room, with ``limits.manager_disk_return_margin_bytes`` beyond its reserve."""
    assert answer.status is not None
    disk = _disk(answer.status)
    if disk is None or state == "removed":
        return None
    full, room = disk
    if full and state != "full":
        return DiskFull(node)
    if state == "full" and not full and room >= limits.manager_disk_return_margin_bytes:
        return NodeReturned(node, answer.at_ms, _reports(answer.status))
    return None


def _late_answers(
    view: ManagerView, answers: Mapping[str, Answer], now_ms: int, memory: Memory
) -> dict[str, int]:
    """Nodes that answered a poll late (over ``slow_p99_ms``) or not at all within the last
    ``slow_window_ms``, with when. Such a node is no witness of its neighbours' latency: it
    measures its own stalls too (a paused middle's round trips to its tail include the pause,
    and the bench saw the tail removed as slow in its place, docs/manager.md rule 4)."""
    late = {
        node: at
        for node, at in memory.late_answer_ms.items()
        if now_ms - at <= view.config.slow_window_ms
    }
    for node, answer in answers.items():
        if answer.status is None or answer.elapsed_ms > view.config.slow_p99_ms:
            late[node] = now_ms
    return late


def plan_round(
    view: ManagerView,
    answers: Mapping[str, Answer],
    now_ms: int,
    memory: Memory,
    beats: Mapping[str, int] | None = None,
    incarnations: Mapping[str, str] | None = None,
) -> Plan:
    """One round: ``answers`` holds every node the view knows (status None: no answer);
    ``beats`` the last watch line heard from each node since the last round (its time), which
    counts as the node heard as an answer does; ``incarnations`` the incarnation the leader last
    heard from each node (docs/manager.md, "Evidence and proof of death")."""
    states = {n.id: n.state for n in view.nodes}
    answered = {n for n, a in answers.items() if a.status is not None and n in states}
    times = {n: answers[n].at_ms for n in answered}
    for node, at_ms in (beats or {}).items():
        if node in states:
            times[node] = max(at_ms, times.get(node, at_ms))
    heard = tuple(sorted(times.items()))
    late = _late_answers(view, answers, now_ms, memory)
    seen = tick_incarnations(view, times, incarnations or {})
    events: list[Event] = [TimerTick(now_ms, heard, seen)]
    node_events, fast = _node_events(view, answers, answered, late, memory)
    events += node_events
    events += _takeovers(view, answers)
    done, send_catch_up, sent_catch_up = _catch_ups(view, answers, answered, now_ms, memory)
    events += done
    send_topology, sent_topology = _topology_sends(view, answers, answered, now_ms, memory)
    memory = Memory(frozenset(answered), fast, sent_topology, sent_catch_up, late)
    return Plan(events, send_topology, send_catch_up, memory, _followers_notes(view, answers))


def _node_events(
    view: ManagerView,
    answers: Mapping[str, Answer],
    answered: set[str],
    late: Mapping[str, int],
    memory: Memory,
) -> tuple[list[Event], dict[str, int]]:
    """What each answer tells of its node: a full or freed disk, a down node back, a slow one
    fast again for long enough, latency reports; and the slow nodes' runs of fast answers."""
    states = {n.id: n.state for n in view.nodes}
    in_chain = {m for s in view.shards for m in s.chain}
    events: list[Event] = []
    fast = dict(memory.fast_answers)
    for node in sorted(answered):
        status = answers[node].status
        assert status is not None
        disk_event = _disk_event(states[node], node, answers[node])
        if disk_event is not None:
            events.append(disk_event)
        elif states[node] == "down":
            events.append(NodeReturned(node, answers[node].at_ms, _reports(status)))
        elif states[node] == "slow" and node not in in_chain:
            quick = answers[node].elapsed_ms <= view.config.slow_p99_ms
            fast[node] = fast.get(node, 0) + 1 if quick else 0
            if fast[node] >= limits.manager_slow_return_polls:
                events.append(NodeReturned(node, answers[node].at_ms, _reports(status)))
                fast.pop(node)
        if states[node] == "up" and node not in late:
            events += _latency_events(view, node, status)
    fast = {n: c for n, c in fast.items() if states.get(n) == "slow" and n in answered}
    return events, fast


def _catch_ups(
    view: ManagerView,
    answers: Mapping[str, Answer],
    answered: set[str],
    now_ms: int,
    memory: Memory,
) -> tuple[list[Event], list[CatchUpOrder], dict[tuple[str, int], int]]:
    """Catch-ups: done when close to the tail; ordered again when the node does not act on it.
    Returns the CatchUpDone events, the orders to send and when each live order was last sent."""
    events: list[Event] = []
    send_catch_up: list[CatchUpOrder] = []
    sent_catch_up = dict(memory.sent_catch_up_ms)
    for shard in view.shards:
        tail_entry = _shard_status(
            answers[shard.tail].status if shard.tail in answers else None, shard.id
        )
        tail_seq = durable_seq(tail_entry) if tail_entry is not None else None
        for node in shard.catching_up:
            if node not in answered:
                continue
            # No entry: the node holds no replica of the shard (it closed it on learning that it
            # left the chain, possibly after refusing an order sent while it still was a member).
            entry = _shard_status(answers[node].status, shard.id)
            seq = durable_seq(entry) if entry is not None else None
            order = shard.order_of(node)
            if (
                tail_seq is not None
                and seq is not None
                and order is not None
                and _learning_from(entry, shard.tail)
                and seq >= tail_seq - limits.manager_catchup_done_lag_seqs
                and node in _counted(tail_entry)
            ):
                events.append(CatchUpDone(node, shard.id, order))
                continue
            last = sent_catch_up.get((node, shard.id))
            # A learner of another upstream has not acted on the order either: a move's target
            # still learning from where an earlier, cancelled move sent it (an operator's order
            # goes out only from here; the campaign's move_under_fault found it waiting for good).
            learning = entry is not None and entry.get("role") == "learner"
            if not (learning and entry is not None and entry.get("upstream") == shard.tail) and (
                last is None or now_ms - last >= limits.manager_resend_interval_ms
            ):
                send_catch_up.append(CatchUpOrder(node, shard.id, shard.tail))
                sent_catch_up[(node, shard.id)] = now_ms
    live_orders = {(n, s.id) for s in view.shards for n in s.catching_up}
    sent_catch_up = {k: v for k, v in sent_catch_up.items() if k in live_orders}
    return events, send_catch_up, sent_catch_up


def _topology_sends(
    view: ManagerView,
    answers: Mapping[str, Answer],
    answered: set[str],
    now_ms: int,
    memory: Memory,
) -> tuple[list[str], dict[str, int]]:
    """Topology: to every node behind the view's epoch, and to one that answers again. Returns
    the nodes to send it to and when each was last sent it."""
    send_topology: list[str] = []
    sent_topology = dict(memory.sent_topology_ms)
    for node in sorted(answered):
        status = answers[node].status
        assert status is not None
        epoch = status.get("epoch")
        behind = type(epoch) is int and epoch < view.epoch
        back = node not in memory.answered
        last = sent_topology.get(node)
        recent = last is not None and now_ms - last < limits.manager_resend_interval_ms
        if back or (behind and not recent):
            send_topology.append(node)
            sent_topology[node] = now_ms
    return send_topology, sent_topology


def lease_grants(view: ManagerView, answers: Mapping[str, Answer]) -> list[tuple[str, Any]]:
    """The lease answers of a round whose entry is committed (``view``: the view after it): to
    every node that answered with a ``lease_nonce``, the view's epoch and whether the node is
    still a member of some chain and not down or removed (docs/manager.md, "Head leases"). Sent
    only after the commit, so a leader that lost its majority grants nothing."""
    states = {n.id: n.state for n in view.nodes}
    in_chain = {m for s in view.shards for m in s.chain}
    grants: list[tuple[str, Any]] = []
    for node, answer in sorted(answers.items()):
        nonce = answer.status.get("lease_nonce") if answer.status is not None else None
        if type(nonce) is not int or nonce < 0 or node not in states:
            continue
        member = node in in_chain and states[node] not in ("down", "removed")
        grants.append((node, {"epoch": view.epoch, "nonce": nonce, "member": member}))
    return grants


def node_addresses(view: ManagerView, nodes: Mapping[str, NodeAddr]) -> dict[str, NodeAddr]:
    """The file's node addresses and those of nodes added at runtime (AddNode, in the view)."""
    added = {a.id: NodeAddr(a.id, a.host, a.http_port, a.bin_port) for a in view.added}
    return {**added, **nodes}


def topology_of(
    view: ManagerView, nodes: Mapping[str, NodeAddr], base: Topology | None = None
) -> Topology:
    """The topology the view describes: its epoch and chains, the node addresses (the file's and
    the added nodes', so every node learns a new node's address from the signed topology), the
    file's (``base``) queue shard counts overlaid by the view's, which win (docs/node-api.md,
    "Queues over several shards"), and the file's manager members' URLs (``managers``)."""
    shards = {s.id: ShardChain(s.id, s.chain) for s in view.shards}
    addresses = node_addresses(view, nodes)
    queues = {**(base.queues if base is not None else {}), **dict(view.queues)}
    default = base.queue_shards if base is not None else 1
    # The members' URLs (the file's [managers] tables): where nodes and clients report.
    managers = base.managers if base is not None else ()
    return Topology(
        view.epoch, addresses, shards, queue_shards=default, queues=queues, managers=managers
    )


def signed(identity: ClusterIdentity, purpose: str, body: Any) -> dict[str, Any]:
    return {"body": body, "mac": sign(identity, purpose, body)}


@dataclass(frozen=True, slots=True)
class Sends:
    """What a batch of actions asks to send: the topology to these nodes, these catch-ups."""

    topology_to: list[str]
    catch_ups: list[CatchUpOrder]


def sends_for(view: ManagerView, actions: list[Action] | tuple[Action, ...]) -> Sends:
    """Chain changes and publications send the topology to every node not down or removed;
    catch-up orders go to their node. Pure."""
    topology = any(isinstance(a, SpliceChain | RejoinAsTail | PublishTopology) for a in actions)
    live = [n.id for n in view.nodes if n.state not in ("down", "removed")]
    orders = [
        CatchUpOrder(a.node, a.shard, a.upstream) for a in actions if isinstance(a, StartCatchUp)
    ]
    return Sends(live if topology else [], orders)
