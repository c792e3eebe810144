"""What a node reports about itself: the ``GET /status`` document (docs/node-api.md, "Status").

``Node.status`` answers with ``node_status``; ``kayos.node.http.metrics`` also reads each
replica's ``link_status``. They are apart from ``kayos.node.runtime`` because they only
read: the node's replicas, learners and drivers in, a JSON-ready dict out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from kayos.node.replicas.learners import learner_status
from kayos.node.retention import disk_status
from kayos.replication.link.liveness import Direction, LinkHealth
from kayos.replication.logic.latency import LatencyWindow
from kayos.replication.logic.latency import summary as latency_summary

if TYPE_CHECKING:
    from kayos.clock import Clock
    from kayos.node.replicas.learners import Learner
    from kayos.node.replicas.reconfigure import Reconfigurer
    from kayos.node.retention import RetentionDriver
    from kayos.replication.logic.lease import NodeLease
    from kayos.replication.shard.replica import ShardReplica


class Node(Protocol):
    """What the report reads of ``kayos.node.runtime.Node`` (which imports this module)."""

    node_id: str
    incarnation: str
    data_dir: str
    ready: bool
    insecure: bool
    clock: Clock
    lease: NodeLease
    replicas: dict[int, ShardReplica]
    learners: dict[int, Learner]
    reconfigure: Reconfigurer
    retention: RetentionDriver

    @property
    def epoch(self) -> int: ...


def node_status(node: Node) -> dict[str, Any]:
    """The node's ``GET /status`` document: who it is, its lease, disk and neighbours, and
    each shard it holds, as a member of its chain or as a learner."""
    return {
        "node": node.node_id,
        "incarnation": node.incarnation,
        "epoch": node.epoch,
        "ready": node.ready,
        # Serving beyond loopback without TLS on purpose (docs/security.md, "Safe defaults").
        "insecure": node.insecure,
        # The manager leader answers this nonce once its round is committed (lease_api).
        "lease_nonce": node.lease.ask(),
        "lease_remaining_ms": node.lease.remaining_ms(),
        "latency": neighbour_latency(node.replicas.values(), node.clock.monotonic_s()),
        "disk": disk_status(node.data_dir, node.replicas),
        "shards": {
            str(shard_id): {
                "role": replica.role,
                "upstream": replica.upstream,
                "last_seq": replica.durable,
                "durable_seq": replica.durable,
                "committed_seq": replica.commit_point,
                "catching_up": replica.catching_up,
                "upstream_linked": replica.upstream_stream is not None,
                "downstreams_linked": sorted(replica.downstream_streams),
                "links": link_status(replica),
                "commit_point_persisted": replica.commit_point_persisted,
                "takeover": [[master.hex(), seq] for master, seq in replica.takeover_table()],
                "rolled_back_entries": replica.rolled_back_entries,
                "rolled_back_committed_entries": replica.rolled_back_committed_entries,
                "refused_rollbacks": replica.refused_rollbacks,
                "refetched_entries": replica.refetched_entries,
                "counted_followers": list(replica.counted_followers),
                "repair": replica.repair_status(),
                "write_hold": node.reconfigure.hold_status(shard_id),
                "disk_full": replica.disk_full,
                "retention": node.retention.status(replica),
                "copies": [report.to_json() for report in replica.copies.values()],
            }
            for shard_id, replica in node.replicas.items()
        }
        | {str(shard_id): learner_status(learner) for shard_id, learner in node.learners.items()},
    }


def neighbour_latency(replicas: Iterable[ShardReplica], now_s: float) -> dict[str, dict[str, Any]]:
    """Per chain neighbour: the p99 of this node's PING/PONG round trips and ACK delays to
    it over ``limits.latency_window_ms`` before ``now_s`` (monotonic), over every shard they
    share."""
    windows: dict[str, list[LatencyWindow]] = {}
    for replica in replicas:
        for peer, health in replica.link_health.items():
            windows.setdefault(peer, []).append(health.latency)
    return {peer: latency_summary(found, now_s) for peer, found in sorted(windows.items())}


def link_status(replica: ShardReplica) -> list[dict[str, Any]]:
    """Every link of the replica's chain position, up or down (docs/node-api.md, "Status")."""
    peers: list[tuple[str, Direction]] = [(node, "downstream") for node in replica.downstreams]
    if replica.upstream is not None:
        peers.insert(0, (replica.upstream, "upstream"))
    return [
        replica.link_health.get(peer, LinkHealth(peer, direction)).status(
            replica.durable, replica.clock
        )
        for peer, direction in peers
    ]
