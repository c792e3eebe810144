"""The load and the read-back of ``kayos bench failover``: producer threads that share one
``kayos.Client`` and record every call (``SharedProducers``), and the audit that reads a case's
messages back through the same client, superseded versions included (``read_back``).
docs/performance.md, "Failover as connected producers see it", says what each figure means; the
figures themselves are ``failover_figures``' pure functions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from kayos import limits
from kayos.bench.membership.failover_figures import (
    Call,
    count_versions,
    key_of,
    read_back_figures,
    unread_seqs,
)
from kayos.client.aio import AsyncClient
from kayos.client.sync import Client
from kayos.errors import OperationTimeoutError

T = TypeVar("T")

# Seqs read one by one to find superseded versions (duplicates): past this the count is unknown.
PROBE_SEQS_MAX = 10_000
# A page of the read-back that ends below the end marker came from a tail whose commit point is
# still behind it (docs/node-api.md); it is asked again, every POLL_S, within this bound.
READ_BACK_TIMEOUT_S = 30.0
POLL_S = 0.05
# Keys quoted in a case's record for its lost and duplicated messages; the counts are whole.
EXAMPLES_MAX = 10


class LoopClient:
    """One long-lived ``kayos.AsyncClient`` on an event loop of its own (a thread), for producers
    that are tasks of that loop (``SharedProducers``), as in an asyncio application."""

    def __init__(self, seeds: list[str], name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        self.client = AsyncClient(seeds, name=name)
        self.submit(self.client.connect()).result()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Runs ``coroutine`` on the client's loop; its future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        try:
            self.submit(self.client.close()).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10.0)
            if not self.thread.is_alive():
                self.loop.close()


class SharedProducers:
    """``count`` producers sharing one client: threads sharing a ``kayos.Client``, or tasks of a
    ``LoopClient``'s ``kayos.AsyncClient``. Each sends its next message (``value_bytes`` bytes,
    key ``p<n>-<i>``) with acks=all once its last call returned, and records every call. A call
    that raises is recorded as not acknowledged."""

    def __init__(
        self, client: Client | LoopClient, queue: str, count: int, value_bytes: int
    ) -> None:
        self.client = client
        self.queue = queue
        self.count = count
        self.value_bytes = value_bytes
        self.stop = threading.Event()
        # One list per producer, appended to by that producer alone.
        self.calls: list[list[Call]] = [[] for _ in range(count)]
        self.error_kinds: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.tasks: list[Future[None]] = []
        if isinstance(client, Client):
            self.threads = [
                threading.Thread(
                    target=self._run, args=(client, n), name=f"bench-failover-p{n}", daemon=True
                )
                for n in range(count)
            ]

    def start(self) -> None:
        client = self.client
        if isinstance(client, LoopClient):
            self.tasks = [client.submit(self._task(client.client, n)) for n in range(self.count)]
        for thread in self.threads:
            thread.start()

    def _message(self, producer: int, n: int) -> tuple[str, bytes]:
        key = key_of(producer, n)
        return key, key.encode().ljust(self.value_bytes, b".")

    def _record(self, producer: int, n: int, sent: float, error: Exception | None) -> None:
        if error is not None:
            with self.lock:
                self.error_kinds[type(error).__name__] += 1
        self.calls[producer].append(Call(producer, n, sent, time.monotonic(), error is None))

    def _run(self, client: Client, producer: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key, value = self._message(producer, n)
            sent, error = time.monotonic(), None
            try:
                client.produce(self.queue, key, value, acks="all")
            except Exception as exc:  # any call that raises is an error, whatever it raised
                error = exc
            self._record(producer, n, sent, error)

    async def _task(self, client: AsyncClient, producer: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key, value = self._message(producer, n)
            sent, error = time.monotonic(), None
            try:
                await client.produce(self.queue, key, value, acks="all")
            except Exception as exc:  # any call that raises is an error, whatever it raised
                error = exc
            self._record(producer, n, sent, error)

    def recorded(self) -> list[Call]:
        """Every call recorded so far."""
        return [call for calls in self.calls for call in list(calls)]

    def acked_by_every_thread(self) -> bool:
        return all(any(call.ok for call in list(calls)) for calls in self.calls)

    def finish(self, timeout_s: float) -> int:
        """Stops the producers (each ends the call it is in); returns how many did not end within
        ``timeout_s`` in all."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(1 for thread in self.threads if thread.is_alive())
        for task in self.tasks:
            try:
                task.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                stuck += 1
        return stuck


def marker(client: Client, queue: str, name: str) -> int:
    """Writes the marker message ``name`` (acks=all) and returns its seq."""
    return client.produce(queue, f"_{name}", name, acks="all")


def _live(client: Client, queue: str, start_seq: int, end_seq: int) -> list[tuple[int, str]]:
    """The queue's live messages (seq, key) in ``(start_seq, end_seq]`` as of ``end_seq``, read
    again from the start while the answering tail's commit point is below ``end_seq``."""
    deadline = time.monotonic() + READ_BACK_TIMEOUT_S
    found: list[tuple[int, str]] = []
    after = start_seq
    while True:
        page = client.read(queue, after=after, limit=limits.consume_page_entries_max, upto=end_seq)
        found += [(message.seq, message.key.decode()) for message in page.messages]
        if not page.end:
            after = page.next
            continue
        if page.boundary >= end_seq:
            return found
        if time.monotonic() > deadline:
            raise OperationTimeoutError(
                f"bench failover: no tail reached seq {end_seq} within {READ_BACK_TIMEOUT_S}s"
            )
        found, after = [], start_seq
        time.sleep(POLL_S)  # a bounded poll of the tail's commit point


def read_back(
    client: Client, queue: str, start_seq: int, end_seq: int, calls: list[Call]
) -> dict[str, Any]:
    """``lost`` and ``duplicates`` of the calls made between the two markers: the queue's live
    messages as of the end marker, then each other seq of the range read as of itself (a
    superseded version of a case key there is a duplicate). ``duplicates`` is None when more than
    ``PROBE_SEQS_MAX`` seqs would have to be read."""
    wanted = {key_of(call.thread, call.n) for call in calls}
    acked = [key_of(call.thread, call.n) for call in calls if call.ok]
    live = _live(client, queue, start_seq, end_seq)
    keys = [key for _seq, key in live]
    others = unread_seqs(start_seq, end_seq, [seq for seq, _key in live])
    probed = len(others) <= PROBE_SEQS_MAX
    if probed:
        for seq in others:
            page = client.read(queue, after=seq - 1, limit=1, upto=seq)
            keys += [m.key.decode() for m in page.messages if m.seq == seq]
    versions = count_versions(keys, wanted)
    figures = read_back_figures(acked, versions)
    acked_set = set(acked)
    return {
        "lost": figures["lost"],
        "duplicates": figures["duplicates"] if probed else None,
        "seqs_read_alone": len(others) if probed else 0,
        "lost_examples": sorted(key for key in acked_set if not versions.get(key))[:EXAMPLES_MAX],
        "duplicate_examples": sorted(key for key, n in versions.items() if n > 1)[:EXAMPLES_MAX],
    }
