"""The manager's view: the only state its decisions read (docs/manager.md).

Frozen and canonical: nodes sorted by id, shards by id, alerts sorted, so two members that applied
the same events hold equal views, and ``view_hash`` (sha256 of a canonical JSON encoding) is what
members compare to notice a diverged state machine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias, cast

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.manager.events import check_incarnation
from kayos.topology import check_node_id

NodeState: TypeAlias = Literal["up", "suspect", "down", "slow", "full", "removed"]
NODE_STATES: tuple[NodeState, ...] = ("up", "suspect", "down", "slow", "full", "removed")

# Alert kinds (docs/manager.md "Alerts").
BELOW_MIN_REPLICAS = "shard_below_min_replicas"  # a shard's chain is shorter than min_replicas
SLOW_KEPT = "slow_node_kept"  # a slow node stays in a chain: removing it would go below the minimum
NO_LIVE_MEMBER = "shard_no_live_member"  # a shard's only member is down or removed: it cannot serve
DRAIN_BLOCKED = "drain_blocked"  # a draining node's replica has nowhere to go (rule 7)
MEMBER_DISK_FULL = "member_disk_full"  # a shard's member (or departed member) has a full disk (9)
# A shard short of its replication factor past the grace, with no node to restore it on (rule 10).
NOT_RESTORABLE = "shard_not_restorable"
ALERT_KINDS = (
    BELOW_MIN_REPLICAS,
    SLOW_KEPT,
    NO_LIVE_MEMBER,
    DRAIN_BLOCKED,
    MEMBER_DISK_FULL,
    NOT_RESTORABLE,
)

# The view's encoding version: part of the hash, so members of different versions never agree.
# 2: catch-up order numbers (ShardView.orders, ManagerView.orders_issued);
# 3: 2 and pending moves, draining nodes and added nodes' addresses (docs/manager.md, "The view");
# 4: 3 and each queue's shard count set by an operator (``queues``);
# 5: 4 and the node state ``full`` with its alert ``member_disk_full`` (rule 9);
# 6: 5 and each node's incarnation, as last heard (``NodeView.incarnation``; proof of death);
# 7: 6 and redundancy restored by itself (rule 10): the config's ``replace_after_ms`` and
#    ``replication_factor``, each shard's ``short_since`` and ``restoring``.
# An older snapshot still reads: the fields it lacks are empty (see ``from_data``).
VIEW_FORMAT = 7
_FORMATS_READ = (1, 2, 3, 4, 5, 6, 7)


@dataclass(frozen=True, slots=True)
class Config:
    """The bounds that drive the manager's decisions (defaults and reasons in kayos/limits.py).

    - ``detection_window_ms``: silence after which a node is down and spliced out. Shorter removes
      dead nodes faster but removes paused ones that would have come back.
    - ``suspect_after_ms``: silence after which a node is shown as suspect; nothing is removed.
    - ``slow_p99_ms`` / ``slow_window_ms``: a neighbour-reported p99 above the first, over a window
      at least the second, removes a node as slow. Lower bounds remove more nodes for less.
    - ``min_replicas``: below it a shard is alerted, and a slow node is kept (see decide.py).
    - ``replace_after_ms``: how long a shard stays short of ``replication_factor`` before the
      manager copies it to another node (rule 10); 0 never does. Shorter restores redundancy
      sooner but copies whole stores for nodes that were only restarting.
    - ``replication_factor``: the replicas every shard should hold; 0 (the default) is the
      longest chain of the first view.
    """

    detection_window_ms: int = limits.manager_detection_window_ms
    suspect_after_ms: int = limits.manager_suspect_after_ms
    slow_p99_ms: int = limits.manager_slow_p99_ms
    slow_window_ms: int = limits.manager_slow_window_ms
    min_replicas: int = limits.manager_min_replicas_default
    replace_after_ms: int = limits.manager_replace_after_ms
    replication_factor: int = 0

    def validate(self) -> Config:
        """Rejects bounds that cannot work together; returns self so it chains."""
        if self.detection_window_ms <= 0:
            raise InvalidRequest("manager detection_window_ms must be > 0")
        if not 0 < self.suspect_after_ms < self.detection_window_ms:
            raise InvalidRequest("manager suspect_after_ms must be in (0, detection_window_ms)")
        if self.slow_p99_ms <= 0 or self.slow_window_ms <= 0:
            raise InvalidRequest("manager slow_p99_ms and slow_window_ms must be > 0")
        if self.slow_p99_ms >= self.slow_window_ms:
            # A p99 longer than its window is a window with fewer than one sample per p99.
            raise InvalidRequest("manager slow_p99_ms must be < slow_window_ms")
        if self.min_replicas < 1:
            raise InvalidRequest("manager min_replicas must be >= 1")
        if self.replace_after_ms < 0:
            # Counted from when a shard became short (after the window), so any length works.
            raise InvalidRequest("manager replace_after_ms must be >= 0 (0: never)")
        if self.replication_factor < 0:
            raise InvalidRequest("manager replication_factor must be >= 0 (0: the longest chain)")
        return self


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node: its state, when it was last heard (the leader's clock) and the incarnation of
    the process last heard running it ("" when none was heard yet)."""

    id: str
    state: NodeState
    last_heard_ms: int
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class ShardView:
    """One shard: ``chain`` head first; ``epoch`` of its last change; ``departed``: members
    spliced out that may come back; ``catching_up``: returned nodes and move targets copying from
    the tail; ``takeover``: the head's takeover table as last reported; ``moves``: pending moves,
    (target, source) pairs (docs/manager.md rule 7; at most one per shard); ``orders``: (node,
    order number) of the catch-up order each node in ``catching_up`` follows now;
    ``short_since``: the manager's time since when the shard holds fewer replicas than the
    replication factor (None: it does not); ``restoring``: (target, started at) of the
    replacement copying the shard to a new member (rule 10; at most one per shard)."""

    id: int
    chain: tuple[str, ...]
    epoch: int
    departed: tuple[str, ...] = ()
    catching_up: tuple[str, ...] = ()
    takeover: tuple[tuple[bytes, int], ...] = ()
    moves: tuple[tuple[str, str], ...] = ()
    orders: tuple[tuple[str, int], ...] = ()
    short_since: int | None = None
    restoring: tuple[tuple[str, int], ...] = ()

    @property
    def tail(self) -> str:
        return self.chain[-1]

    def order_of(self, node: str) -> int | None:
        """The number of the catch-up order ``node`` follows on this shard (None: none)."""
        for name, order in self.orders:
            if name == node:
                return order
        return None


@dataclass(frozen=True, slots=True, order=True)
class NodeAddress:
    """Where a node added at runtime (AddNode) listens; nodes from the file are addressed there."""

    id: str
    host: str
    http_port: int
    bin_port: int


@dataclass(frozen=True, slots=True, order=True)
class AlertKey:
    kind: str
    shard: int
    node: str = ""


@dataclass(frozen=True, slots=True)
class ManagerView:
    config: Config
    epoch: int
    now_ms: int
    nodes: tuple[NodeView, ...]
    shards: tuple[ShardView, ...]
    alerts: tuple[AlertKey, ...] = field(default=())
    draining: tuple[str, ...] = ()
    added: tuple[NodeAddress, ...] = ()
    orders_issued: int = 0  # catch-up orders numbered so far (the last order's number)
    # Queue shard counts set by ``kayos ctl queue create/alter``, (name, count) sorted by name;
    # published over the topology file's (docs/node-api.md, "Queues over several shards").
    queues: tuple[tuple[str, int], ...] = ()

    @classmethod
    def bootstrap(
        cls,
        config: Config,
        node_ids: Sequence[str],
        chains: Sequence[Sequence[str]],
        *,
        epoch: int = 1,
    ) -> ManagerView:
        """The first view: every node up and heard at 0, shard i's chain ``chains[i]``; a
        replication factor of 0 becomes the longest chain's length."""
        config.validate()
        if not 0 < len(node_ids) <= limits.manager_nodes_max:
            raise InvalidRequest(f"a view holds 1 to {limits.manager_nodes_max} nodes")
        if not 0 < len(chains) <= limits.manager_shards_max:
            raise InvalidRequest(f"a view holds 1 to {limits.manager_shards_max} shards")
        if len(set(node_ids)) != len(node_ids):
            raise InvalidRequest("node ids must be distinct")
        for node_id in node_ids:
            check_node_id(node_id)
        for i, chain in enumerate(chains):
            if not chain or len(set(chain)) != len(chain):
                raise InvalidRequest(f"shard {i}: a chain needs distinct members")
            if not set(chain) <= set(node_ids):
                raise InvalidRequest(f"shard {i}: unknown node in {chain}")
        if epoch < 1:
            raise InvalidRequest("epoch must be >= 1")
        if config.replication_factor == 0:
            config = replace(config, replication_factor=max(len(chain) for chain in chains))
        nodes = tuple(NodeView(n, "up", 0) for n in sorted(node_ids))
        shards = tuple(ShardView(i, tuple(chain), epoch) for i, chain in enumerate(chains))
        view = cls(config, epoch, 0, nodes, shards)
        return replace(view, alerts=derive_alerts(view))

    def node(self, node_id: str) -> NodeView | None:
        for node in self.nodes:
            if node.id == node_id:
                return node
        return None

    def with_node(self, node: NodeView) -> ManagerView:
        return replace(self, nodes=tuple(node if n.id == node.id else n for n in self.nodes))

    def queue_shards(self, queue: str) -> int | None:
        """The shard count an operator set for ``queue``; None when the view holds none."""
        return dict(self.queues).get(queue)

    def shard(self, shard_id: int) -> ShardView | None:
        return self.shards[shard_id] if 0 <= shard_id < len(self.shards) else None

    def with_shard(self, shard: ShardView) -> ManagerView:
        return replace(self, shards=tuple(shard if s.id == shard.id else s for s in self.shards))

    def to_data(self) -> dict[str, Any]:
        """The canonical plain-data form (JSON-able; bytes as hex)."""
        return {
            "format": VIEW_FORMAT,
            "config": {
                "detection_window_ms": self.config.detection_window_ms,
                "suspect_after_ms": self.config.suspect_after_ms,
                "slow_p99_ms": self.config.slow_p99_ms,
                "slow_window_ms": self.config.slow_window_ms,
                "min_replicas": self.config.min_replicas,
                "replace_after_ms": self.config.replace_after_ms,
                "replication_factor": self.config.replication_factor,
            },
            "epoch": self.epoch,
            "now_ms": self.now_ms,
            "nodes": [[n.id, n.state, n.last_heard_ms, n.incarnation] for n in self.nodes],
            "shards": [
                {
                    "id": s.id,
                    "chain": list(s.chain),
                    "epoch": s.epoch,
                    "departed": list(s.departed),
                    "catching_up": list(s.catching_up),
                    "takeover": [[uuid.hex(), seq] for uuid, seq in s.takeover],
                    "moves": [[target, source] for target, source in s.moves],
                    "orders": [[node, order] for node, order in s.orders],
                    "short_since": s.short_since,
                    "restoring": [[node, at] for node, at in s.restoring],
                }
                for s in self.shards
            ],
            "alerts": [[a.kind, a.shard, a.node] for a in self.alerts],
            "draining": list(self.draining),
            "added": [[a.id, a.host, a.http_port, a.bin_port] for a in self.added],
            "orders_issued": self.orders_issued,
            "queues": [[name, count] for name, count in self.queues],
        }

    @classmethod
    def from_data(cls, data: Any) -> ManagerView:
        """The inverse of ``to_data`` (a snapshot a new member starts from). A snapshot of format 1
        or 2 reads with the fields it lacks empty; see ``_numbered`` for its catching-up nodes."""
        try:
            fmt = data["format"]
            if fmt not in _FORMATS_READ:
                raise InvalidRequest(f"manager view format {fmt!r} is not supported")

            def field_of(obj: Any, key: str) -> Any:
                # Format 3 and later hold every field of format 3; an older one may lack any.
                return obj[key] if fmt >= 3 else obj.get(key, [])

            config = Config(**{k: int(v) for k, v in data["config"].items()}).validate()
            nodes = []
            for entry in data["nodes"]:
                if fmt >= 6:
                    node_id, state, heard, incarnation = entry
                    if incarnation:
                        check_incarnation(incarnation)
                else:
                    (node_id, state, heard), incarnation = entry, ""
                if state not in NODE_STATES or (state == "full" and fmt < 5):
                    raise InvalidRequest(f"bad node state {state!r}")
                nodes.append(
                    NodeView(str(node_id), cast(NodeState, state), int(heard), str(incarnation))
                )
            shards = tuple(
                ShardView(
                    int(s["id"]),
                    tuple(str(n) for n in s["chain"]),
                    int(s["epoch"]),
                    tuple(str(n) for n in s["departed"]),
                    tuple(str(n) for n in s["catching_up"]),
                    tuple((bytes.fromhex(u), int(q)) for u, q in s["takeover"]),
                    tuple((str(t), str(f)) for t, f in field_of(s, "moves")),
                    tuple((str(n), int(o)) for n, o in field_of(s, "orders")),
                    *_restore_fields(s, fmt),
                )
                for s in data["shards"]
            )
            if config.replication_factor == 0:
                # Before format 7: every shard was meant to hold what it held at most.
                longest = max(len(s.chain) + len(s.departed) for s in shards)
                config = replace(config, replication_factor=longest)
            alerts = tuple(AlertKey(str(k), int(s), str(n)) for k, s, n in data["alerts"])
            draining = tuple(str(n) for n in field_of(data, "draining"))
            added = tuple(
                NodeAddress(str(i), str(h), int(p), int(q))
                for i, h, p, q in field_of(data, "added")
            )
            issued = data["orders_issued"] if fmt >= 3 else data.get("orders_issued", 0)
            queues = tuple(
                sorted((str(q), int(c)) for q, c in (data["queues"] if fmt >= 4 else []))
            )
            view = cls(
                config,
                int(data["epoch"]),
                int(data["now_ms"]),
                tuple(nodes),
                shards,
                alerts,
                draining,
                added,
                int(issued),
                queues,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"bad manager view: {exc!r}") from exc
        return view if fmt >= 3 else _numbered(view)


def _restore_fields(shard: Any, fmt: int) -> tuple[int | None, tuple[tuple[str, int], ...]]:
    """A shard's ``short_since`` and ``restoring`` (format 7; empty before it)."""
    if fmt < 7:
        return None, ()
    since = shard["short_since"]
    restoring = tuple((str(n), int(at)) for n, at in shard["restoring"])
    return (None if since is None else int(since)), restoring


def new_order(
    view: ManagerView, shard: ShardView, node_id: str
) -> tuple[ManagerView, ShardView, int]:
    """Numbers a new catch-up order of ``node_id`` on ``shard``; it replaces any earlier one, so
    a report answering the earlier order no longer rejoins the node (docs/manager.md)."""
    order = view.orders_issued + 1
    orders = (*(o for o in shard.orders if o[0] != node_id), (node_id, order))
    shard = replace(shard, orders=orders)
    return replace(view, orders_issued=order).with_shard(shard), shard, order


def replicas_of(shard: ShardView) -> int:
    """The replicas a shard will hold once its pending changes are done: its chain and its
    learners (returned members, move targets, replacements), less a pending move's source (it
    leaves once its target joins, and is not a member to come back if it went away meanwhile)."""
    members = {*shard.chain, *shard.catching_up}
    leaving = {s for _, s in shard.moves}
    return len(members - leaving)


def restore_candidates(view: ManagerView, shard: ShardView) -> list[str]:
    """Nodes that may take a new replica of ``shard`` (rule 10): up (not down, suspect, slow or
    full), not draining, holding no replica of it and not copying it; sorted by id."""
    taken = {*shard.chain, *shard.catching_up, *(t for t, _ in shard.moves)}
    return [
        n.id
        for n in view.nodes
        if n.state == "up" and n.id not in view.draining and n.id not in taken
    ]


def restore_due(view: ManagerView, shard: ShardView) -> bool:
    """The shard has been short of its replication factor for the whole grace and no
    replacement runs for it (rule 10)."""
    grace = view.config.replace_after_ms
    if grace == 0 or shard.short_since is None or shard.restoring:
        return False
    return view.now_ms - shard.short_since >= grace


def _numbered(view: ManagerView) -> ManagerView:
    """A format-1 view has no catch-up order numbers: each catching-up node without one gets the
    next number (shard by shard, in ``catching_up`` order, so every member numbers alike), or its
    catch-up could never end (only a ``CatchUpDone`` naming its order rejoins it)."""
    issued = max([view.orders_issued, *(o for s in view.shards for _, o in s.orders)])
    shards = []
    for shard in view.shards:
        orders = list(shard.orders)
        for node in shard.catching_up:
            if shard.order_of(node) is None:
                issued += 1
                orders.append((node, issued))
        shards.append(replace(shard, orders=tuple(orders)))
    return replace(view, shards=tuple(shards), orders_issued=issued)


def canonical_bytes(view: ManagerView) -> bytes:
    """The view encoded with sorted keys and no whitespace: equal views give equal bytes."""
    return json.dumps(view.to_data(), sort_keys=True, separators=(",", ":")).encode()


def view_hash(view: ManagerView) -> str:
    """sha256 (hex) of the canonical encoding; the manager members compare it."""
    return hashlib.sha256(canonical_bytes(view)).hexdigest()


def derive_alerts(view: ManagerView) -> tuple[AlertKey, ...]:
    """The alerts that hold in ``view``: a function of chains and node states only."""
    states = {n.id: n.state for n in view.nodes}
    found: set[AlertKey] = set()
    for shard in view.shards:
        if len(shard.chain) < view.config.min_replicas:
            found.add(AlertKey(BELOW_MIN_REPLICAS, shard.id))
        for member in shard.chain:
            if states.get(member) == "slow":
                found.add(AlertKey(SLOW_KEPT, shard.id, member))
        for member in (*shard.chain, *shard.departed):
            if states.get(member) == "full":
                found.add(AlertKey(MEMBER_DISK_FULL, shard.id, member))
        if len(shard.chain) == 1 and states.get(shard.chain[0]) in ("down", "removed"):
            found.add(AlertKey(NO_LIVE_MEMBER, shard.id, shard.chain[0]))
        leaving = {source for _, source in shard.moves}
        for member in shard.chain:
            if member in view.draining and member not in leaving:
                found.add(AlertKey(DRAIN_BLOCKED, shard.id, member))
        if restore_due(view, shard) and not restore_candidates(view, shard):
            found.add(AlertKey(NOT_RESTORABLE, shard.id))
    return tuple(sorted(found))
