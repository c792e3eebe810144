"""Where replicas go: pure placement functions over the manager's view (docs/manager.md rule 7).

``drain_target`` picks the node a draining node's replica moves to; ``restore_target`` the node
a short shard is copied to (rule 10); ``plan_rebalance`` plans the
moves that spread replicas evenly. Both read only the view and break ties by id, so every manager
member computes the same answer.
"""

from __future__ import annotations

from kayos.manager.view import ManagerView, restore_candidates


def eligible_nodes(view: ManagerView) -> list[str]:
    """Nodes that may receive a replica: up and not draining, sorted by id."""
    return [n.id for n in view.nodes if n.state == "up" and n.id not in view.draining]


def replica_counts(view: ManagerView) -> dict[str, int]:
    """Replicas each eligible node holds or is about to hold (a pending move's or replacement's
    target counts, a move's source does not), so plans made while moves run do not pile onto
    one node."""
    counts = dict.fromkeys(eligible_nodes(view), 0)
    for shard in view.shards:
        leaving = {source for _, source in shard.moves}
        # A replacement's target (rule 10) counts from its start, like a move's.
        restoring = [t for t, _ in shard.restoring if t not in shard.chain]
        for member in (*shard.chain, *(target for target, _ in shard.moves), *restoring):
            if member in counts and member not in leaving:
                counts[member] += 1
    return counts


def head_counts(view: ManagerView) -> dict[str, int]:
    counts: dict[str, int] = {}
    for shard in view.shards:
        counts[shard.chain[0]] = counts.get(shard.chain[0], 0) + 1
    return counts


def drain_target(view: ManagerView, shard_id: int) -> str | None:
    """The eligible node outside the shard's chain (and not already its move target) holding the
    fewest replicas, then the fewest heads, then the lowest id; None if there is none."""
    shard = view.shard(shard_id)
    if shard is None:
        return None
    taken = {*shard.chain, *(target for target, _ in shard.moves), *shard.catching_up}
    counts, heads = replica_counts(view), head_counts(view)
    candidates = [n for n in counts if n not in taken]
    if not candidates:
        return None
    return min(candidates, key=lambda n: (counts[n], heads.get(n, 0), n))


def restore_target(view: ManagerView, shard_id: int) -> str | None:
    """The node a short shard is copied to (docs/manager.md rule 10): among
    ``restore_candidates`` (up, not draining, holding no replica of the shard), the one holding
    the fewest replicas (a spare first), then the fewest heads, then the lowest id."""
    shard = view.shard(shard_id)
    if shard is None:
        return None
    candidates = restore_candidates(view, shard)
    if not candidates:
        return None
    counts, heads = replica_counts(view), head_counts(view)
    return min(candidates, key=lambda n: (counts.get(n, 0), heads.get(n, 0), n))


def plan_rebalance(view: ManagerView) -> list[tuple[int, str, str]]:
    """(shard, source, target) moves that leave every eligible node within one replica of every
    other. Shards with a pending move are left alone. Among the shards the loaded node could give,
    one it leads is preferred while it leads more than its share, so heads spread with replicas.
    Bounded: each planned move lowers the spread, and at most one move per shard is planned."""
    counts = replica_counts(view)
    if len(counts) < 2:
        return []
    heads = {n: c for n, c in head_counts(view).items() if n in counts}
    fair_heads = -(-len(view.shards) // len(counts))
    planned: set[int] = set()
    moves: list[tuple[int, str, str]] = []
    for _ in range(sum(len(s.chain) for s in view.shards)):
        low = min(counts, key=lambda n: (counts[n], n))
        high = max(counts, key=lambda n: (counts[n], -_order(counts, n)))
        if counts[high] - counts[low] < 2:
            break
        choices = [
            s
            for s in view.shards
            if s.id not in planned
            and not s.moves
            and high in s.chain
            and low not in s.chain
            and low not in s.catching_up
        ]
        if not choices:
            break
        leads = heads.get(high, 0) > fair_heads
        shard = min(choices, key=lambda s: (not (leads and s.chain[0] == high), s.id))
        moves.append((shard.id, high, low))
        planned.add(shard.id)
        counts[high] -= 1
        counts[low] += 1
        if shard.chain[0] == high:
            heads[high] -= 1
            successor = shard.chain[1] if len(shard.chain) > 1 else low
            heads[successor] = heads.get(successor, 0) + 1
    return moves


def _order(counts: dict[str, int], node: str) -> int:
    """The node's position by id, so ties among the most loaded go to the lowest id."""
    return sorted(counts).index(node)
