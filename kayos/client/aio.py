"""``AsyncClient``: the asyncio client of a Kayos cluster (docs/node-api.md).

Produce and WAIT_COMMITTED go over each node's binary port (one persistent, pipelined
connection per node); consume, group commits and the topology go over HTTP with msgpack.
Each method says what its request is, and for what role (``Purpose``: a shard's head or a tail),
and checks its answer; ``kayos.client.routing`` says where it goes and retries it (the topology,
kept current by a watch; redirects; requests sent again when their node leaves the role; backoff),
and ``kayos.client.paging`` orders a consumer snapshot's page requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any

from kayos import limits
from kayos.checks import check_group_name, check_u64
from kayos.client.auth import ClientCredential
from kayos.client.http import HttpTransport
from kayos.client.paging import first_pages, snapshot_pages
from kayos.client.policy import Purpose, RetryPolicy
from kayos.client.producer import ProducerSeqs
from kayos.client.routing import Router
from kayos.client.types import (
    Acks,
    Columns,
    CommitInfo,
    Data,
    GroupInfo,
    Item,
    ItemLike,
    Page,
    ShardSeqs,
    Transaction,
    acks_code,
    acks_param,
    as_bytes,
    group_from_reply,
    page_from_reply,
    to_columns,
)
from kayos.clock import SYSTEM_CLOCK, Clock
from kayos.errors import (
    InvalidRequest,
    LimitExceeded,
    ProtocolError,
    UnavailableError,
)
from kayos.replication.wire.frames import CommittedReply, Produce, Produced, WaitCommitted
from kayos.topology import Topology, check_queue_name


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class AsyncClient:
    """A client of one Kayos cluster. Use ``async with AsyncClient(seeds) as client`` or call
    ``connect()`` and ``close()``. Not thread-safe: use it from one event loop."""

    def __init__(
        self,
        seeds: str | list[str],
        *,
        name: str = "kayos-client",
        timeout_s: float = limits.client_request_timeout_ms / 1000,
        retries: int = limits.client_retry_attempts_max,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
        producer_id: bytes | None = None,
        follow: bool = True,
        credentials: ClientCredential | str | None = None,
    ) -> None:
        self.seeds = [seeds] if isinstance(seeds, str) else list(seeds)
        if not self.seeds:
            raise InvalidRequest("a client needs at least one seed URL")
        if timeout_s <= 0:
            raise InvalidRequest("timeout_s must be > 0")
        self.seeds = [seed.rstrip("/") for seed in self.seeds]
        self.name = name
        # Long-polls the cluster for topology changes (docs/node-api.md, "Clients"); False: the
        # topology is learned again only when a node redirects, refuses or is lost, or when it
        # is older than ``client_topology_max_age_ms`` (a short-lived tool, a test of that path).
        self.follow = follow
        self.timeout_s = timeout_s
        self.policy = RetryPolicy(attempts_max=retries)
        # Jitter only; a caller who wants reproducible delays passes a seeded Random.
        self.rng = rng if rng is not None else random.Random()  # noqa: S311 - not for secrets
        self.clock = clock
        # Names every produce call over the binary port, so a head writes each call once however
        # often it is resent (docs/node-api.md, "Idempotent producers"). Drawn from the OS, never
        # from ``rng``: two clients seeded alike must not share one. ``producer_id`` is for tests.
        self.producer_id = os.urandom(16) if producer_id is None else producer_id
        if type(self.producer_id) is not bytes or len(self.producer_id) != 16:
            raise InvalidRequest(f"producer_id must be 16 bytes, got {self.producer_id!r}")
        self._producer_seqs = ProducerSeqs()
        # What every request proves (docs/security.md): a credentials file's path, or None for
        # KAYOS_CREDENTIALS's file if set.
        self._http = HttpTransport(credential=credentials)
        # Reads seeds, name, policy, rng and clock from here at each use.
        self._router = Router(self, self._http)

    # --- life cycle ------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Opens the HTTP session and learns the topology from the first seed that answers."""
        if self._router.closed:
            raise InvalidRequest("the client is closed")
        await self._http.open()
        if self._router.current is None:
            await self._router.retrying(lambda _redirect: self.refresh_topology())
        await self._router.start()  # the topology watch and the silence checks

    async def close(self) -> None:
        await self._router.close()
        await self._http.close()

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # --- topology --------------------------------------------------------------------------------

    @property
    def topology(self) -> Topology:
        return self._router.topology

    async def refresh_topology(self, min_epoch: int = 0) -> Topology:
        """Asks the known nodes, then the seeds, for the topology; keeps the first with an epoch
        of at least ``min_epoch``. ``UnavailableError`` if none has one (a retry may).

        Concurrent callers share one fetch: a node failing under a thousand requests in flight
        costs one round of topology requests, not a thousand."""
        return await self._router.refresh_topology(min_epoch)

    # --- produce ---------------------------------------------------------------------------------

    async def produce(
        self,
        queue: str,
        key: Data,
        value: Data | None,
        *,
        expiry_ms: int = 0,
        headers: Mapping[str, Data] | None = None,
        acks: Acks = "all",
    ) -> int:
        """Produces one message; returns its seq (0 under ``acks=0``)."""
        first_seq, _last_seq = await self.produce_batch(
            queue, [Item(key, value, expiry_ms, headers)], acks=acks, txn=False
        )
        return first_seq

    async def produce_batch(
        self, queue: str, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = False
    ) -> tuple[int, int]:
        """Produces a batch as one request to the shard's head; returns ``(first_seq,
        last_seq)`` (both 0 under ``acks=0``). ``txn`` makes it all-or-nothing. Retrying is safe:
        a key produced twice keeps one version (de-dup). On a queue with several shards the keys
        must all map to one shard (``InvalidRequest`` before sending, else): one seq range
        names one shard's seqs; ``produce_sharded`` splits any batch."""
        check_queue_name(queue)
        columns = to_columns(items)
        parts = self.topology.split_by_shard(queue, columns.keys)
        if len(parts) > 1:
            why = "a transaction commits in one shard" if txn else "use produce_sharded"
            raise InvalidRequest(
                f"the batch's keys span shards {sorted(parts)} of queue {queue!r}: {why}"
            )
        return await self._produce_part(queue, columns, acks_code(acks), txn)

    async def produce_sharded(
        self, queue: str, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = False
    ) -> list[ShardSeqs]:
        """Splits a batch by the shard each key goes to (``Topology.shard_for_key``) and sends
        every part to its shard's head at once; one ``ShardSeqs`` per part, in shard order.
        ``acks`` holds per part. A ``txn`` batch must keep to one shard (``InvalidRequest``
        before sending). If a part fails the error is raised once every part has finished; the
        other parts may be written (retrying is safe: de-dup). A head that refuses a part as
        spanning shards means the queue's shard count changed (``kayos ctl queue alter``): the
        topology is refreshed and, if its epoch rose, the batch is split and sent again once."""
        check_queue_name(queue)
        columns = to_columns(items)
        epoch = self.topology.epoch
        try:
            return await self._produce_split(queue, columns, acks, txn)
        except InvalidRequest:
            with contextlib.suppress(UnavailableError):
                await self.refresh_topology(epoch + 1)
            if self.topology.epoch <= epoch:
                raise
            return await self._produce_split(queue, columns, acks, txn)

    async def _produce_split(
        self, queue: str, columns: Columns, acks: Acks, txn: bool
    ) -> list[ShardSeqs]:
        parts = self.topology.split_by_shard(queue, columns.keys)
        if txn and len(parts) > 1:
            raise InvalidRequest(
                f"a transaction commits in one shard; its keys span shards {sorted(parts)} "
                f"of queue {queue!r}"
            )
        acks_value = acks_code(acks)
        picked = [(shard, columns.pick(indexes)) for shard, indexes in parts.items()]
        results = await asyncio.gather(
            *(self._produce_part(queue, part, acks_value, txn) for _shard, part in picked),
            return_exceptions=True,
        )
        out: list[ShardSeqs] = []
        for (shard, part), result in zip(picked, results, strict=True):
            if isinstance(result, BaseException):
                raise result
            out.append(ShardSeqs(shard, result[0], result[1], len(part)))
        return out

    async def _produce_part(
        self, queue: str, columns: Columns, acks_value: int, txn: bool
    ) -> tuple[int, int]:
        """One batch whose keys all go to one shard, to that shard's head. The call takes its
        producer_seq once: every resend of it names the same one."""
        shard = self.topology.shard_for_batch(queue, columns.keys)
        producer_seq = await self._producer_seqs.take(shard)

        def frame(request_id: int) -> Produce:
            return Produce(
                request_id,
                queue,
                columns.keys,
                columns.values,
                columns.expiries_ms,
                columns.headers,
                acks_value,
                txn,
                self.producer_id,
                producer_seq,
            )

        async def attempt(redirect: str | None) -> tuple[int, int]:
            node = redirect or self.topology.shards[shard].head
            reply = await self._router.send(node, Purpose(shard, "head"), frame, self.timeout_s)
            if not isinstance(reply, Produced):
                raise ProtocolError(f"node {node} answered PRODUCE with {type(reply).__name__}")
            return reply.first_seq, reply.last_seq

        try:
            return await self._router.retrying(attempt)
        finally:
            self._producer_seqs.done(shard, producer_seq)

    @contextlib.asynccontextmanager
    async def transaction(self, queue: str, *, acks: Acks = "all") -> AsyncIterator[Transaction]:
        """Collects ``put``/``delete`` calls and produces them on exit as one all-or-nothing
        batch (``txn.result`` is its seq range). Nothing is produced if the block raises."""
        check_queue_name(queue)
        txn = Transaction(queue)
        yield txn
        if txn.items:
            txn.result = await self.produce_batch(queue, txn.items, acks=acks, txn=True)

    async def wait_committed(
        self, queue_or_shard: str | int, seq: int, timeout_s: float = 10.0
    ) -> bool:
        """True once the shard is committed (durable on every member) through ``seq``; False
        if ``timeout_s`` passes first."""
        check_u64(seq, "seq")
        if isinstance(queue_or_shard, bool) or not timeout_s >= 0:
            raise InvalidRequest("wait_committed needs a queue or shard and a timeout >= 0")
        if isinstance(queue_or_shard, int):
            shard = queue_or_shard
            if shard not in self.topology.shards:
                raise InvalidRequest(f"no shard {shard} in the topology")
        else:
            shard = self.topology.queue_shard(check_queue_name(queue_or_shard), None)
        deadline_s = self.clock.monotonic_s() + timeout_s
        while True:
            remaining_s = max(0.0, deadline_s - self.clock.monotonic_s())
            wait_ms = min(int(remaining_s * 1000), limits.wait_committed_timeout_ms_max)
            committed_seq = await self._wait_once(shard, seq, wait_ms)
            if committed_seq >= seq:
                return True
            if self.clock.monotonic_s() >= deadline_s:
                return False

    async def _wait_once(self, shard: int, seq: int, wait_ms: int) -> int:
        async def attempt(redirect: str | None) -> int:
            node = redirect or self._router.tail(shard)
            reply = await self._router.send(
                node,
                Purpose(shard, "tail"),
                lambda request_id: WaitCommitted(request_id, shard, seq, wait_ms),
                wait_ms / 1000 + self.timeout_s,
            )
            if not isinstance(reply, CommittedReply) or reply.shard != shard:
                raise ProtocolError(f"node {node} answered WAIT_COMMITTED with {reply!r}")
            return reply.committed_seq

        return await self._router.retrying(attempt)

    # --- consume ---------------------------------------------------------------------------------

    async def consume(
        self,
        queue: str,
        group: str,
        *,
        page_size: int = 1000,
        wait_s: float = 0.0,
        shard: int | None = None,
        times: bool = False,
    ) -> AsyncGenerator[Page, None]:
        """One consumer snapshot ``(hwm, boundary]`` of the group, paged from a tail; the last
        page has ``end=True`` (then ``commit(queue, group, page.boundary)`` acknowledges it).
        With ``wait_s`` and nothing new, the first request long-polls that long.

        A queue with several shards gives one snapshot per shard in turn (``page.shard`` says
        which; each shard's last page has ``end=True``: commit it with ``shard=page.shard``).
        With ``wait_s`` and nothing new anywhere, every shard is long-polled at once and the
        first with entries is read first. ``shard`` reads that shard of the queue only (one
        consumer per shard, as a Kafka consumer owns partitions). With ``times``, each message
        carries its append time (``Message.append_ms``; docs/node-api.md, "Append times")."""
        check_queue_name(queue)
        check_group_name(group)
        check_u64(page_size, "page_size", low=1, high=limits.consume_page_entries_max)
        if not wait_s >= 0:
            raise InvalidRequest("wait_s must be >= 0")
        # columns=1: the node sends each page column by column (docs/node-api.md), which it builds
        # and this client decodes with no object per message until the caller asks for them.
        params = {"group": group, "limit": str(page_size), "columns": "1"}
        if times:
            params["times"] = "1"
        wait_ms = min(int(wait_s * 1000), limits.consume_wait_ms_max)
        self._router.recent_topology()
        fetch = functools.partial(self._page, queue)
        shards = self.topology.shards_for(queue)
        if shard is not None:
            shards = (self.topology.queue_shard(queue, shard),)
        if len(shards) == 1:
            first = dict(params, wait_ms=str(wait_ms)) if wait_ms else params
            firsts = [await self._page(queue, shards[0], first, wait_ms / 1000)]
        else:
            firsts = await first_pages(fetch, shards, params, wait_ms)
        for page in firsts:
            async for each in snapshot_pages(fetch, page, params):
                yield each

    def _shard_params(self, queue: str, shard: int) -> dict[str, str]:
        """``shard=`` on every per-shard request, a one-shard queue's too: a node whose topology
        has since given the queue more shards (``kayos ctl queue alter``) still knows which one
        is meant (an older node ignores the parameter)."""
        return {"shard": str(shard)}

    async def _page(self, queue: str, shard: int, params: dict[str, str], wait_s: float) -> Page:
        async def attempt(redirect: str | None) -> Page:
            node = redirect or self._router.tail(shard)
            request = self._http.request(
                "GET",
                f"{self._router.url(node)}/v1/queues/{queue}/consume",
                params=dict(params, **self._shard_params(queue, shard)),
                timeout_s=wait_s + self.timeout_s,
            )
            body = await self._router.call(node, Purpose(shard, "tail"), request)
            page = page_from_reply(body)
            if page.shard != shard:
                raise ProtocolError(
                    f"node {node} answered a page of shard {page.shard}, not {shard}"
                )
            return page

        return await self._router.retrying(attempt)

    async def commit(
        self,
        queue: str,
        group: str,
        hwm: int,
        *,
        state: bytes | None = None,
        shard: int | None = None,
    ) -> CommitInfo:
        """Commits the group's high-water mark (it has consumed every seq <= ``hwm``), with an
        optional opaque ``state``; answered once committed on every member. A queue with several
        shards has one mark per shard: name it (``shard=page.shard``)."""
        check_queue_name(queue)
        check_group_name(group)
        shard_id = self.topology.queue_shard(queue, shard)
        check_u64(hwm, "hwm")
        if state is not None and len(as_bytes(state, "state")) > limits.group_state_bytes_max:
            raise LimitExceeded(f"group state over {limits.group_state_bytes_max} bytes")
        body: dict[str, Any] = {"hwm": hwm}
        if state is not None:
            body["state"] = state

        async def attempt(redirect: str | None) -> CommitInfo:
            node = redirect or self.topology.shards[shard_id].head
            request = self._http.request(
                "POST",
                f"{self._router.url(node)}/v1/queues/{queue}/groups/{_quoted(group)}/commit",
                params=self._shard_params(queue, shard_id),
                body=body,
                timeout_s=self.timeout_s,
            )
            reply = await self._router.call(node, Purpose(shard_id, "head"), request)
            try:
                return CommitInfo(int(reply["hwm"]), int(reply["seq"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(f"malformed commit reply {reply!r}") from exc

        return await self._router.retrying(attempt)

    async def retention(self, queue: str, *, shard: int | None = None) -> dict[str, Any]:
        """The queue's retention policy (None: keep everything) and floor (docs/retention.md);
        of shard ``shard`` of a queue over several (each keeps its own floor)."""
        check_queue_name(queue)
        shard_id = self.topology.queue_shard(queue, shard)

        async def attempt(redirect: str | None) -> dict[str, Any]:
            node = redirect or self.topology.shards[shard_id].head
            reply = await self._http.request(
                "GET",
                f"{self._router.url(node)}/v1/queues/{queue}/retention",
                params=self._shard_params(queue, shard_id),
                timeout_s=self.timeout_s,
            )
            if not isinstance(reply, dict):
                raise ProtocolError(f"malformed retention reply {reply!r}")
            return reply

        return await self._router.retrying(attempt)

    async def set_retention(
        self, queue: str, policy: dict[str, Any], *, shard: int | None = None
    ) -> dict[str, Any]:
        """Sets the queue's retention policy (``max_age_ms``, ``max_bytes``, ``until_consumed``;
        ``{}`` keeps everything), replicated through the head (docs/retention.md). On a queue
        over several shards it is set on each (or on ``shard`` only); the reply is the first's."""
        check_queue_name(queue)
        shards = (
            self.topology.shards_for(queue)
            if shard is None
            else (self.topology.queue_shard(queue, shard),)
        )
        replies = []
        for shard_id in shards:

            async def attempt(redirect: str | None, shard_id: int = shard_id) -> dict[str, Any]:
                node = redirect or self.topology.shards[shard_id].head
                reply = await self._http.request(
                    "PUT",
                    f"{self._router.url(node)}/v1/queues/{queue}/retention",
                    params=self._shard_params(queue, shard_id),
                    body=policy,
                    timeout_s=self.timeout_s,
                )
                if not isinstance(reply, dict):
                    raise ProtocolError(f"malformed retention reply {reply!r}")
                return reply

            replies.append(await self._router.retrying(attempt))
        return replies[0]

    async def group(self, queue: str, group: str, *, shard: int | None = None) -> GroupInfo:
        """The group's high-water mark, the shard's committed boundary and the lag (of shard
        ``shard`` of a queue with several)."""
        check_queue_name(queue)
        check_group_name(group)
        shard_id = self.topology.queue_shard(queue, shard)

        async def attempt(redirect: str | None) -> GroupInfo:
            node = redirect or self.topology.shards[shard_id].head
            reply = await self._http.request(
                "GET",
                f"{self._router.url(node)}/v1/queues/{queue}/groups/{_quoted(group)}",
                params=self._shard_params(queue, shard_id),
                timeout_s=self.timeout_s,
            )
            return group_from_reply(reply)

        return await self._router.retrying(attempt)

    async def marks(self, queue: str, group: str) -> dict[int, int]:
        """The group's high-water mark on each shard of the queue, ``{shard: hwm}``."""
        shards = self.topology.shards_for(check_queue_name(queue))
        infos = await asyncio.gather(*(self.group(queue, group, shard=s) for s in shards))
        return {s: info.hwm for s, info in zip(shards, infos, strict=True)}

    async def read(
        self,
        queue: str,
        *,
        after: int,
        limit: int = 1000,
        upto: int | None = None,
        shard: int | None = None,
        times: bool = False,
    ) -> Page:
        """One page of the queue's live entries after ``after`` as of now, from a tail, without
        a consumer group (for recovery scans of layers that keep their own cursors). With
        ``upto``, the page is of the snapshot ``(after, upto]`` read as of ``upto`` (a range
        reader's next page; the page's ``boundary`` is below ``upto`` while the answering tail's
        commit point is). ``shard`` names one of a queue's several shards. With ``times``, each
        message carries its append time (``Message.append_ms``)."""
        check_queue_name(queue)
        shard_id = self.topology.queue_shard(queue, shard)
        check_u64(after, "after")
        check_u64(limit, "limit", low=1, high=limits.consume_page_entries_max)
        params = {"group": "_read", "after": str(after), "limit": str(limit), "columns": "1"}
        if upto is not None:
            params["upto"] = str(check_u64(upto, "upto"))
        if times:
            params["times"] = "1"
        return await self._page(queue, shard_id, params, 0.0)

    async def list_groups(self) -> list[tuple[str, str, int]]:
        """Every consumer group in the cluster as ``(queue, group, hwm)``, one shard at a time."""
        found: list[tuple[str, str, int]] = []
        for shard in sorted(self.topology.shards):

            async def attempt(redirect: str | None, shard: int = shard) -> list[Any]:
                node = redirect or self.topology.shards[shard].head
                reply = await self._http.request(
                    "GET",
                    f"{self._router.url(node)}/v1/shards/{shard}/groups",
                    timeout_s=self.timeout_s,
                )
                groups = reply.get("groups") if isinstance(reply, dict) else None
                if not isinstance(groups, list):
                    raise ProtocolError(f"malformed groups reply {reply!r}")
                return groups

            for entry in await self._router.retrying(attempt):
                found.append((str(entry["queue"]), str(entry["group"]), int(entry["hwm"])))
        return found

    async def delete_group(self, queue: str, group: str) -> None:
        """Forgets a consumer group on every member of every shard of the queue; a missing
        group is not an error."""
        check_queue_name(queue)
        check_group_name(group)

        for shard in self.topology.shards_for(queue):

            async def attempt(redirect: str | None, shard: int = shard) -> None:
                node = redirect or self.topology.shards[shard].head
                await self._http.request(
                    "DELETE",
                    f"{self._router.url(node)}/v1/queues/{queue}/groups/{_quoted(group)}",
                    params=self._shard_params(queue, shard),
                    timeout_s=self.timeout_s,
                )

            await self._router.retrying(attempt)

    async def produce_http(
        self, queue: str, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = True
    ) -> tuple[int, int]:
        """``produce_batch`` over HTTP instead of the binary port (for tools and tests)."""
        check_queue_name(queue)
        columns = to_columns(items)
        shard = self.topology.shard_for_batch(queue, columns.keys)
        body = {"messages": columns.to_messages(), "txn": txn}

        async def attempt(redirect: str | None) -> tuple[int, int]:
            node = redirect or self.topology.shards[shard].head
            request = self._http.request(
                "POST",
                f"{self._router.url(node)}/v1/queues/{queue}/messages",
                params={"acks": acks_param(acks)},
                body=body,
                timeout_s=self.timeout_s,
            )
            reply = await self._router.call(node, Purpose(shard, "head"), request)
            try:
                return int(reply["first_seq"]), int(reply["last_seq"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(f"malformed produce reply {reply!r}") from exc

        return await self._router.retrying(attempt)


__all__ = ["AsyncClient"]
