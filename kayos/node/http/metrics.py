"""A node's gauges and counters for ``GET /metrics`` (docs/node-api.md, "Metrics"), read from its
replicas at each scrape. ``make_app`` registers ``Collector`` in the node's registry, beside the
commit histogram and retention's metrics, which their owners register.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kayos.node.pages import lag_seconds as lag_seconds_of
from kayos.node.runtime import HWM_META, Node
from kayos.node.status import link_status
from kayos.replication.shard.replica import ShardReplica

Family = GaugeMetricFamily | CounterMetricFamily


class _ReplicaFamilies:
    """What each replica reports of itself, labelled by shard and role."""

    def __init__(self) -> None:
        labels = ["shard", "role"]
        self.last = GaugeMetricFamily(
            "kayos_shard_last_seq", "Durable last seq of the replica", labels=labels
        )
        self.committed = GaugeMetricFamily(
            "kayos_shard_committed_seq",
            "Seq durable on this replica and all below it",
            labels=labels,
        )
        self.size = GaugeMetricFamily(
            "kayos_shard_file_bytes", "Bytes of the shard's data file", labels=labels
        )
        self.rolled_back = CounterMetricFamily(
            "kayos_shard_rolled_back_entries",
            "Seqs the replica's rollbacks dropped since the node started",
            labels=labels,
        )
        self.refetched = CounterMetricFamily(
            "kayos_shard_refetched_entries",
            "Entries the replica copied in catch-up (a learner's or a repair's included)",
            labels=labels,
        )
        self.repairs = GaugeMetricFamily(
            "kayos_shard_repair",
            "1 while the replica repairs a damaged store (or reads met damage), else 0",
            labels=labels,
        )
        self.rolled_back_committed = CounterMetricFamily(
            "kayos_shard_rolled_back_committed_entries",
            "Of those, seqs at or below the commit point the replica knew (a bug if not 0)",
            labels=labels,
        )
        self.refused = CounterMetricFamily(
            "kayos_shard_refused_rollbacks",
            "Upstream orders to roll back below the known commit point that the replica refused",
            labels=labels,
        )

    def add(self, shard_id: int, replica: ShardReplica) -> None:
        key = [str(shard_id), str(replica.role)]
        self.last.add_metric(key, replica.durable)
        self.committed.add_metric(key, replica.commit_point)
        self.size.add_metric(key, replica.store.file_bytes())
        self.rolled_back.add_metric(key, replica.rolled_back_entries)
        self.rolled_back_committed.add_metric(key, replica.rolled_back_committed_entries)
        self.refused.add_metric(key, replica.refused_rollbacks)
        self.refetched.add_metric(key, replica.refetched_entries)
        repair = replica.repair_status()
        self.repairs.add_metric(key, 1 if repair and repair["state"] != "repaired" else 0)


class _LinkFamilies:
    """Each replication link of a replica, labelled by shard, peer and direction."""

    def __init__(self) -> None:
        labels = ["shard", "peer", "direction"]
        self.up = GaugeMetricFamily(
            "kayos_link_up", "1 while the replication link is up, else 0", labels=labels
        )
        self.heard = GaugeMetricFamily(
            "kayos_link_last_heard_seconds",
            "Seconds since the link's peer was last heard from (absent: never)",
            labels=labels,
        )
        self.lag = GaugeMetricFamily(
            "kayos_link_lag_entries",
            "Seqs between this replica and the link's peer (downstream: not yet reported)",
            labels=labels,
        )

    def add(self, shard_id: int, replica: ShardReplica) -> None:
        for link in link_status(replica):
            key = [str(shard_id), link["peer"], link["direction"]]
            self.up.add_metric(key, 1 if link["up"] else 0)
            if link["last_heard_s"] is not None:
                self.heard.add_metric(key, link["last_heard_s"])
            self.lag.add_metric(key, link["lag_entries"])


class _GroupFamilies:
    """Each consumer group's lag on a replica, labelled by shard, queue and group."""

    def __init__(self) -> None:
        labels = ["shard", "queue", "group"]
        self.lag = GaugeMetricFamily(
            "kayos_group_lag",
            "Last seq holding an entry minus the group's high-water mark",
            labels=labels,
        )
        self.lag_seconds = GaugeMetricFamily(
            "kayos_group_lag_seconds",
            "Seconds since this replica took in the first seq past the group's high-water mark, "
            "by its time index (absent: unknown)",
            labels=labels,
        )

    def add(self, shard_id: int, replica: ShardReplica, now_s: float) -> None:
        for name, hwm in replica.store.meta.items():
            if name.startswith(HWM_META) and isinstance(hwm, int):
                queue, _, group = name[len(HWM_META) :].partition("/")
                behind = max(0, replica.last_entry_seq - hwm)
                self.lag.add_metric([str(shard_id), queue, group], behind)
                since = lag_seconds_of(replica, hwm + 1 if behind else None, now_s)
                if since is not None:
                    self.lag_seconds.add_metric([str(shard_id), queue, group], since)


class Collector:
    """The node's metrics that are read, not counted as they happen: one pass over its replicas
    per scrape."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> list[Family]:
        replicas, links, groups = _ReplicaFamilies(), _LinkFamilies(), _GroupFamilies()
        now_s = self._node.clock.now_s()
        for shard_id, replica in self._node.replicas.items():
            links.add(shard_id, replica)
            replicas.add(shard_id, replica)
            groups.add(shard_id, replica, now_s)
        return [
            replicas.last,
            replicas.committed,
            replicas.size,
            groups.lag,
            groups.lag_seconds,
            links.up,
            links.heard,
            links.lag,
            replicas.rolled_back,
            replicas.rolled_back_committed,
            replicas.refused,
            replicas.refetched,
            replicas.repairs,
        ]
