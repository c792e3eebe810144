"""``decide(view, event) -> (view, actions)``: every decision the manager makes (docs/manager.md).

Each event first updates node states and shard records; then one reconcile step makes the chains
agree with the node states as far as the rules allow; then alerts are derived from the result and
the actions are read off the difference between the old and the new view. So the same view and
event always give the same outcome, and a member that restarts from a snapshot of the view
decides exactly as the one before it.

Rules (the reasons are in docs/manager.md):
- a node silent for ``detection_window_ms`` is down, and so at once is a node the leader has proof
  is gone (NodeGone), unless the proof names an incarnation other than the one the view holds (a
  restarted node is not spliced out for its predecessor's death); an operator-removed node is
  removed: both are spliced out of every chain (head: the next member leads; middle: its
  neighbours are linked; tail: the previous member is the tail), except that a shard's last
  member is never spliced out;
- a node whose neighbour reports a p99 above ``slow_p99_ms`` over at least ``slow_window_ms`` is
  slow and spliced out the same way, unless that would leave the shard with fewer than
  ``min_replicas`` members: then it stays, with a ``slow_node_kept`` alert;
- a node that reports its disk full is ``full``: it leaves every chain where it is not the head and
  the head is not full, like a down node (even below ``min_replicas``: a member that cannot commit
  holds every acks=all write up); it stays head where it leads, and stays below a full head (a full
  head refuses writes with disk_full itself, so nothing stalls); ``member_disk_full`` alerts say
  so; it returns like a down node once it reports room;
- a shard shorter than ``min_replicas`` carries a ``shard_below_min_replicas`` alert;
- a down or slow node that returns catches up from each departed shard's tail (rolling back first
  if its takeover table diverged from the head's), then rejoins as tail;
- an operator's move sends the target to catch up from the tail; on CatchUpDone it joins as tail,
  and on the next event the source leaves (so the move never shortens a chain); a drain is a move
  of each of the node's replicas; a rebalance is the moves ``plan_rebalance`` plans;
- an operator's queue shard count (SetQueueShards) is recorded if it is above the view's for the
  queue and at most the shard count, else ignored;
- a shard short of its replication factor for ``replace_after_ms`` is copied to a node holding
  no replica of it (up, not draining, the least loaded), at most ``limits.manager_restores_max``
  at once; on CatchUpDone it joins as tail, and the members it replaced are forgotten (they come
  back as spares);
- any change of chains, a node added, or a queue's shard count changed raises the epoch by one
  and publishes the topology; the changed shards carry the new epoch.
"""

from __future__ import annotations

from dataclasses import replace

from kayos import limits
from kayos.manager.events import (
    Action,
    AddNode,
    Alert,
    CatchUpDone,
    ClearAlert,
    DiskFull,
    Drain,
    Event,
    HeadTookOver,
    Heartbeat,
    LatencyReport,
    ManagerLeaderChanged,
    MoveReplica,
    NodeGone,
    NodeReturned,
    PublishTopology,
    Rebalance,
    RejoinAsTail,
    RemoveNode,
    SetQueueShards,
    ShardReport,
    SpliceChain,
    StartCatchUp,
    TimerTick,
)
from kayos.manager.placement import drain_target, plan_rebalance
from kayos.manager.restore import make_room, rebase, restore_redundancy
from kayos.manager.view import (
    ManagerView,
    NodeAddress,
    NodeView,
    ShardView,
    derive_alerts,
    new_order,
)
from kayos.replication.logic.chain import rollback_point, with_takeover


def decide(view: ManagerView, event: Event) -> tuple[ManagerView, list[Action]]:
    """The view after ``event`` and the actions that carry the change to nodes and clients."""
    if isinstance(event, ManagerLeaderChanged):
        return _leader_changed(view, event)
    node_actions: list[Action] = []
    new = _complete_moves(view)
    new = _apply(new, event, node_actions)
    new = _reconcile(new)
    new = _drive_drains(new, node_actions)
    reports = event.reports if isinstance(event, NodeReturned) else ()
    new = _start_catch_ups(new, {r.shard: r for r in reports}, node_actions)
    new = restore_redundancy(new, node_actions)
    return _finish(view, new, node_actions)


# --- per-event state changes ---------------------------------------------------------------------


def _apply(view: ManagerView, event: Event, out: list[Action]) -> ManagerView:
    if isinstance(event, Heartbeat):
        return _heard(view, event.node, event.at_ms)
    if isinstance(event, TimerTick):
        view = _incarnations(view, event.incarnations)
        return _tick(_heard_all(view, event.heard, event.now_ms))
    if isinstance(event, NodeGone):
        return _gone(view, event)
    if isinstance(event, LatencyReport):
        return _latency(view, event)
    if isinstance(event, HeadTookOver):
        shard = view.shard(event.shard)
        if shard is None or shard.chain[0] != event.node:
            return view  # a stale report from a node that is no longer head: ignored
        if shard.takeover and shard.takeover[-1] == (event.master_id, event.seq):
            return view
        table = with_takeover(list(shard.takeover), event.master_id, event.seq)
        return view.with_shard(replace(shard, takeover=tuple(table)))
    if isinstance(event, NodeReturned):
        return _give_way(_returned(view, event), event)
    if isinstance(event, CatchUpDone):
        return _catch_up_done(view, event, out)
    if isinstance(event, DiskFull):
        node = view.node(event.node)
        if node is None or node.state in ("full", "removed"):
            return view
        return view.with_node(replace(node, state="full"))
    if isinstance(event, RemoveNode):
        node = view.node(event.node)
        if node is None or node.state == "removed":
            return view
        return view.with_node(replace(node, state="removed"))
    if isinstance(event, AddNode):
        return _add_node(view, event)
    if isinstance(event, MoveReplica):
        return _start_move(view, event.shard, event.source, event.target, out)
    if isinstance(event, Drain):
        node = view.node(event.node)
        if node is None or node.state == "removed" or node.id in view.draining:
            return view
        return replace(view, draining=tuple(sorted((*view.draining, node.id))))
    if isinstance(event, Rebalance):
        for shard_id, source, target in plan_rebalance(view):
            view = _start_move(view, shard_id, source, target, out)
        return view
    if isinstance(event, SetQueueShards):
        return _set_queue_shards(view, event)
    return view


def _set_queue_shards(view: ManagerView, event: SetQueueShards) -> ManagerView:
    """Records the queue's new shard count; one below the view's or above the shard count is
    ignored (never fewer shards: their entries and marks would be read by no one)."""
    current = view.queue_shards(event.queue)
    if event.shards > len(view.shards) or (current is not None and event.shards <= current):
        return view
    queues = dict(view.queues)
    queues[event.queue] = event.shards
    return replace(view, queues=tuple(sorted(queues.items())))


# --- adding capacity and moving replicas (docs/manager.md rule 7) ---------------------------------


def _add_node(view: ManagerView, event: AddNode) -> ManagerView:
    if view.node(event.node) is not None or len(view.nodes) >= limits.manager_nodes_max:
        return view  # known (added twice, or in the file), or the table is full
    nodes = tuple(sorted((*view.nodes, NodeView(event.node, "up", view.now_ms)), key=_by_id))
    address = NodeAddress(event.node, event.host, event.http_port, event.bin_port)
    return replace(view, nodes=nodes, added=tuple(sorted((*view.added, address))))


def _by_id(node: NodeView) -> str:
    return node.id


def _start_move(
    view: ManagerView, shard_id: int, source: str, target: str, out: list[Action]
) -> ManagerView:
    """Records the move and sends the target to catch up from the tail, if the move is possible;
    otherwise changes nothing (a refused move is not an error in the log: it may be stale)."""
    shard = view.shard(shard_id)
    node = view.node(target)
    if shard is None or node is None or shard.moves or source not in shard.chain:
        return view
    if node.state != "up" or target in view.draining:
        return view
    if target in shard.chain or target in shard.catching_up:
        return view
    # The target is sent like any catch-up, with an order number its CatchUpDone must name.
    view, shard, order = new_order(view, shard, target)
    shard = replace(
        shard,
        moves=((target, source),),
        catching_up=(*shard.catching_up, target),
        departed=tuple(n for n in shard.departed if n != target),
    )
    out.append(StartCatchUp(target, shard.id, shard.tail, None, order))
    return view.with_shard(shard)


def _complete_moves(view: ManagerView) -> ManagerView:
    """A move whose target joined the chain by an earlier event is finished now: the source leaves
    (unless it is the last member, which cannot happen while the target is in the chain) and is
    no longer a departed member that could come back, nor one catching up."""
    for shard in view.shards:
        if not shard.moves:
            continue
        target, source = shard.moves[0]
        if target not in shard.chain:
            continue
        chain = tuple(n for n in shard.chain if n != source) or shard.chain
        if _keeps_source(view, shard, source, chain):
            # The move ends as an addition, and departed members away make room, as for a
            # replacement (rule 10).
            view = view.with_shard(make_room(view, replace(shard, moves=())))
            continue
        # The source leaves for good: not a departed member, nor one catching up to come back
        # (it may have gone down and returned during the move).
        shard = replace(
            shard,
            chain=chain,
            departed=tuple(n for n in shard.departed if n != source),
            catching_up=tuple(n for n in shard.catching_up if n != source),
            orders=tuple(o for o in shard.orders if o[0] != source),
            moves=(),
        )
        view = view.with_shard(shard)
    return view


def _keeps_source(view: ManagerView, shard: ShardView, source: str, rest: tuple[str, ...]) -> bool:
    """Rule 7 under rule 10: a finished move whose source's leaving would take the shard below
    the replication factor keeps the source (the move ends as an addition), unless the source is
    draining. Else rule 10 would copy the shard straight back to the node that just left it."""
    if view.config.replace_after_ms <= 0 or source in view.draining or rest == shard.chain:
        return False
    learners = set(shard.catching_up) - set(rest) - {source}
    return len(rest) + len(learners) < view.config.replication_factor


def _drive_drains(view: ManagerView, out: list[Action]) -> ManagerView:
    """Every shard holding a draining node, with no move pending, starts moving that replica to
    the node ``drain_target`` picks; with none to pick it stays (alert ``drain_blocked``)."""
    for node_id in view.draining:
        node = view.node(node_id)
        if node is None or node.state == "removed":
            continue
        for shard in view.shards:
            if node_id not in shard.chain or shard.moves:
                continue
            target = drain_target(view, shard.id)
            if target is not None:
                view = _start_move(view, shard.id, node_id, target, out)
    return view


def _heard(view: ManagerView, node_id: str, at_ms: int) -> ManagerView:
    """A heartbeat: a suspect node is up again; a down, slow or removed one stays so until it
    says it is back (NodeReturned), since it has to catch up first."""
    node = view.node(node_id)
    if node is None:
        return view
    state = "up" if node.state == "suspect" else node.state
    view = replace(view, now_ms=max(view.now_ms, at_ms))
    return view.with_node(replace(node, state=state, last_heard_ms=max(node.last_heard_ms, at_ms)))


def _heard_all(view: ManagerView, heard: tuple[tuple[str, int], ...], now_ms: int) -> ManagerView:
    """A tick's heartbeats, as ``_heard`` one by one, in one pass over the nodes."""
    latest: dict[str, int] = {}
    for node_id, at_ms in heard:
        latest[node_id] = max(at_ms, latest.get(node_id, at_ms))
    nodes = tuple(
        replace(
            n,
            state="up" if n.state == "suspect" else n.state,
            last_heard_ms=max(n.last_heard_ms, latest[n.id]),
        )
        if n.id in latest
        else n
        for n in view.nodes
    )
    ids = {n.id for n in view.nodes}
    known = [at for node_id, at in latest.items() if node_id in ids]
    return replace(view, nodes=nodes, now_ms=max([view.now_ms, now_ms, *known]))


def _incarnations(view: ManagerView, seen: tuple[tuple[str, str], ...]) -> ManagerView:
    """Records the incarnation each node was heard running (the last one named wins)."""
    latest = dict(seen)
    if not latest:
        return view
    nodes = tuple(replace(n, incarnation=latest[n.id]) if n.id in latest else n for n in view.nodes)
    return replace(view, nodes=nodes)


def _gone(view: ManagerView, event: NodeGone) -> ManagerView:
    """Proof of death: the node is down at once (rule 2 splices it out), unless the proof names
    an incarnation other than the one the view holds (a stale report: that process is not the
    one running now), or the node is down or removed already."""
    node = view.node(event.node)
    if node is None or node.state in ("down", "removed"):
        return view
    if node.incarnation and event.incarnation and node.incarnation != event.incarnation:
        return view
    view = replace(view, now_ms=max(view.now_ms, event.at_ms))
    return view.with_node(replace(node, state="down"))


def _tick(view: ManagerView) -> ManagerView:
    config = view.config
    for node in view.nodes:
        if node.state not in ("up", "suspect", "slow", "full"):
            continue
        silence = view.now_ms - node.last_heard_ms
        if silence >= config.detection_window_ms:
            view = view.with_node(replace(node, state="down"))
        elif silence >= config.suspect_after_ms and node.state == "up":
            view = view.with_node(replace(node, state="suspect"))
    return view


def _neighbours(view: ManagerView, a: str, b: str) -> bool:
    for shard in view.shards:
        if (
            a in shard.chain
            and b in shard.chain
            and abs(shard.chain.index(a) - shard.chain.index(b)) == 1
        ):
            return True
    return False


def _latency(view: ManagerView, event: LatencyReport) -> ManagerView:
    node = view.node(event.node)
    reporter = view.node(event.reporter)
    if node is None or reporter is None or reporter.state != "up" or node.id == reporter.id:
        return view  # only a live neighbour's measurement counts
    if not _neighbours(view, reporter.id, node.id):
        return view
    if event.window_ms < view.config.slow_window_ms:
        return view  # too few samples for a p99 to mean anything
    slow = event.p99_ms > view.config.slow_p99_ms
    if slow and node.state in ("up", "suspect"):
        return view.with_node(replace(node, state="slow"))
    if not slow and node.state == "slow" and any(node.id in s.chain for s in view.shards):
        return view.with_node(replace(node, state="up"))  # a kept slow node recovered
    return view


def _returned(view: ManagerView, event: NodeReturned) -> ManagerView:
    """The node is up again; ``_start_catch_ups`` then sends it to every shard it departed."""
    node = view.node(event.node)
    if node is None or node.state == "removed":
        return view  # an operator removed it: only an operator brings it back
    view = replace(view, now_ms=max(view.now_ms, event.at_ms))
    heard = max(node.last_heard_ms, event.at_ms)
    return view.with_node(replace(node, state="up", last_heard_ms=heard))


def _give_way(view: ManagerView, event: NodeReturned) -> ManagerView:
    """Rule 3: a chain's only member that returns with a copy sharing no takeover entry with the
    view's table (its store was lost: empty, or a history of its own) gives way to the departed
    member spliced out last, which holds the shard's history; it is then departed itself and
    catches up from that member (``_start_catch_ups``)."""
    node = view.node(event.node)
    if node is None or node.state != "up":
        return view
    states = {n.id: n.state for n in view.nodes}
    for report in event.reports:
        shard = view.shard(report.shard)
        if shard is None or shard.chain != (node.id,) or not shard.takeover:
            continue
        if set(report.takeover) & set(shard.takeover):
            continue  # the same history, perhaps a prefix of it: rule 5 and the links do the rest
        holders = [n for n in reversed(shard.departed) if states.get(n, "removed") != "removed"]
        if not holders:
            continue  # nothing else can come back: the returning copy is all there is
        holder = holders[0]
        departed = [n for n in shard.departed if n != holder]
        view = view.with_shard(
            replace(
                shard,
                chain=(holder,),
                departed=(*departed, node.id),
                catching_up=tuple(n for n in shard.catching_up if n != holder),
                orders=tuple(o for o in shard.orders if o[0] != holder),
            )
        )
    return view


def _start_catch_ups(
    view: ManagerView, reports: dict[int, ShardReport], out: list[Action]
) -> ManagerView:
    """Every up node that departed a shard (and is not in its chain) catches up from its tail:
    a node that returned, or a kept slow node that recovered while departed from other shards."""
    states = {node.id: node.state for node in view.nodes}
    for shard in view.shards:
        for node_id in shard.departed:
            if states[node_id] != "up" or node_id in shard.catching_up or node_id in shard.chain:
                continue
            rollback = _rollback_to(shard, reports.get(shard.id))
            view, shard, order = new_order(view, shard, node_id)
            shard = replace(shard, catching_up=(*shard.catching_up, node_id))
            view = view.with_shard(shard)
            out.append(StartCatchUp(node_id, shard.id, shard.tail, rollback, order))
    return view


def _rollback_to(shard: ShardView, report: ShardReport | None) -> int | None:
    """Where the returning copy must roll back to, from the takeover tables (chain.py's rule).

    The manager does not know the upstream's last seq, so it passes the returning node's own: a
    copy that is a prefix of the head's history needs no rollback either way, and the link
    handshake compares the real ends again."""
    if report is None or not shard.takeover:
        return None
    return rollback_point(
        list(report.takeover), list(shard.takeover), report.last_seq, report.last_seq
    )


def _catch_up_done(view: ManagerView, event: CatchUpDone, out: list[Action]) -> ManagerView:
    shard = view.shard(event.shard)
    node = view.node(event.node)
    if shard is None or node is None or event.node not in shard.catching_up:
        return view
    if node.state != "up":
        return view  # it went away again while catching up; reconcile drops it
    if shard.order_of(node.id) != event.order:
        # A late report of an earlier order: the node has since been ordered again (to another
        # upstream, or to roll back first after it returned again) and has not done that yet.
        return view
    shard = replace(
        shard,
        chain=(*shard.chain, node.id),
        catching_up=tuple(n for n in shard.catching_up if n != node.id),
        departed=tuple(n for n in shard.departed if n != node.id),
        orders=tuple(o for o in shard.orders if o[0] != node.id),
    )
    out.append(RejoinAsTail(node.id, shard.id, view.epoch + 1))
    return view.with_shard(shard)


# --- reconcile: chains follow node states --------------------------------------------------------


def _reconcile(view: ManagerView) -> ManagerView:
    states = {node.id: node.state for node in view.nodes}
    shards = []
    for shard in view.shards:
        chain = list(shard.chain)
        departed = list(shard.departed)
        for member in list(chain):
            state = states[member]
            if state == "slow" and _staying(chain, shard.moves, member) < view.config.min_replicas:
                continue  # kept: slow is better than under the minimum (docs/manager.md)
            # Rule 9: a full member leaves a chain whose head takes writes (it would stall them);
            # under a full head, which refuses writes itself, it stays (it would only lose a copy).
            full_below_head = state == "full" and chain[0] != member and states[chain[0]] != "full"
            if (state in ("down", "slow", "removed") or full_below_head) and len(chain) > 1:
                chain.remove(member)
                if state != "removed" and member not in departed:
                    departed.append(member)
        catching_up = tuple(n for n in shard.catching_up if states[n] == "up")
        moves = shard.moves
        if moves and moves[0][0] not in chain and moves[0][0] not in catching_up:
            # The target went away: the move is cancelled, the source stays, and the target is
            # not a member that should come back to this shard.
            departed = [n for n in departed if n != moves[0][0]]
            moves = ()
        departed = [n for n in departed if states[n] != "removed"]
        orders = tuple(o for o in shard.orders if o[0] in catching_up)
        shards.append(
            replace(
                shard,
                chain=tuple(chain),
                departed=tuple(departed),
                catching_up=catching_up,
                moves=moves,
                orders=orders,
            )
        )
    return replace(view, shards=tuple(shards))


def _staying(chain: list[str], moves: tuple[tuple[str, str], ...], leaving: str) -> int:
    """How many members stay in ``chain`` if ``leaving`` goes: a move's source whose target has
    joined is leaving anyway, so it does not count (a slow node is kept rather than let the
    move's end take the shard below the minimum)."""
    extra = bool(moves) and moves[0][0] in chain and moves[0][1] in chain
    if extra and leaving == moves[0][1]:
        return len(chain) - 1
    return len(chain) - 1 - int(extra)


# --- actions from the difference -----------------------------------------------------------------


def _finish(
    old: ManagerView, new: ManagerView, node_actions: list[Action]
) -> tuple[ManagerView, list[Action]]:
    epoch = old.epoch + 1
    changed = [
        s for s, before in zip(new.shards, old.shards, strict=True) if s.chain != before.chain
    ]
    # A node added at runtime changes the topology too (its address): every node must learn it
    # before a move can link to it, and nodes take only a topology of a higher epoch. So does a
    # queue's shard count.
    republish = bool(changed) or new.added != old.added or new.queues != old.queues
    if republish:
        ids = {s.id for s in changed}
        new = replace(
            new,
            epoch=epoch,
            shards=tuple(replace(s, epoch=epoch) if s.id in ids else s for s in new.shards),
        )
    actions: list[Action] = [SpliceChain(s.id, s.chain, epoch) for s in changed]
    actions += node_actions
    started = {(a.node, a.shard) for a in node_actions if isinstance(a, StartCatchUp)}
    for before in old.shards:
        shard = new.shards[before.id]
        if shard.tail != before.tail:
            for node in shard.catching_up:
                if (node, shard.id) not in started:
                    # A new upstream: a new order, so the copy from the old tail cannot end it.
                    new, shard, order = new_order(new, shard, node)
                    actions.append(StartCatchUp(node, shard.id, shard.tail, None, order))
    alerts = derive_alerts(new)
    raised, cleared = set(alerts) - set(old.alerts), set(old.alerts) - set(alerts)
    actions += [Alert(a.kind, a.shard, a.node) for a in sorted(raised)]
    actions += [ClearAlert(a.kind, a.shard, a.node) for a in sorted(cleared)]
    if republish:
        actions.append(PublishTopology(epoch))
    return replace(new, alerts=alerts), actions


def _leader_changed(
    view: ManagerView, event: ManagerLeaderChanged
) -> tuple[ManagerView, list[Action]]:
    """A new leader holds no state but the view. Its clock is not the old leader's, so every time
    in the view is rebased onto it: each node counts as last heard at ``at_ms``, which also gives
    every live node a full detection window (the new leader has heard no heartbeat yet). It sends
    the current chains and pending catch-ups again, since the old leader may have died between
    committing a change and sending it (nodes ignore an epoch they already hold)."""
    at = event.at_ms
    nodes = tuple(
        replace(n, state="up" if n.state == "suspect" else n.state, last_heard_ms=at)
        for n in view.nodes
    )
    view = replace(rebase(view, at), now_ms=at, nodes=nodes)
    actions: list[Action] = [SpliceChain(s.id, s.chain, s.epoch) for s in view.shards]
    actions += [
        StartCatchUp(node, s.id, s.tail, None, s.order_of(node) or 0)
        for s in view.shards
        for node in s.catching_up
    ]
    # Suspect nodes are up again: a shard with no node to restore it on may have one now.
    alerts = derive_alerts(view)
    actions += [Alert(a.kind, a.shard, a.node) for a in sorted(set(alerts) - set(view.alerts))]
    actions += [ClearAlert(a.kind, a.shard, a.node) for a in sorted(set(view.alerts) - set(alerts))]
    actions.append(PublishTopology(view.epoch))
    return replace(view, alerts=alerts), actions
