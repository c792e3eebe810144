"""What a node does for `kayos ctl compact` and `kayos ctl check` (docs/node-api.md, "Operator
requests"): compactions an operator asked for, run one at a time beside the node's own, with their
progress; a digest of a shard's committed entries, so members can be compared; the online check of
a live store. The routes are thin; the store work runs in worker threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import msgpack
from aiohttp import web

from kayos import limits
from kayos.checks import check_u64
from kayos.errors import InvalidRequest, KayosError, StaleEpochError
from kayos.node.retention import retention_floors
from kayos.signing import open_signed
from kayos.storage.disk import format as fmt
from kayos.storage.engine import Snapshot, data_file_name
from kayos.storage.maintenance.check import check_snapshot
from kayos.storage.maintenance.compact import compact
from kayos.storage.maintenance.retention import floors_in

if TYPE_CHECKING:
    from kayos.node.runtime import Node
    from kayos.replication.shard.replica import ShardReplica

log = logging.getLogger("kayos.node")

COMPACT_FIELDS = frozenset({"epoch", "shards"})
# One entry's fixed part in a digest: seq, deleted (0/1), expiry_ms, key length (docs/node-api.md).
_ENTRY_HEAD = struct.Struct(">QBQI")
_LENGTH = struct.Struct(">I")
_NO_VALUE = 0xFFFFFFFF


@dataclass(slots=True)
class CompactionJob:
    """One store's compaction an operator asked for (``GET /v1/admin/compact`` shows it)."""

    shard: int
    state: str = "queued"  # queued, running, done, failed
    bytes_before: int = 0
    bytes_after: int | None = None
    written_bytes: int = 0  # the new file's size so far (progress while running)
    seconds: float | None = None
    entries_dropped: int = 0
    retention_dropped: int = 0
    generation: int | None = None
    error: str | None = None


def parse_compact(identity: Any, message: Any) -> tuple[int, list[int]]:
    """A signed compact request ``{"body": {"epoch", "shards"}, "mac"}``: its MAC (401), then its
    fields (400). ``shards`` empty: every shard the node holds."""
    body = open_signed(identity, "compact", message, COMPACT_FIELDS)
    shards = body["shards"]
    if not isinstance(shards, list) or len(shards) > limits.admin_compaction_jobs_kept_max:
        raise InvalidRequest(
            f"shards must be a list of at most {limits.admin_compaction_jobs_kept_max} shard ids"
        )
    return check_u64(body["epoch"], "epoch"), [
        check_u64(s, "shard", high=2**32 - 1) for s in shards
    ]


class OperatorRequests:
    """A node's compaction jobs and its bounded online reads (digests, store checks)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.jobs: OrderedDict[int, CompactionJob] = OrderedDict()
        self._pending: list[int] = []
        self._runner: asyncio.Task[Any] | None = None
        self._reads = asyncio.Semaphore(limits.online_check_reads_concurrent_max)

    # --- compaction ---------------------------------------------------------------------------

    def start_compaction(self, epoch: int, shards: list[int]) -> dict[str, Any]:
        """Queues a compaction of each of ``shards`` (none: every replica) that is not queued or
        running already; they run one at a time, in order."""
        node = self.node
        if epoch < node.epoch:
            raise StaleEpochError(f"compact decided at epoch {epoch}; this node is at {node.epoch}")
        wanted = sorted(set(shards)) if shards else sorted(node.replicas)
        missing = [s for s in wanted if s not in node.replicas]
        if missing:
            raise InvalidRequest(
                f"node {node.node_id} holds no replica of shard(s) "
                f"{', '.join(map(str, missing))}; it holds {sorted(node.replicas)}"
            )
        for shard in wanted:
            job = self.jobs.get(shard)
            if job is not None and job.state in ("queued", "running"):
                continue
            self.jobs.pop(shard, None)
            self.jobs[shard] = CompactionJob(shard)
            self._pending.append(shard)
        while len(self.jobs) > limits.admin_compaction_jobs_kept_max:
            oldest = next(iter(self.jobs))
            if self.jobs[oldest].state in ("queued", "running"):
                break
            del self.jobs[oldest]
        if self._pending and (self._runner is None or self._runner.done()):
            self._runner = node.spawn(self._run())
        return {"node": node.node_id, "shards": wanted, "jobs": self.compaction_status()["jobs"]}

    def compaction_status(self) -> dict[str, Any]:
        jobs = []
        for job in self.jobs.values():
            if job.state == "running":
                job.written_bytes = self._written(job.shard)
            jobs.append(asdict(job))
        return {"node": self.node.node_id, "jobs": jobs}

    def _written(self, shard: int) -> int:
        replica = self.node.replicas.get(shard)
        if replica is None:
            return 0
        store = replica.store
        path = os.path.join(store.directory, data_file_name(store.header.generation + 1))
        try:
            return os.stat(path + ".compact").st_size
        except OSError:
            return 0

    async def _run(self) -> None:
        for _ in range(limits.admin_compaction_jobs_kept_max):  # bounded; each pass takes one
            if not self._pending:
                return
            job = self.jobs.get(self._pending.pop(0))
            if job is None or job.state != "queued":
                continue
            await self._compact_one(job)

    async def _compact_one(self, job: CompactionJob) -> None:
        replica = self.node.replicas.get(job.shard)
        if replica is None:
            job.state, job.error = "failed", f"no longer a replica of shard {job.shard} here"
            return
        store = replica.store
        job.state, job.bytes_before = "running", store.file_bytes()
        started = time.monotonic()
        try:
            result = await asyncio.to_thread(compact, store, retention_floors(store.meta))
        except KayosError as exc:
            job.state, job.error = "failed", f"{exc.code}: {exc}"
            log.warning("shard %s: compaction asked for by an operator failed: %s", job.shard, exc)
        else:
            job.state = "done"
            job.bytes_before, job.bytes_after = result.bytes_before, result.bytes_after
            job.written_bytes = result.bytes_after
            job.entries_dropped, job.retention_dropped = (
                result.entries_dropped,
                result.retention_dropped,
            )
            job.generation = result.generation
            log.info("shard %s: compacted (asked for by an operator): %s", job.shard, result)
        job.seconds = round(time.monotonic() - started, 3)

    # --- online reads -------------------------------------------------------------------------

    def _replica(self, shard: int) -> ShardReplica:
        replica = self.node.replicas.get(shard)
        if replica is None:
            raise InvalidRequest(f"node {self.node.node_id} holds no replica of shard {shard}")
        return replica

    async def digest(self, shard: int, after: int, upto: int) -> dict[str, Any]:
        """The digest of the entries in ``(after, upto]`` as this member stores them
        (docs/node-api.md, "Shard digests"), with the lowest ``after`` it can answer for."""
        replica = self._replica(shard)
        if upto < after:
            raise InvalidRequest(f"upto {upto} is below after {after}")
        if upto - after > limits.shard_digest_seqs_max:
            raise InvalidRequest(
                f"a digest covers at most shard_digest_seqs_max={limits.shard_digest_seqs_max} "
                f"seqs, not {upto - after}"
            )
        if upto > replica.durable:
            raise InvalidRequest(
                f"shard {shard} on {self.node.node_id} holds seqs up to {replica.durable}, "
                f"not {upto}"
            )
        async with self._reads:
            entries, digest, floor = await asyncio.to_thread(_digest, replica, after, upto)
        if after < floor:
            raise InvalidRequest(
                f"shard {shard} on {self.node.node_id} answers for seqs above {floor} only "
                f"(compaction or retention dropped entries at or below it), not above {after}"
            )
        return {
            "node": self.node.node_id,
            "shard": shard,
            "after": after,
            "upto": upto,
            "floor": floor,
            "entries": entries,
            "digest": digest,
            "durable_seq": replica.durable,
            "committed_seq": replica.commit_point,
        }

    async def check_store(self, shard: int) -> dict[str, Any]:
        """The live store's own check (``check_snapshot``), bounded in size."""
        replica = self._replica(shard)
        store = replica.store
        size = store.file_bytes()
        answer: dict[str, Any] = {
            "node": self.node.node_id,
            "shard": shard,
            "file_bytes": size,
            "repair": replica.repair_status(),
        }
        if size > limits.online_store_check_bytes_max:
            return answer | {
                "checked": False,
                "ok": None,
                "problem": f"not checked: {size} bytes is over online_store_check_bytes_max="
                f"{limits.online_store_check_bytes_max}; run `kayos check` on a stopped node",
            }
        async with self._reads:
            report = await asyncio.to_thread(_check_live, replica)
        return answer | {
            "checked": True,
            "ok": report.ok,
            "problem": report.problem or None,
            "offset": report.offset,
            "entries": report.entries,
            "nodes": report.nodes,
            "last_seq": report.last_seq,
        }


def _check_live(replica: ShardReplica) -> Any:
    store = replica.store
    with store.snapshot() as snap:
        return check_snapshot(snap, store.path)


def _digest(replica: ShardReplica, after: int, upto: int) -> tuple[int, str, int]:
    with replica.store.snapshot() as snap:
        floor = digest_floor(snap)
        entries, digest = digest_entries(snap, max(after, floor), upto)
        return entries, digest, floor


def digest_floor(snap: Snapshot) -> int:
    """The lowest seq above which this store still holds every version it was sent: compaction
    dropped superseded versions at or below its ``min_rollback_seq``, retention every entry of a
    queue at or below the queue's floor."""
    floors = floors_in(snap.meta).values()
    return max([snap.header.min_rollback_seq, *floors])


def digest_entries(snap: Snapshot, after: int, upto: int) -> tuple[int, str]:
    """``(count, sha256 hex)`` of the entries with seqs in ``(after, upto]``, every version, in
    seq order, each as seq, deleted, expiry, key, value and headers (docs/node-api.md): what the
    chain replicated, whatever the member's file layout, out-of-line values and commit grouping."""
    digest = hashlib.sha256()
    count = 0
    for leaf in snap.leaves(after, upto):
        for index, seq in enumerate(leaf.seqs):
            if seq <= after or seq > upto:
                continue
            flags = leaf.flags[index]
            if flags & fmt.FLAG_COMMIT_MARKER:
                continue
            entry = snap.entry_at(leaf, index)
            key = entry.key
            digest.update(_ENTRY_HEAD.pack(seq, int(entry.deleted), entry.expiry_ms, len(key)))
            digest.update(key)
            if entry.value is None:
                digest.update(_LENGTH.pack(_NO_VALUE))
            else:
                digest.update(_LENGTH.pack(len(entry.value)))
                digest.update(entry.value)
            headers = b"" if not entry.headers else _packed_headers(entry.headers)
            digest.update(_LENGTH.pack(len(headers)))
            digest.update(headers)
            count += 1
    snap.check()
    return count, digest.hexdigest()


def _packed_headers(headers: dict[str, bytes]) -> bytes:
    packed: bytes = msgpack.packb(sorted(headers.items()), use_bin_type=True)
    return packed


def routes(
    node: Node,
    read_body: Callable[[web.Request], Awaitable[Any]],
    int_param: Callable[..., int | None],
) -> web.RouteTableDef:
    """The operator routes (``kayos.node.http.app.make_app`` adds them, passing its body and query
    parsers)."""
    requests = OperatorRequests(node)
    table = web.RouteTableDef()

    def shard_of(request: web.Request) -> int:
        raw = request.match_info["shard"]
        if not raw.isascii() or not raw.isdigit() or len(raw) > 10:
            raise InvalidRequest(f"shard must be an integer, not {raw[:40]!r}")
        return int(raw)

    @table.post("/v1/admin/compact")
    async def start_compact(request: web.Request) -> web.Response:
        epoch, shards = parse_compact(node.topology.identity, await read_body(request))
        return web.json_response(requests.start_compaction(epoch, shards))

    @table.get("/v1/admin/compact")
    async def compact_status(request: web.Request) -> web.Response:
        return web.json_response(requests.compaction_status())

    @table.get("/v1/shards/{shard}/digest")
    async def digest(request: web.Request) -> web.Response:
        after = int_param(request.query, "after", None)
        upto = int_param(request.query, "upto", None)
        if after is None or upto is None:
            raise InvalidRequest("a digest needs after=<seq>&upto=<seq>")
        return web.json_response(await requests.digest(shard_of(request), after, upto))

    @table.get("/v1/shards/{shard}/check")
    async def check(request: web.Request) -> web.Response:
        return web.json_response(await requests.check_store(shard_of(request)))

    return table
