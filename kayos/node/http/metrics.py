"""A node's gauges and counters for ``GET /metrics`` (docs/node-api.md, "Metrics"), read from its
replicas at each scrape. ``make_app`` registers ``Collector`` in the node's registry, beside the
commit histogram and retention's metrics, which their owners register, and serves the registry
through ``Labelled``: every sample of every family carries the node's ``node`` and ``cluster``
labels, added once per scrape rather than by each metric.

The consumer groups' lag takes a scan of the stores (``kayos.node.lag``): the route awaits
``Collector.refresh`` (a worker thread) before the registry is collected, so ``collect`` itself
only reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from kayos.node.lag import GroupLag, group_lags
from kayos.node.pages import lag_seconds as lag_seconds_of
from kayos.node.retention import disk_status
from kayos.node.runtime import HWM_META, Node
from kayos.node.status import link_status
from kayos.replication.link.copied import COPY_MODES, copied_bytes
from kayos.replication.shard.replica import ShardReplica
from kayos.topology import Topology

Family = GaugeMetricFamily | CounterMetricFamily

# The ``cluster`` label of a node whose topology names no cluster id (a file without
# ``cluster_id`` and ``secret``: such a node replicates with no peer, so it is a cluster alone).
UNIDENTIFIED_CLUSTER = "unidentified"

# The kinds of ``kayos_topology_changes_total``, each reported from 0 on (``change_kinds``).
CHANGE_KINDS = ("topology", "shard_remade", "shard_opened", "shard_closed", "became_head")


def cluster_label(topology: Topology) -> str:
    """The ``cluster`` label: the cluster id of the topology file (a UUID, the same on every
    node and for the cluster's life), else ``UNIDENTIFIED_CLUSTER``."""
    identity = topology.identity
    return identity.cluster_id if identity is not None else UNIDENTIFIED_CLUSTER


class Labelled:
    """A registry as ``/metrics`` serves it: the same families, every sample with ``labels``
    added (a metric's own label of the same name would be replaced: none has one)."""

    def __init__(self, registry: Any, labels: dict[str, str]) -> None:
        self._registry = registry
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [
                Sample(sample.name, {**sample.labels, **self._labels}, *sample[2:])
                for sample in family.samples
            ]
            yield out


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


class _ConsumerFamilies:
    """Each consumer group's lag as the shard's tail counts it (``kayos.node.lag``)."""

    def __init__(self) -> None:
        labels = ["shard", "queue", "group"]
        self.messages = GaugeMetricFamily(
            "kayos_consumer_lag_messages",
            "Messages of the group's queue committed past its high-water mark, counted on a tail "
            "of the shard at each scrape (an estimate that errs high past the scan budget)",
            labels=labels,
        )
        self.seconds = GaugeMetricFamily(
            "kayos_consumer_lag_seconds",
            "Age in seconds of the group's oldest unread committed message by the tail's time "
            "index (at most one sampling interval too old; 0 when nothing is unread; absent when "
            "unknown)",
            labels=labels,
        )

    def add(self, lag: GroupLag) -> None:
        key = [str(lag.shard), lag.queue, lag.group]
        self.messages.add_metric(key, lag.messages)
        if lag.seconds is not None:
            self.seconds.add_metric(key, lag.seconds)


def _node_families(node: Node) -> list[Family]:
    """The node's own: up and since when, its topology epoch and what topologies changed here,
    write holds, its disk, and the messages it took in and served per shard."""
    ready = GaugeMetricFamily("kayos_node_ready", "1 while the node serves requests, else 0")
    ready.add_metric([], 1 if node.ready else 0)
    started = GaugeMetricFamily(
        "kayos_node_start_time_seconds", "When the node process started, in Unix seconds"
    )
    started.add_metric([], node.started_s)
    epoch = GaugeMetricFamily(
        "kayos_topology_epoch", "Epoch of the topology the node runs (it rises with each change)"
    )
    epoch.add_metric([], node.epoch)
    changes = CounterMetricFamily(
        "kayos_topology_changes",
        "Events of the topologies the node adopted since it started, by kind: topology (one per "
        "topology), shard_remade/shard_opened/shard_closed (its replicas), became_head",
        labels=["kind"],
    )
    for kind in (*CHANGE_KINDS, *sorted(set(node.reconfigure.changes) - set(CHANGE_KINDS))):
        changes.add_metric([kind], node.reconfigure.changes[kind])
    holds = CounterMetricFamily(
        "kayos_write_holds",
        "Write holds the node started since it started (one per shard it became head of while "
        "an earlier head's lease may still run)",
    )
    holds.add_metric([], node.reconfigure.holds_taken)
    disk = disk_status(node.data_dir, node.replicas)
    free = GaugeMetricFamily(
        "kayos_disk_free_bytes", "Free bytes of the node's data directory's file system"
    )
    if disk["free_bytes"] is not None:
        free.add_metric([], disk["free_bytes"])
    reserve = GaugeMetricFamily(
        "kayos_disk_reserve_bytes", "Free bytes below which the node refuses writes"
    )
    reserve.add_metric([], disk["reserve_bytes"])
    produced = CounterMetricFamily(
        "kayos_produced_messages",
        "Messages the node accepted for produce as a head since it started (acks=0: once queued)",
        labels=["shard"],
    )
    consumed = CounterMetricFamily(
        "kayos_consumed_messages",
        "Messages the node served in consume pages since it started (range reads included)",
        labels=["shard"],
    )
    held = GaugeMetricFamily(
        "kayos_shard_write_held",
        "1 while the head holds the shard's writes after becoming head, else 0",
        labels=["shard"],
    )
    now_s = node.clock.monotonic_s()
    for shard_id in sorted(set(node.replicas) | set(node.produced) | set(node.served)):
        produced.add_metric([str(shard_id)], node.produced[shard_id])
        consumed.add_metric([str(shard_id)], node.served[shard_id])
    for shard_id, replica in node.replicas.items():
        if replica.role == "head":
            holding = node.reconfigure.held_until_s(shard_id) > now_s
            held.add_metric([str(shard_id)], 1 if holding else 0)
    return [ready, started, epoch, changes, holds, free, reserve, produced, consumed, held]


def copy_family() -> Family:
    """``kayos_copy_bytes_total{mode}``: what this process copied to replicas of its own."""
    copied = CounterMetricFamily(
        "kayos_copy_bytes",
        "Bytes the node copied to replicas of its own since it started, by mode: file (store "
        "files received by snapshot) or log (entry payload bytes applied in catch-up)",
        labels=["mode"],
    )
    for mode in (*COPY_MODES, *sorted(set(copied_bytes) - set(COPY_MODES))):
        copied.add_metric([mode], copied_bytes[mode])
    return copied


def _copy_families(node: Node) -> list[Family]:
    """The copies the node serves or writes (docs/performance.md, "Pacing a copy"), each as its
    pacer last chose: its bytes per second and its share of the node's time."""
    labels = ["shard", "copy"]
    rate = GaugeMetricFamily(
        "kayos_copy_rate_mb_per_s",
        "A copy's rate over the pacer's last whole window, in MB (10^6 bytes) per second "
        "(0 once the copy ended)",
        labels=labels,
    )
    share = GaugeMetricFamily(
        "kayos_copy_share",
        "The share of the node's time the copy pacer lets a copy take while live traffic flows",
        labels=labels,
    )
    replicas = [*node.replicas.items()]
    replicas += [(s, learner.replica) for s, learner in node.learners.items() if learner.replica]
    for shard_id, replica in replicas:
        for report in replica.copies.values():
            key = [str(shard_id), report.kind]
            rate.add_metric(key, 0.0 if report.ended else report.copy_mb_per_s)
            share.add_metric(key, report.share)
    return [rate, share]


class Collector:
    """The node's metrics that are read, not counted as they happen: one pass over its replicas
    per scrape, and the groups' lag of the last ``refresh``."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._lags: list[GroupLag] = []

    async def refresh(self) -> None:
        """Counts every group's lag (``kayos.node.lag``) for the next ``collect``."""
        node = self._node
        self._lags = await group_lags(node.replicas, node.clock.now_s())

    def collect(self) -> list[Family]:
        replicas, links, groups = _ReplicaFamilies(), _LinkFamilies(), _GroupFamilies()
        consumers = _ConsumerFamilies()
        now_s = self._node.clock.now_s()
        for shard_id, replica in self._node.replicas.items():
            links.add(shard_id, replica)
            replicas.add(shard_id, replica)
            groups.add(shard_id, replica, now_s)
        for lag in self._lags:
            consumers.add(lag)
        return [
            *_node_families(self._node),
            copy_family(),
            *_copy_families(self._node),
            replicas.last,
            replicas.committed,
            replicas.size,
            groups.lag,
            groups.lag_seconds,
            consumers.messages,
            consumers.seconds,
            links.up,
            links.heard,
            links.lag,
            replicas.rolled_back,
            replicas.rolled_back_committed,
            replicas.refused,
            replicas.refetched,
            replicas.repairs,
        ]
