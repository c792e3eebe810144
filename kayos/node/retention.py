"""The retention driver of a node (docs/retention.md): the thin asyncio side of
``kayos.storage.maintenance.retention``.

- At a shard's head, every ``limits.retention_check_interval_ms``, it gathers each policy's inputs
  (the head's time index, the queue's byte buckets, its groups' marks, now), asks the pure rule for
  the floor and commits a higher one as replicated metadata.
- On every replica it compacts with the floors of its metadata once they rose (at most every
  ``limits.retention_compaction_interval_ms`` per shard), so every member drops the same entries.
- It serves the retention calls (``PUT``/``GET /v1/queues/{q}/retention``), refuses a consume
  below the floor (``RetentionGapError``) and adds the status fields and metrics of retention and
  of a full disk.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from kayos import limits
from kayos.errors import KayosError, RetentionGapError, StorageError
from kayos.storage.disk import fileops
from kayos.storage.disk import format as fmt
from kayos.storage.disk.index import SEGMENT_MASK, SEGMENT_SHIFT
from kayos.storage.maintenance.compact import compact
from kayos.storage.maintenance.retention import (
    FLOOR_META,
    POLICY_META,
    Bucket,
    RetentionPolicy,
    decide_floor,
    encode_policy,
    floor_of,
    floors_in,
    group_marks,
    parse_policy,
    policies_in,
    prefix_floors,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kayos.clock import Clock
    from kayos.replication.shard.replica import ShardReplica

log = logging.getLogger("kayos.retention")


class Node(Protocol):
    """What the driver needs of ``kayos.node.runtime.Node`` (which imports this module)."""

    replicas: dict[int, ShardReplica]
    clock: Clock

    def replica_for(
        self, queue: str, *, want: str, shard_id: int | None = None
    ) -> ShardReplica: ...

    async def head_replica(self, queue: str, shard_id: int | None = None) -> ShardReplica: ...

    async def await_committed(self, replica: ShardReplica, seq: int) -> None: ...


def retention_floors(meta: Mapping[str, Any]) -> dict[bytes, int]:
    """The floors compaction applies, from a store's metadata."""
    return prefix_floors(floors_in(meta))


def check_floor(meta: Mapping[str, Any], queue: str, start: int) -> None:
    """Refuses a read that starts below ``queue``'s floor (docs/retention.md, "Below the floor")."""
    floor = floor_of(meta, queue)
    if start < floor:
        raise RetentionGapError(
            f"queue {queue!r}: position {start} is below the retention floor {floor}; entries "
            f"in ({start}, {floor}] were given up by the queue's retention policy; commit or "
            f"read after {floor} to go on",
            floor=floor,
        )


def retention_status(
    meta: Mapping[str, Any], compacted: Mapping[bytes, int] | None = None
) -> dict[str, dict[str, Any]]:
    """``{queue: {"policy", "floor", "compacted_floor"}}`` for every queue with a policy or a
    floor; ``compacted_floor``: the floor this replica's last retention compaction applied since
    the node started (0: none yet)."""
    policies = policies_in(meta)
    floors = floors_in(meta)
    done = compacted or {}
    return {
        queue: {
            "policy": policies[queue].to_meta() if queue in policies else None,
            "floor": floors.get(queue, 0),
            "compacted_floor": done.get(queue.encode() + b"\x00", 0),
        }
        for queue in sorted(set(policies) | set(floors))
    }


class _QueueBytes:
    """The head's running count of one queue's bytes above its floor, in buckets."""

    def __init__(self, start: int) -> None:
        self.scanned_through = start
        self.buckets: deque[Bucket] = deque()

    def trim(self, floor: int) -> None:
        while self.buckets and self.buckets[0].last_seq <= floor:
            self.buckets.popleft()
        self.scanned_through = max(self.scanned_through, floor)

    def add(self, bucket: Bucket) -> None:
        self.buckets.append(bucket)
        if len(self.buckets) > limits.retention_buckets_max:
            merged: deque[Bucket] = deque()
            items = list(self.buckets)
            for index in range(0, len(items) - 1, 2):
                first, second = items[index], items[index + 1]
                merged.append(Bucket(second.last_seq, first.payload_bytes + second.payload_bytes))
            if len(items) % 2:
                merged.append(items[-1])
            self.buckets = merged


def scan_queue_bytes(replica: ShardReplica, queue: str, state: _QueueBytes, upto: int) -> None:
    """Adds buckets for ``queue``'s live entries in ``(state.scanned_through, upto]`` (a worker
    thread: it reads leaves, not values)."""
    if upto <= state.scanned_through:
        return
    prefix = queue.encode() + b"\x00"
    store = replica.store
    with store.snapshot() as snap:
        upto = min(upto, snap.boundary)
        segments = store.succ_segments
        count = size = 0
        last = 0
        for leaf in snap.leaves(state.scanned_through, upto):
            for index, seq in enumerate(leaf.seqs):
                if seq <= state.scanned_through or seq > upto:
                    continue
                flag = leaf.flags[index]
                if flag & fmt.FLAG_COMMIT_MARKER or not leaf.keys[index].startswith(prefix):
                    continue
                segment = seq >> SEGMENT_SHIFT
                if segment < len(segments) and segments[segment][seq & SEGMENT_MASK] != 0:
                    continue  # superseded: ordinary compaction's garbage, not the queue's
                count += 1
                size += leaf.sizes[index]
                last = seq
                if count >= limits.retention_bucket_entries_max:
                    state.add(Bucket(last, size))
                    count = size = 0
        snap.check()
    if count:
        state.add(Bucket(last, size))
    state.scanned_through = upto


class RetentionDriver:
    def __init__(self, node: Node, registry: CollectorRegistry) -> None:
        self.node = node
        self._bytes: dict[tuple[int, str], _QueueBytes] = {}
        # shard -> the floors its last retention compaction applied, and when (monotonic s).
        self._compacted: dict[int, dict[bytes, int]] = {}
        self._compacted_at: dict[int, float] = {}
        self._left_bytes: dict[int, int] = {}  # shard -> file bytes its last one left
        registry.register(_Collector(node))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(limits.retention_check_interval_ms / 1000)
            for replica in list(self.node.replicas.values()):
                try:
                    if replica.role == "head":
                        await self.decide(replica)
                    await self.maybe_compact(replica)
                except KayosError as exc:
                    log.warning("shard %s: retention: %s", replica.shard_id, exc)

    async def decide(self, replica: ShardReplica) -> None:
        """At the head: commits each queue's floor when its policy lets it rise."""
        meta = replica.store.meta
        changes: dict[str, Any] = {}
        for queue, policy in policies_in(meta).items():
            if policy.keeps_all:
                continue
            old = floor_of(meta, queue)
            commit_point = replica.commit_point
            buckets: list[Bucket] = []
            if policy.max_bytes is not None:
                state = self._bytes.get((replica.shard_id, queue))
                if state is None:
                    state = self._bytes[(replica.shard_id, queue)] = _QueueBytes(old)
                state.trim(old)
                await asyncio.to_thread(scan_queue_bytes, replica, queue, state, commit_point)
                buckets = list(state.buckets)
            new = decide_floor(
                policy,
                old_floor=old,
                commit_point=commit_point,
                now_ms=int(self.node.clock.now_s() * 1000),
                samples=replica.time_index.samples(),
                buckets=buckets,
                marks=group_marks(meta, queue),
            )
            if new > old:
                changes[FLOOR_META + queue] = new
                state = self._bytes.get((replica.shard_id, queue))
                if state is not None:
                    state.trim(new)
        items = sorted(changes.items())
        step = limits.retention_floor_changes_per_commit_max
        for start in range(0, len(items), step):
            await replica.commit_meta(dict(items[start : start + step]))

    async def maybe_compact(self, replica: ShardReplica) -> None:
        """On any replica: compacts once the floors in its metadata rose since the last time."""
        floors = retention_floors(replica.store.meta)
        shard = replica.shard_id
        if not floors or floors == self._compacted.get(shard):
            return
        now = asyncio.get_running_loop().time()
        last = self._compacted_at.get(shard)
        if last is not None and now - last < limits.retention_compaction_interval_ms / 1000:
            left = self._left_bytes.get(shard, 0)
            grown = replica.store.file_bytes() - left
            if grown < max(left, limits.retention_compaction_growth_bytes_min):
                return
        self._compacted_at[shard] = now
        try:
            result = await asyncio.to_thread(compact, replica.store, floors)
        except StorageError as exc:  # busy with another compaction, or the disk is full
            log.info("shard %s: retention compaction not done now: %s", shard, exc)
            return
        self._compacted[shard] = floors
        self._left_bytes[shard] = result.bytes_after
        log.info("shard %s: retention compaction: %s", shard, result)

    # --- the calls ---------------------------------------------------------------------------

    async def set_policy(self, queue: str, raw: Any, shard_id: int | None = None) -> dict[str, Any]:
        """Sets (``{}``: clears) ``queue``'s policy at the head (of shard ``shard_id`` of a queue
        over several: each shard keeps its own copy and floor); answers once every member
        holds it."""
        policy = parse_policy(raw)
        node = self.node
        replica = await node.head_replica(queue, shard_id)
        result = await replica.commit_meta({POLICY_META + queue: encode_policy(policy)})
        await node.await_committed(replica, result.last_seq)
        return {
            "queue": queue,
            "policy": policy.to_meta() or None,
            "floor": floor_of(replica.store.meta, queue),
            "seq": result.last_seq,
        }

    def status(self, replica: ShardReplica) -> dict[str, dict[str, Any]]:
        return retention_status(replica.store.meta, self._compacted.get(replica.shard_id))

    def get_policy(self, queue: str, shard_id: int | None = None) -> dict[str, Any]:
        replica = self.node.replica_for(queue, want="member", shard_id=shard_id)
        meta = replica.store.meta
        policies = policies_in(meta)
        policy: RetentionPolicy | None = policies.get(queue)
        return {
            "queue": queue,
            "policy": policy.to_meta() if policy is not None else None,
            "floor": floor_of(meta, queue),
        }


def disk_status(data_dir: str, replicas: dict[int, ShardReplica]) -> dict[str, Any]:
    """``GET /v1/status``'s ``disk`` (docs/retention.md, "Disk full"): the data directory's free
    bytes and reserve, read with statvfs at each call (so a node out of every chain, committing
    nothing, still notices freed space), and ``full``: less than the reserve plus
    ``limits.disk_head_margin_bytes`` is free, or a replica below the head failed a commit for
    space (a head's refusals are its own: it stays head, docs/manager.md rule 9)."""
    reserve = limits.disk_reserve_bytes
    failed = any(r.disk_full and r.role != "head" for r in replicas.values())
    try:
        free = fileops.free_bytes(data_dir)
    except OSError as exc:
        log.warning("cannot read the free space of %s: %s", data_dir, exc)
        return {"free_bytes": None, "reserve_bytes": reserve, "full": failed}
    low = free < reserve + limits.disk_head_margin_bytes
    return {"free_bytes": free, "reserve_bytes": reserve, "full": low or failed}


class _Collector:
    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> list[GaugeMetricFamily]:
        disk_full = GaugeMetricFamily(
            "kayos_shard_disk_full",
            "1 while the replica's last commit attempt failed for lack of disk space, else 0",
            labels=["shard", "role"],
        )
        floor = GaugeMetricFamily(
            "kayos_queue_retention_floor_seq",
            "The queue's retention floor: its entries at or below this seq are given up",
            labels=["shard", "queue"],
        )
        for shard_id, replica in self._node.replicas.items():
            disk_full.add_metric([str(shard_id), str(replica.role)], 1 if replica.disk_full else 0)
            for queue, value in floors_in(replica.store.meta).items():
                floor.add_metric([str(shard_id), queue], value)
        return [disk_full, floor]
