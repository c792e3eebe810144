"""The Kestrel front's backend on a Kayos cluster, through ``kayos.AsyncClient`` only.

- A Kestrel log ``m`` is the Kayos queue ``k.<m>`` (names Kayos would refuse are hex-encoded as
  ``kx.<hex>``). Every item is produced with ``acks=all``, so it is durable on every member of the
  shard's chain before the front answers ``STORED``.
- Item keys are unique (this backend's boot id and a counter), so Kayos's keyed de-dup never
  merges two Kestrel items. The value is the item's data; ``add_ms``, the Kestrel expiry and the
  groups the item was added for travel in the entry's headers. The Kayos store's own expiry is
  not used: the front discards expired items itself (and may move them to ``expireToQueue``).
- A group (a Kestrel queue or fanout child) is a Kayos consumer group: its high-water mark and
  blob are committed with ``acks=all`` semantics, so a confirmed removal survives the loss of any
  one replica.
- Reads (recovery at start-up, read-behind refills) page through a tail with ``AsyncClient.read``;
  one that starts below the queue's retention floor goes on from the floor (items that are gone
  are skipped, as Kestrel does; docs/kestrel-compat.md §10).
- A Kestrel log is one FIFO sequence with one seq space, so it lives in one shard of its Kayos
  queue even when the queue has several (docs/node-api.md, "Queues over several shards"): the
  queue's first shard. Its keys are chosen so the hash puts them there; reads, marks and the tail
  seq name that shard (docs/kestrel-compat.md, section 10).

- Consumed items are reclaimed by the cluster's retention (docs/retention.md): the first append
  to a log whose queue has no policy sets ``until_consumed``, so an item leaves the log once every
  group (every Kestrel queue and fanout child reading it) has confirmed it. A policy someone set
  on the queue is kept as it is.
"""

from __future__ import annotations

import itertools
import logging
import uuid

from kayos import AsyncClient, Item
from kayos.errors import InvalidRequest, KayosError, RetentionGapError
from kayos.topology import check_queue_name
from kestrel_compat import limits
from kestrel_compat.core.persistence import BackendError, Entry, GroupState, NewEntry

_PREFIX = "k."
_HEX_PREFIX = "kx."
_GROUPS_SEPARATOR = b"\x00"
_READ_PAGE_ENTRIES = 5_000

logger = logging.getLogger("kestrel_compat.backends.kayos_backend")


def queue_for(log: str) -> str:
    """The Kayos queue holding a Kestrel log."""
    name = _PREFIX + log
    try:
        return check_queue_name(name)
    except InvalidRequest:
        return check_queue_name(_HEX_PREFIX + log.encode().hex())


def log_for(queue: str) -> str | None:
    """The Kestrel log a Kayos queue holds, or None for queues that are not Kestrel's."""
    if queue.startswith(_HEX_PREFIX):
        try:
            return bytes.fromhex(queue[len(_HEX_PREFIX) :]).decode()
        except (ValueError, UnicodeDecodeError):
            return None
    if queue.startswith(_PREFIX):
        return queue[len(_PREFIX) :]
    return None


def entry_headers(entry: NewEntry) -> dict[str, bytes]:
    headers = {
        "a": entry.add_ms.to_bytes(8, "big"),
        "g": _GROUPS_SEPARATOR.join(group.encode() for group in entry.groups),
    }
    if entry.expiry_ms is not None:
        headers["e"] = entry.expiry_ms.to_bytes(8, "big")
    return headers


def entry_from(seq: int, value: bytes, headers: dict[str, bytes] | None) -> Entry:
    headers = headers or {}
    groups_raw = headers.get("g", b"")
    groups = tuple(g.decode() for g in groups_raw.split(_GROUPS_SEPARATOR)) if groups_raw else ()
    expiry_raw = headers.get("e")
    return Entry(
        seq,
        value,
        int.from_bytes(headers.get("a", b"\0"), "big"),
        None if expiry_raw is None else int.from_bytes(expiry_raw, "big"),
        groups,
    )


class KayosBackend:
    """``kestrel_compat.core.persistence.Backend`` over a Kayos cluster."""

    def __init__(self, client: AsyncClient) -> None:
        # The cluster's client; tests read the retention policies this backend set through it.
        self.client = client
        self._boot = uuid.uuid4().hex[:16]
        self._counter = itertools.count(1)
        # Logs whose queue is known to have a retention policy (set here or by someone else).
        self._retained: set[str] = set()

    @classmethod
    async def connect(cls, seeds: str | list[str], credentials: str | None = None) -> KayosBackend:
        """``credentials``: the front's credentials file (docs/security.md); None: the
        ``KAYOS_CREDENTIALS`` file, if set."""
        client = AsyncClient(seeds, name="kestrel-front", credentials=credentials)
        try:
            await client.connect()
        except KayosError as exc:
            await client.close()
            where = seeds if isinstance(seeds, str) else ", ".join(seeds)
            raise BackendError(f"cannot reach the Kayos cluster at {where}: {exc}") from exc
        return cls(client)

    def _shard(self, queue: str) -> int:
        """The one shard of ``queue`` a Kestrel log lives in (its first)."""
        return self.client.topology.shards_for(queue)[0]

    def _key(self, queue: str) -> bytes:
        """A fresh unique key that the queue's key hash puts in the log's shard: with ``S``
        shards one counter value in ``S`` does, so a few tries find one."""
        shard = self._shard(queue)
        for _ in range(limits.key_tries_max):
            key = f"{self._boot}.{next(self._counter)}".encode()
            if self.client.topology.shard_for_key(queue, key) == shard:
                return key
        raise BackendError(f"no key for shard {shard} of {queue!r} in {limits.key_tries_max}")

    async def append(self, log: str, entries: list[NewEntry]) -> list[int]:
        if not entries:
            return []
        queue = queue_for(log)
        items = [Item(self._key(queue), entry.value, 0, entry_headers(entry)) for entry in entries]
        if log not in self._retained:
            await self._retain_until_consumed(log)
        try:
            first, last = await self.client.produce_batch(queue, items, acks="all", txn=True)
        except KayosError as exc:
            raise BackendError(f"append to {log!r} failed: {exc}") from exc
        if last - first + 1 != len(entries):
            raise BackendError(f"append to {log!r} got seqs {first}..{last} for {len(entries)}")
        return list(range(first, last + 1))

    async def _retain_until_consumed(self, log: str) -> None:
        queue = queue_for(log)
        try:
            shard = self._shard(queue)
            current = await self.client.retention(queue, shard=shard)
            if current.get("policy") is None:
                await self.client.set_retention(queue, {"until_consumed": True}, shard=shard)
        except KayosError as exc:
            raise BackendError(f"retention policy of {log!r} not set: {exc}") from exc
        self._retained.add(log)

    async def read(self, log: str, after_seq: int, limit: int) -> list[Entry]:
        """Up to ``limit`` entries after ``after_seq``. A start below the queue's retention floor
        goes on from the floor: what lies at or below it is gone (confirmed by every group the
        queue had then, or given up by a policy an operator set), and a Kestrel reader is never
        told about items that are gone, it gets the next live one (docs/kestrel-compat.md §10)."""
        found: list[Entry] = []
        after = after_seq
        try:
            while len(found) < limit:
                queue = queue_for(log)
                try:
                    page = await self.client.read(
                        queue,
                        after=after,
                        limit=min(limit, _READ_PAGE_ENTRIES),
                        shard=self._shard(queue),
                    )
                except RetentionGapError as gap:
                    if gap.floor <= after:
                        raise  # no floor to go on from: not a gap this read can step over
                    logger.info(
                        "read of %r after %d goes on from its floor %d", log, after, gap.floor
                    )
                    after = gap.floor  # rises each time, and a floor never passes the log's end
                    continue
                for message in page.messages:
                    if message.value is not None and len(found) < limit:
                        found.append(entry_from(message.seq, message.value, message.headers))
                if page.end or page.next <= after:
                    break
                after = page.next
        except KayosError as exc:
            raise BackendError(f"read of {log!r} failed: {exc}") from exc
        return found

    async def commit_group(self, log: str, group: str, state: GroupState) -> None:
        try:
            queue = queue_for(log)
            await self.client.commit(
                queue, group, state.hwm, state=state.blob, shard=self._shard(queue)
            )
        except KayosError as exc:
            raise BackendError(f"commit of {log!r}/{group!r} failed: {exc}") from exc

    async def load_group(self, log: str, group: str) -> GroupState | None:
        queue = queue_for(log)
        try:
            known = {(q, g) for q, g, _ in await self.client.list_groups()}
            if (queue, group) not in known:
                return None
            info = await self.client.group(queue, group, shard=self._shard(queue))
        except KayosError as exc:
            raise BackendError(f"load of {log!r}/{group!r} failed: {exc}") from exc
        return GroupState(info.hwm, info.state or b"")

    async def list_logs(self) -> list[str]:
        try:
            groups = await self.client.list_groups()
        except KayosError as exc:
            raise BackendError(f"listing queues failed: {exc}") from exc
        return sorted({log for q, _, _ in groups if (log := log_for(q)) is not None})

    async def all_groups(self) -> set[tuple[str, str]]:
        """Every (log, group) pair on the cluster, in one listing."""
        try:
            groups = await self.client.list_groups()
        except KayosError as exc:
            raise BackendError(f"listing groups failed: {exc}") from exc
        return {(log, g) for q, g, _ in groups if (log := log_for(q)) is not None}

    async def list_groups(self, log: str) -> list[str]:
        queue = queue_for(log)
        try:
            groups = await self.client.list_groups()
        except KayosError as exc:
            raise BackendError(f"listing groups failed: {exc}") from exc
        return sorted(g for q, g, _ in groups if q == queue)

    async def delete_group(self, log: str, group: str) -> None:
        try:
            await self.client.delete_group(queue_for(log), group)
        except KayosError as exc:
            raise BackendError(f"delete of {log!r}/{group!r} failed: {exc}") from exc

    async def delete_log(self, log: str) -> None:
        for group in await self.list_groups(log):
            await self.delete_group(log, group)

    async def last_seq(self, log: str) -> int:
        queue = queue_for(log)
        try:
            info = await self.client.group(queue, "_last", shard=self._shard(queue))
        except KayosError as exc:
            raise BackendError(f"last seq of {log!r} failed: {exc}") from exc
        return info.boundary

    async def close(self) -> None:
        await self.client.close()
