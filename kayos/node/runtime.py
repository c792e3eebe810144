"""A node: the shard replicas it holds and the operations its faces call.

The HTTP face (``kayos.node.http``) and the binary port (``kayos.node.binary_port``) both call
into ``Node``; neither holds logic of its own. Roles come from the topology (docs/node-api.md):
a produce reaches only the shard's head, a consume only a tail, and a request at the wrong node
is refused with a redirect.
Reading a consume page out of a store is ``kayos.node.pages``; the status document is
``kayos.node.status``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from kayos import limits
from kayos.checks import check_expiries, check_group_name, check_item_keys
from kayos.clock import Clock, SystemClock
from kayos.datadir import write_incarnation
from kayos.errors import (
    CorruptionError,
    InvalidRequest,
    KayosError,
    LimitExceeded,
    OperationTimeoutError,
    Unauthenticated,
    UnavailableError,
    WrongRoleError,
)
from kayos.identity import check_data_dir, secret_prints
from kayos.node.access import Access
from kayos.node.binary_port import BinaryPort
from kayos.node.lag import HWM_META as HWM_META  # `x as x`: importable from here still
from kayos.node.lag import marks_of
from kayos.node.marks import committed_mark
from kayos.node.pages import Message as Message  # `x as x`: importable from here still
from kayos.node.pages import Page as Page
from kayos.node.pages import count_unread
from kayos.node.pages import lag_seconds as lag_seconds
from kayos.node.pages import read_page as read_page
from kayos.node.replicas import learners
from kayos.node.replicas.reconfigure import Reconfigurer
from kayos.node.reports import SuspectReports
from kayos.node.retention import RetentionDriver, check_floor, retention_floors
from kayos.node.status import link_status as link_status
from kayos.node.status import neighbour_latency, node_status
from kayos.node.watch import Watches
from kayos.replication.link.handshake import HostAddresses
from kayos.replication.link.upstream import UpstreamLink
from kayos.replication.logic.lease import NodeLease, unconfirmed
from kayos.replication.shard.head_writes import Columns
from kayos.replication.shard.replica import ShardReplica, queue_prefix
from kayos.storage.engine import prepare_columns
from kayos.storage.maintenance.compact import compact
from kayos.tlsconfig import MemberTls
from kayos.topology import Topology, check_queue_name

log = logging.getLogger("kayos.node")

GROUP_STATE_META = "gstate/"
# Worker threads for blocking store work: each shard's head write loop and replica apply (one
# commit at a time each), metadata commits, link read-backs and consume pages. A busy node uses a
# handful; the bound only keeps a burst of consume requests from queueing behind each other.
_COMMIT_THREADS = 64


class Node:
    def __init__(
        self,
        topology: Topology,
        node_id: str,
        data_dir: str,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        managed: bool = False,
        copy_rate_mb_per_s_max: float = limits.copy_rate_mb_per_s_max,
    ) -> None:
        if node_id not in topology.nodes:
            raise InvalidRequest(f"node {node_id!r} is not in the topology")
        if copy_rate_mb_per_s_max < 0:
            raise InvalidRequest("copy_rate_mb_per_s_max is >= 0 MB/s (0: no ceiling)")
        self.topology = topology
        self.node_id = node_id
        self.address = topology.nodes[node_id]
        self.data_dir = data_dir
        # The byte-rate ceiling of every copy this node serves or writes (docs/operations.md,
        # "A copy's rate ceiling"; 0: none), given to each replica it opens.
        self.copy_rate_mb_per_s_max = copy_rate_mb_per_s_max
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()  # noqa: S311 (backoff jitter and tail choice)
        # This process's incarnation: 64 random bits, new at every start (docs/node-api.md).
        self.incarnation = f"{self.rng.getrandbits(64):016x}"
        # The manager's watch (GET /v1/admin/watch) and the reports of lost neighbours, sent to
        # the members the topology names (else those of the file the node started from).
        self.watches = Watches(self.incarnation)
        started_with = topology.managers
        self.reports = SuspectReports(
            node_id, lambda: self.topology.managers or started_with, self.clock, self.spawn
        )
        # The read lease from the cluster manager (``managed``: the topology file names manager
        # members; without them the lease always holds). docs/manager.md, "Head leases".
        self.lease = NodeLease(managed=managed, epoch=topology.epoch, clock=self.clock)
        self.replicas: dict[int, ShardReplica] = {}
        # Shards this node copies as a learner (kayos.node.replicas.learners), outside their chains.
        self.learners: dict[int, learners.Learner] = {}
        # Every replica's link to its upstream (the reconfigure driver adds and removes them).
        self.links: list[UpstreamLink] = []
        # Topology changes: the driver that opens, re-makes and closes replicas.
        self.reconfigure = Reconfigurer(self)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.binary_port = BinaryPort(self)
        self.hosts = HostAddresses()
        self.ready = False
        self.registry = CollectorRegistry()
        self.commit_seconds = Histogram(
            "kayos_commit_seconds",
            "Duration of one store commit (group commit, fsync included)",
            ["shard"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
        )
        self.retention = RetentionDriver(self, self.registry)
        # The credentials table and the door every request passes (docs/security.md).
        self.access = Access(data_dir, topology.identity, self.clock, self.registry)
        # Messages per shard this node accepted for produce (at a head; an acks=0 batch once
        # queued) and served in consume pages, since it started: one add per batch or page.
        self.produced: collections.Counter[int] = collections.Counter()
        self.served: collections.Counter[int] = collections.Counter()
        # When the process started, in seconds since the Unix epoch (the node's clock).
        self.started_s = self.clock.now_s()
        # TLS on both faces and the links (docs/security.md, "TLS"); set by kayos.node.server
        # before the node starts. ``insecure``: serving beyond loopback without TLS on purpose.
        self.tls: MemberTls | None = None
        self.insecure = False
        # The file the node started from: its secrets are read again on a reload.
        self.config_path: str | None = None
        self.insecure_gauge = Gauge(
            "kayos_insecure",
            "1 when the node serves beyond loopback without TLS (started with --insecure)",
            registry=self.registry,
        )

    @property
    def epoch(self) -> int:
        return self.topology.epoch

    async def start(self, bin_listener: socket.socket | None = None) -> None:
        """Opens the stores, starts the links and serves the binary port: on ``bin_listener`` if
        given (bound, not yet listening, by the caller before any peer is contacted, so a taken
        port ends the process first), else on a socket bound here."""
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(_COMMIT_THREADS, "kayos-commit"))
        identity = self.topology.identity
        if identity is not None and identity.is_placeholder:
            raise Unauthenticated(
                "the topology file holds the example's placeholder secret (all zeros), known to "
                "everyone; run `kayos init` to write a cluster id and secret of its own"
            )
        if identity is not None:
            # A data directory keeps the cluster it first ran in: never another's chains.
            await asyncio.to_thread(check_data_dir, self.data_dir, identity)
        elif any(len(shard.members) > 1 for shard in self.topology.shards_of(self.node_id)):
            log.error(
                "%s: the topology file has no cluster_id and secret: this node takes part in no "
                "replication link; run `kayos init` (or `kayos up`) to write them",
                self.node_id,
            )
        await asyncio.to_thread(write_incarnation, self.data_dir, self.incarnation)
        # The newest topology this node can verify: its file's, DATA/topology.json, its peers'.
        await self.reconfigure.choose_at_start()
        self.reconfigure.hold_until_lease()
        self.lease.on_held = self.reconfigure.lease_held
        self.spawn(self.hosts.prime(node.host for node in self.topology.nodes.values()))
        for shard in self.topology.shards_of(self.node_id):
            await self.reconfigure.open_replica(shard)
        self.spawn(self._compaction_loop())
        self.spawn(self.retention.run())
        self.spawn(self._commit_point_loop())
        await self.binary_port.start(bin_listener)
        self.ready = True

    async def _compaction_loop(self) -> None:
        """Compacts a replica's store in the background once its garbage ratio calls for it
        (pauseless: commits and snapshot readers go on during the copy)."""
        compacted_at: dict[int, int] = {}  # shard -> its last seq at its last compaction
        while True:
            await asyncio.sleep(limits.compaction_check_interval_ms / 1000)
            for replica in list(self.replicas.values()):
                store = replica.store
                window = store.options.rollback_window_seqs
                # Versions superseded within the rollback window survive compaction, so another
                # one pays only once the log has moved on by a part of the window.
                moved_on = store.last_seq - compacted_at.get(replica.shard_id, 0)
                if not (
                    store.compaction_due()
                    and store.last_seq > window
                    and moved_on >= window // limits.compaction_window_fraction
                ):
                    continue
                compacted_at[replica.shard_id] = store.last_seq
                try:
                    floors = retention_floors(store.meta)
                    result = await asyncio.to_thread(compact, store, floors)
                except KayosError as exc:
                    log.warning("shard %s: compaction failed: %s", replica.shard_id, exc)
                    continue
                log.info("shard %s: compacted: %s", replica.shard_id, result)

    async def _commit_point_loop(self) -> None:
        """Writes down each replica's commit point now and then (docs/replication-protocol.md,
        "Commit progress"), so a restarted tail serves at once what was committed before."""
        while True:
            await asyncio.sleep(limits.commit_point_persist_interval_ms / 1000)
            for replica in list(self.replicas.values()):
                try:
                    await replica.persist_commit_point()
                except KayosError as exc:
                    log.warning("shard %s: commit point not written: %s", replica.shard_id, exc)
                await replica.persist_time_index()
            # A replica whose reads met damage is re-made: its open salvages and re-fetches.
            await self.reconfigure.reopen_damaged()

    def reload(self) -> None:
        """SIGHUP: reads the TLS files and the cluster secrets again; connections made from now
        on use them."""
        if self.tls is not None:
            self.tls.reload()
        if self.config_path is not None:
            try:
                self.reload_secrets()
            except (KayosError, OSError) as exc:
                log.error("secrets not reloaded, the previous ones stay: %s", exc)

    def reload_secrets(self) -> dict[str, Any]:
        """Reads the secrets of the node's file again (docs/security.md, "Rotating the cluster
        secret"): every copy of the identity (each replica's topology, the links' next
        handshakes, the admin messages' checks) uses them from now on. Returns their prints."""
        identity = self.topology.identity
        if self.config_path is None or identity is None:
            raise InvalidRequest(f"node {self.node_id} has no file to read its secrets from")
        fresh = Topology.load(self.config_path).identity
        if fresh is None or fresh.is_placeholder:
            raise InvalidRequest(f"{self.config_path} has no cluster secret")
        identity.rekey(fresh)
        prints = secret_prints(identity)
        log.info("node %s: cluster secrets reloaded: %s", self.node_id, prints)
        return prints

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Runs ``coro`` as a task of the node (cancelled when it stops)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def goodbye(self) -> None:
        """The start of a clean stop: the lease ends (held false from now on, no grant extends
        it), then every watch gets its goodbye line, so the manager leader splices this node out
        at once and its successor need not wait for its lease (docs/manager.md)."""
        self.lease.end()
        await self.watches.goodbye()

    async def stop(self) -> None:
        self.ready = False
        for link in self.links:
            link.stop()
        self.binary_port.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for shard_id in list(self.learners):
            await learners.close_learner(self, shard_id)
        for replica in self.replicas.values():
            with contextlib.suppress(KayosError):
                await replica.persist_commit_point()
            await replica.persist_time_index(force=True)
            replica.close()
        self.hosts.close()
        await self.reports.close()

    # --- routing -------------------------------------------------------------------------------

    def replica_for(self, queue: str, *, want: str, shard_id: int | None = None) -> ShardReplica:
        """The local replica of ``queue``'s shard ``shard_id`` (None: its only shard) in the role
        ``want`` (head or tail)."""
        check_queue_name(queue)
        shard = self.topology.shards[self.topology.queue_shard(queue, shard_id)]
        if shard.id in self.reconfigure.changing:
            raise UnavailableError(f"shard {shard.id} is changing at {self.node_id}; retry")
        replica = self.replicas.get(shard.id)
        if want == "head":
            if replica is None or replica.role != "head":
                raise self._wrong_role(f"not the head of shard {shard.id}", shard.head)
        elif want == "tail":
            if replica is None or not shard.is_tail(self.node_id):
                tails = shard.tails
                raise self._wrong_role(
                    f"not a tail of shard {shard.id}", tails[self.rng.randrange(len(tails))]
                )
            if replica.catching_up or not replica.upstream_synced:
                raise UnavailableError(f"shard {shard.id} is catching up on {self.node_id}")
        elif replica is None:
            raise self._wrong_role(f"not a member of shard {shard.id}", shard.head)
        if want != "head" and replica.repairing:
            # Its store lost part of what it held (its marks and entries are an older state's):
            # nothing is read from it until it has re-fetched (a head's writes refuse it too).
            raise UnavailableError(f"shard {shard.id} is repairing its store on {self.node_id}")
        return replica

    async def head_replica(self, queue: str, shard_id: int | None = None) -> ShardReplica:
        """``replica_for(want="head")`` for a write: one that comes while the shard's replica is
        being re-made here (a topology change) waits for it, at most
        ``limits.node_change_wait_ms`` (docs/node-api.md, "Writes after a head change")."""
        check_queue_name(queue)
        shard = self.topology.shards[self.topology.queue_shard(queue, shard_id)]
        if shard.id in self.reconfigure.changing:
            await self.reconfigure.changing.wait(shard.id, limits.node_change_wait_ms / 1000)
        return self.replica_for(queue, want="head", shard_id=shard_id)

    def _wrong_role(self, why: str, node: str) -> WrongRoleError:
        return WrongRoleError(f"{self.node_id}: {why}", redirect=node, epoch=self.epoch)

    # --- operations ----------------------------------------------------------------------------

    async def produce(
        self,
        queue: str,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        expiries_ms: Sequence[int] | None,
        headers: Sequence[dict[str, bytes] | None] | None,
        *,
        acks: int,
        producer_id: bytes | None = None,
        producer_seq: int = 0,
    ) -> tuple[int, int]:
        """Commits one all-or-nothing batch at the head; answers per ``acks`` (0, 1, -1). The
        keys name the shard of a queue with several (all of them the same one). A call naming
        its producer is written once however often it comes (docs/node-api.md, "Idempotent
        producers"): a resend answers the seqs the first copy got."""
        check_queue_name(queue)
        shard_id = self.topology.shard_for_batch(queue, keys)
        replica = await self.head_replica(queue, shard_id)
        columns = build_columns(queue, keys, values, expiries_ms, headers)
        producer = None if producer_id is None else (producer_id, producer_seq)
        if acks == 0:
            # The store's checks run now, not in the task: "accepted" means the batch is valid.
            prepare_columns(*columns)
            self.spawn(_logged(replica.commit_ops(columns, producer)))
            self.produced[shard_id] += len(keys)
            return 0, 0
        result = await replica.commit_ops(columns, producer)
        self.produced[shard_id] += len(keys)
        if acks == -1:
            await self.await_committed(replica, result.last_seq)
        return result.first_seq, result.last_seq

    async def await_committed(self, replica: ShardReplica, seq: int) -> None:
        committed = await replica.wait_committed(seq, limits.produce_commit_timeout_ms / 1000)
        if committed < seq:
            raise OperationTimeoutError(
                f"seq {seq} durable on the head but not committed by the chain within "
                f"{limits.produce_commit_timeout_ms} ms (committed: {committed})"
            )

    async def commit_group(
        self, queue: str, group: str, hwm: int, state: bytes | None, shard_id: int | None = None
    ) -> int:
        """Commits a consumer group's high-water mark (of one shard of the queue) at the head;
        returns once every member holds it (so it survives the loss of any one replica)."""
        check_group_name(group)
        replica = await self.head_replica(queue, shard_id)
        if hwm < 0 or hwm > replica.durable:
            raise InvalidRequest(f"hwm must be in [0, {replica.durable}]")
        key = f"{HWM_META}{queue}/{group}"
        if key not in replica.store.meta and len(marks_of(replica)) >= limits.groups_per_shard_max:
            raise LimitExceeded(
                f"shard {replica.shard_id} holds {limits.groups_per_shard_max} consumer groups "
                "already (limits.groups_per_shard_max); delete one first"
            )
        meta: dict[str, Any] = {key: hwm}
        if state is not None:
            if len(state) > limits.group_state_bytes_max:
                raise LimitExceeded(f"group state over {limits.group_state_bytes_max} bytes")
            meta[f"{GROUP_STATE_META}{queue}/{group}"] = state
        result = await replica.commit_meta(meta)
        await self.await_committed(replica, result.last_seq)
        return result.last_seq

    async def delete_group(self, queue: str, group: str, shard_id: int | None = None) -> int:
        """Forgets a consumer group (its high-water mark and state) on every member."""
        check_group_name(group)
        replica = await self.head_replica(queue, shard_id)
        meta: dict[str, Any] = {
            f"{HWM_META}{queue}/{group}": None,
            f"{GROUP_STATE_META}{queue}/{group}": None,
        }
        result = await replica.commit_meta(meta)
        await self.await_committed(replica, result.last_seq)
        return result.last_seq

    def list_groups(self, shard: int) -> list[dict[str, Any]]:
        """Every consumer group of every queue in ``shard``, from this member's metadata."""
        replica = self.replicas.get(shard)
        if replica is None:
            raise InvalidRequest(f"node {self.node_id} holds no replica of shard {shard}")
        if replica.repairing:  # its marks are an older state's, as in replica_for
            raise UnavailableError(f"shard {shard} is repairing its store on {self.node_id}")
        return [
            {"queue": queue, "group": group, "hwm": hwm}
            for queue, group, hwm in sorted(marks_of(replica))
        ]

    async def group_info(
        self, queue: str, group: str, shard_id: int | None = None
    ) -> dict[str, Any]:
        """The group's mark, this member's boundary (its commit point) and the lag: the entries of
        this queue in ``(hwm, boundary]`` a consumer snapshot would return, counted in a worker
        thread (at most ``limits.group_lag_scan_entries_max`` looked at; ``lag_complete`` is False
        when the count stopped there). Every member that holds the same commit point answers the
        same; entries of the shard's other queues and metadata commits do not count.

        ``lag_seconds`` is the age of the oldest unread entry as this member's time index gives
        it (at most ``limits.time_index_interval_ms`` too old), 0 when nothing is unread, None
        when its time is unknown here (docs/node-api.md, "Lag")."""
        check_group_name(group)
        replica = self.replica_for(queue, want="member", shard_id=shard_id)
        meta = replica.store.meta
        hwm = int(meta.get(f"{HWM_META}{queue}/{group}", 0))
        state = meta.get(f"{GROUP_STATE_META}{queue}/{group}")
        boundary, lag, complete, oldest = await asyncio.to_thread(count_unread, replica, queue, hwm)
        return {
            "shard": replica.shard_id,
            "hwm": hwm,
            "boundary": boundary,
            "lag": lag,
            "lag_complete": complete,
            "lag_seconds": lag_seconds(replica, oldest, self.clock.now_s()),
            "state": state if isinstance(state, bytes) else None,
        }

    async def consume(
        self,
        queue: str,
        group: str,
        *,
        after: int | None,
        upto: int | None,
        limit: int,
        wait_ms: int,
        shard_id: int | None = None,
        times: bool = False,
    ) -> Page:
        """One page of the group's snapshot from this tail (docs/node-api.md, "Consume"); with
        ``times``, carrying the time-index samples of its messages ("Append times")."""
        check_group_name(group)
        replica = self.replica_for(queue, want="tail", shard_id=shard_id)
        key = f"{HWM_META}{queue}/{group}"
        hwm = int(replica.store.meta.get(key, 0))
        limit = max(1, min(limit, limits.consume_page_entries_max))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait_ms, limits.consume_wait_ms_max) / 1000
        if upto is None:
            # A new snapshot: everything an acks=all producer was told is committed is durable
            # here already, and its commit point is on its way down; wait for it (briefly), so
            # that a consumer reads its own acknowledged writes.
            await replica.wait_visible_through(
                replica.durable, limits.consume_commit_point_wait_ms / 1000
            )
            wait_s = limits.consume_commit_point_wait_ms / 1000
            if not await replica.wait_holds_upstream_point(wait_s):
                raise UnavailableError(
                    f"shard {replica.shard_id} on {self.node_id} does not hold the commit point"
                    f" its upstream sent yet (it holds seq {replica.durable}, upstream committed"
                    f" {replica.progress.upstream_point}, link point heard"
                    f" {replica.link_point_heard})"
                )
            if not await replica.confirm_chain(wait_s):
                raise UnavailableError(
                    unconfirmed(replica.shard_id, self.node_id, replica.upstream)
                )
            # A committed mark only, read after the checks (kayos/node/marks.py).
            hwm = await committed_mark(replica, key, self.node_id, wait_s)
        start = hwm if after is None else after
        check_floor(replica.store.meta, queue, start)
        while True:
            try:
                page = await asyncio.to_thread(
                    read_page, replica, queue, group, hwm, start, upto, limit
                )
            except CorruptionError as exc:  # never served; reported (docs/node-api.md)
                replica.note_damage(exc)
                raise
            # A link may have put the replica in catch-up since the request came in (its commits
            # are what wakes a long-poll): a page read meanwhile may hold part of a batch.
            if replica.catching_up or replica.repairing:
                raise UnavailableError(f"shard {replica.shard_id} is catching up on {self.node_id}")
            # Long-poll: an empty first page waits for entries of this queue (commits of other
            # queues or of high-water marks move the boundary but bring nothing to read).
            remaining = deadline - loop.time()
            if page.seqs or upto is not None or remaining <= 0:
                self.served[replica.shard_id] += len(page.seqs)
                if times:  # the index belongs to this event loop: read it here, not in the thread
                    page = dataclasses.replace(page, times=replica.time_index.covering(page.seqs))
                return page
            await replica.wait_visible_past(page.boundary, remaining)

    async def wait_committed(self, shard: int, seq: int, timeout_ms: int) -> int:
        replica = self.replicas.get(shard)
        if replica is None:
            raise InvalidRequest(f"node {self.node_id} holds no replica of shard {shard}")
        timeout_ms = min(timeout_ms, limits.wait_committed_timeout_ms_max)
        return await replica.wait_committed(seq, timeout_ms / 1000)

    def status(self) -> dict[str, Any]:
        document = node_status(self)
        table = self.access.table  # whether the cluster runs open; never a key
        document["auth"] = {
            "mode": "open" if table.is_open else "credentials",
            "table_version": table.version,
            "credentials": len(table.credentials),
        }
        return document

    def latency(self) -> dict[str, dict[str, Any]]:
        return neighbour_latency(self.replicas.values(), self.clock.monotonic_s())


async def _logged(coro: Any) -> None:
    try:
        await coro
    except KayosError as exc:
        log.warning("acks=0 produce failed: %s", exc)
    except Exception:  # nobody awaits an acks=0 write: its failure is logged, never lost silently
        log.exception("acks=0 produce failed")


def build_columns(
    queue: str,
    keys: Sequence[bytes],
    values: Sequence[bytes | None],
    expiries_ms: Sequence[int] | None,
    headers: Sequence[dict[str, bytes] | None] | None,
) -> Columns:
    """Checks a produce batch's item bounds and returns its columns on stored (prefixed) keys,
    for the store and the chain alike (``commit_ops`` checks the store's bounds)."""
    count = len(keys)
    if count == 0:
        raise InvalidRequest("empty batch")
    if count > limits.batch_entries_max:
        raise LimitExceeded(f"batch of {count} items exceeds {limits.batch_entries_max}")
    if len(values) != count or (expiries_ms is not None and len(expiries_ms) != count):
        raise InvalidRequest("keys, values and expiries differ in length")
    if headers is not None and len(headers) != count:
        raise InvalidRequest("keys and headers differ in length")
    # The one place a batch's keys and expiries are checked for every face (HTTP, binary port):
    # what passes here can be stored and encoded down the chain, so nothing fails after a seq.
    check_item_keys(keys)
    check_expiries(expiries_ms)
    return (
        tuple(map(queue_prefix(queue).__add__, keys)),
        tuple(values),
        None if expiries_ms is None else tuple(expiries_ms),
        None if headers is None else tuple(headers),
    )
