"""``Client``: the blocking face of ``AsyncClient``. It runs one ``AsyncClient`` on a private
event loop in a background thread and waits for each call; it may be shared by threads."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from kayos.client.aio import AsyncClient
from kayos.client.types import (
    Acks,
    CommitInfo,
    Data,
    GroupInfo,
    ItemLike,
    Page,
    ShardSeqs,
    Transaction,
)
from kayos.errors import InvalidRequest
from kayos.topology import Topology, check_queue_name

T = TypeVar("T")

# Joining the loop thread after close: the loop has nothing left to run by then.
_THREAD_JOIN_TIMEOUT_S = 10.0


class Client:
    """A blocking client of one Kayos cluster; the arguments are ``AsyncClient``'s. Connects on
    construction; use as a context manager or call ``close()``."""

    def __init__(self, seeds: str | list[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kayos-client-loop", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self._client = AsyncClient(seeds, **options)
            self._run(self._client.connect())
        except BaseException:
            self.close()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coroutine.close()
            raise InvalidRequest("the client is closed")
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise InvalidRequest("a blocking Client call from its own event loop would deadlock")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted here (Ctrl-C) or failed there: either way the coroutine is over, so
            # a later call (closing a consume iterator, say) does not find it still running.
            future.cancel()
            raise

    def close(self) -> None:
        if self._closed:
            return
        client = getattr(self, "_client", None)
        if client is not None:
            with contextlib.suppress(Exception):
                self._run(client.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_THREAD_JOIN_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def topology(self) -> Topology:
        return self._client.topology

    def refresh_topology(self, min_epoch: int = 0) -> Topology:
        return self._run(self._client.refresh_topology(min_epoch))

    def produce(
        self,
        queue: str,
        key: Data,
        value: Data | None,
        *,
        expiry_ms: int = 0,
        headers: Mapping[str, Data] | None = None,
        acks: Acks = "all",
    ) -> int:
        return self._run(
            self._client.produce(queue, key, value, expiry_ms=expiry_ms, headers=headers, acks=acks)
        )

    def produce_batch(
        self, queue: str, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = False
    ) -> tuple[int, int]:
        return self._run(self._client.produce_batch(queue, list(items), acks=acks, txn=txn))

    def produce_sharded(
        self, queue: str, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = False
    ) -> list[ShardSeqs]:
        return self._run(self._client.produce_sharded(queue, list(items), acks=acks, txn=txn))

    @contextlib.contextmanager
    def transaction(self, queue: str, *, acks: Acks = "all") -> Iterator[Transaction]:
        """As ``AsyncClient.transaction``: produced as one batch on a clean exit."""
        check_queue_name(queue)
        txn = Transaction(queue)
        yield txn
        if txn.items:
            txn.result = self.produce_batch(queue, txn.items, acks=acks, txn=True)

    def wait_committed(self, queue_or_shard: str | int, seq: int, timeout_s: float = 10.0) -> bool:
        return self._run(self._client.wait_committed(queue_or_shard, seq, timeout_s))

    def consume(
        self,
        queue: str,
        group: str,
        *,
        page_size: int = 1000,
        wait_s: float = 0.0,
        shard: int | None = None,
        times: bool = False,
    ) -> Iterator[Page]:
        pages = self._client.consume(
            queue, group, page_size=page_size, wait_s=wait_s, shard=shard, times=times
        )
        try:
            while True:
                try:
                    page = self._run(_next(pages))
                except StopAsyncIteration:
                    return
                yield page
        finally:
            if not self._closed:
                with contextlib.suppress(RuntimeError):  # the iterator was mid-step when cancelled
                    self._run(pages.aclose())

    def commit(
        self,
        queue: str,
        group: str,
        hwm: int,
        *,
        state: bytes | None = None,
        shard: int | None = None,
    ) -> CommitInfo:
        return self._run(self._client.commit(queue, group, hwm, state=state, shard=shard))

    def group(self, queue: str, group: str, *, shard: int | None = None) -> GroupInfo:
        return self._run(self._client.group(queue, group, shard=shard))

    def retention(self, queue: str, *, shard: int | None = None) -> dict[str, Any]:
        return self._run(self._client.retention(queue, shard=shard))

    def set_retention(
        self, queue: str, policy: dict[str, Any], *, shard: int | None = None
    ) -> dict[str, Any]:
        return self._run(self._client.set_retention(queue, policy, shard=shard))

    def marks(self, queue: str, group: str) -> dict[int, int]:
        return self._run(self._client.marks(queue, group))

    def read(
        self,
        queue: str,
        *,
        after: int,
        limit: int = 1000,
        upto: int | None = None,
        shard: int | None = None,
        times: bool = False,
    ) -> Page:
        return self._run(
            self._client.read(queue, after=after, limit=limit, upto=upto, shard=shard, times=times)
        )

    def list_groups(self) -> list[tuple[str, str, int]]:
        return self._run(self._client.list_groups())

    def delete_group(self, queue: str, group: str) -> None:
        self._run(self._client.delete_group(queue, group))

    def produce_http(
        self, queue: str, items: Iterable[ItemLike], *, acks: Acks = "all", txn: bool = True
    ) -> tuple[int, int]:
        return self._run(self._client.produce_http(queue, list(items), acks=acks, txn=txn))


async def _next(pages: AsyncGenerator[Page, None]) -> Page:
    return await anext(pages)
