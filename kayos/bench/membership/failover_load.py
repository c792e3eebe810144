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
from collections.abc import Callable
from typing import Any

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

# Seqs read one by one to find superseded versions (duplicates): past this the count is unknown.
PROBE_SEQS_MAX = 10_000
# A page of the read-back that ends below the end marker came from a tail whose commit point is
# still behind it (docs/node-api.md); it is asked again, every POLL_S, within this bound.
READ_BACK_TIMEOUT_S = 30.0
POLL_S = 0.05
# Keys quoted in a case's record for its lost and duplicated messages; the counts are whole.
EXAMPLES_MAX = 10


# One acks=all produce call: (queue, key, value) -> seq.
Produce = Callable[[str, str, bytes], int]


class LoopClient:
    """One long-lived ``kayos.AsyncClient`` on an event loop of its own (a thread), shared by the
    producers' calls: each call is a coroutine on that loop, so the calls in flight at once are
    tasks of one AsyncClient, as in an asyncio application."""

    def __init__(self, seeds: list[str], name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        self.client = AsyncClient(seeds, name=name)
        self.call(self.client.connect())

    def call(self, coroutine: Any) -> Any:
        """Runs ``coroutine`` on the client's loop and waits for its result (or error)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def produce(self, queue: str, key: str, value: bytes) -> int:
        return int(self.call(self.client.produce(queue, key, value, acks="all")))

    def close(self) -> None:
        try:
            self.call(self.client.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10.0)
            if not self.thread.is_alive():
                self.loop.close()


def sync_produce(client: Client) -> Produce:
    """The producers' call through a shared ``kayos.Client``."""

    def produce(queue: str, key: str, value: bytes) -> int:
        return client.produce(queue, key, value, acks="all")

    return produce


class SharedProducers:
    """``count`` threads producing through one shared client (``produce``: a ``kayos.Client``'s,
    or a ``LoopClient``'s): each sends its next message (``value_bytes`` bytes, key
    ``p<thread>-<n>``) with acks=all once the last call returned, and records every call. A call
    that raises is recorded as not acknowledged."""

    def __init__(self, produce: Produce, queue: str, count: int, value_bytes: int) -> None:
        self.produce = produce
        self.queue = queue
        self.count = count
        self.value_bytes = value_bytes
        self.stop = threading.Event()
        # One list per thread, appended to by that thread alone.
        self.calls: list[list[Call]] = [[] for _ in range(count)]
        self.error_kinds: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(n,), name=f"bench-failover-p{n}", daemon=True)
            for n in range(count)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _run(self, thread: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key = key_of(thread, n)
            value = key.encode().ljust(self.value_bytes, b".")
            sent = time.monotonic()
            try:
                self.produce(self.queue, key, value)
                ok = True
            except Exception as exc:  # any call that raises is an error, whatever it raised
                ok = False
                with self.lock:
                    self.error_kinds[type(exc).__name__] += 1
            self.calls[thread].append(Call(thread, n, sent, time.monotonic(), ok))

    def recorded(self) -> list[Call]:
        """Every call recorded so far."""
        return [call for calls in self.calls for call in list(calls)]

    def acked_by_every_thread(self) -> bool:
        return all(any(call.ok for call in list(calls)) for calls in self.calls)

    def finish(self, timeout_s: float) -> int:
        """Stops the threads (each ends the call it is in); returns how many did not end within
        ``timeout_s`` in all."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(1 for thread in self.threads if thread.is_alive())


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
