"""The capacity model of ``kayos bench scale`` (docs/performance.md, "Scale-out on capped
nodes"), pure: no process, clock or file.

A message produced at acks=all costs CPU on every member of its shard's chain: one head, N-2
middles and one tail at replication factor N (``RoleCosts``, CPU seconds per message). A host
carrying a share of several chains spends, per message the cluster commits, the sum of its
roles' costs weighted by the share of messages each of its chains takes (``host_loads``); a
cluster's throughput is bound by its busiest host: ``cores / load`` of the host with the
largest load (``predict_msgs_per_s``). With rotated shards (every host carries every role
equally) that is ``H x C / (head + (N-2) x middle + tail)`` (``capacity_msgs_per_s``).

``attribute`` goes the other way: from each node's CPU seconds over a timed window and the
messages each shard committed in it, each node's CPU seconds per message and, for nodes that
carry one role only, the cost of that role.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLES = ("head", "middle", "tail")


@dataclass(frozen=True, slots=True)
class RoleCosts:
    """CPU seconds one message costs a chain member in each role."""

    head: float
    middle: float
    tail: float

    def __post_init__(self) -> None:
        if min(self.head, self.middle, self.tail) <= 0:
            raise ValueError("every role's CPU seconds per message must be > 0")

    def of(self, role: str) -> float:
        if role not in ROLES:
            raise ValueError(f"no role {role!r} (head, middle, tail)")
        return float(getattr(self, role))

    def per_message(self, replication: int) -> float:
        """CPU seconds one message costs its whole chain of ``replication`` members."""
        return self.head + max(0, replication - 2) * self.middle + self.tail


def role_at(position: int, length: int) -> str:
    """The role of the member at ``position`` (0: head) of a chain of ``length``; a chain of one
    is its own head and tail, counted as its head."""
    if not 0 <= position < length:
        raise ValueError(f"position {position} is outside a chain of {length}")
    if position == 0:
        return "head"
    return "tail" if position == length - 1 else "middle"


def roles_by_node(chains: Sequence[Sequence[str]]) -> dict[str, list[tuple[int, str]]]:
    """Each node's (chain index, role) pairs over ``chains`` (each a chain, head first)."""
    found: dict[str, list[tuple[int, str]]] = {}
    for index, chain in enumerate(chains):
        for position, node in enumerate(chain):
            found.setdefault(node, []).append((index, role_at(position, len(chain))))
    return found


def host_loads(
    chains: Sequence[Sequence[str]], costs: RoleCosts, shares: Sequence[float] | None = None
) -> dict[str, float]:
    """CPU seconds each host spends per message the whole queue commits, when chain i takes
    ``shares[i]`` of the messages (even shares by default)."""
    if not chains:
        raise ValueError("a queue needs at least one chain")
    weights = list(shares) if shares is not None else [1 / len(chains)] * len(chains)
    if len(weights) != len(chains) or abs(sum(weights) - 1) > 1e-9 or min(weights) < 0:
        raise ValueError("one share per chain, none negative, summing to 1")
    loads: dict[str, float] = {}
    for node, roles in roles_by_node(chains).items():
        loads[node] = sum(weights[index] * costs.of(role) for index, role in roles)
    return loads


def predict_msgs_per_s(
    chains: Sequence[Sequence[str]], costs: RoleCosts, cores: float | Mapping[str, float]
) -> float:
    """Messages per second of a queue over ``chains`` on hosts of ``cores`` each (or per host):
    the busiest host's cores over its load per message."""
    loads = host_loads(chains, costs)

    def of(node: str) -> float:
        return cores[node] if isinstance(cores, Mapping) else cores

    return min(of(node) / load for node, load in loads.items())


def capacity_msgs_per_s(hosts: int, cores: float, replication: int, costs: RoleCosts) -> float:
    """Messages per second of ``hosts`` hosts of ``cores`` cores at replication factor
    ``replication`` with rotated shards (a multiple of ``hosts`` of them, so every host carries
    every role alike): ``hosts x cores / (head + (N-2) x middle + tail)``."""
    if hosts < 1 or cores <= 0 or not 1 <= replication <= hosts:
        raise ValueError("hosts >= 1, cores > 0 and 1 <= replication <= hosts")
    return hosts * cores / costs.per_message(replication)


def attribute(
    chains: Sequence[Sequence[str]],
    cpu_seconds: Mapping[str, float],
    committed: Sequence[int],
) -> dict[str, Any]:
    """Each node's CPU seconds per message of the chains it carries (``nodes``), and each
    role's (``roles``: the mean over the nodes that carry that role alone). ``cpu_seconds``
    holds every node measured; one with no place in ``chains`` is ``idle``, one with several
    roles is attributed to none (its ``roles`` say which it carried)."""
    if len(committed) != len(chains):
        raise ValueError("one committed count per chain")
    placed = roles_by_node(chains)
    nodes: dict[str, dict[str, Any]] = {}
    sole: dict[str, list[float]] = {role: [] for role in ROLES}
    for node, seconds in sorted(cpu_seconds.items()):
        roles = placed.get(node, [])
        messages = sum(committed[index] for index, _role in roles)
        per_message = seconds / messages if messages else None
        kinds = sorted({role for _index, role in roles}, key=ROLES.index)
        nodes[node] = {
            "roles": "+".join(kinds) if kinds else "idle",
            "cpu_seconds": round(seconds, 3),
            "messages": messages,
            "cpu_s_per_msg": per_message,
        }
        if len(kinds) == 1 and per_message is not None:
            sole[kinds[0]].append(per_message)
    roles_out = {role: sum(values) / len(values) for role, values in sole.items() if values}
    return {"nodes": nodes, "roles": roles_out}
