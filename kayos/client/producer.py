"""A client's producer_seqs (docs/node-api.md, "Idempotent producers"): one per produce call,
counted per shard, and the bound that keeps every call's resend within its head's window.

A shard's head remembers the ``limits.producer_window_entries`` highest producer_seqs of a
producer; a resend of a call below them gets ``producer_seq_too_old`` (its outcome unknown). One
call retried through a failover while the client's other calls to the shard go on would fall that
far behind, so a call to a shard starts only while the oldest call still in flight there is less
than a window behind it: a resend is then always within the window. Calls wait here for that
(only behind a call that is stuck), never inside the retry loop.

Used by ``kayos.client.aio.AsyncClient`` on its event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio

from kayos import limits


class ProducerSeqs:
    """The producer_seqs of one client's produce calls, per shard."""

    __slots__ = ("_in_flight", "_next", "_waiters", "_window")

    def __init__(self, window: int = limits.producer_window_entries) -> None:
        assert window >= 1
        self._window = window
        self._next: dict[int, int] = {}
        # Per shard, the calls in flight, by producer_seq: insertion order is seq order, so the
        # first key is the oldest.
        self._in_flight: dict[int, dict[int, None]] = {}
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}

    def in_flight(self, shard: int) -> list[int]:
        """The producer_seqs of ``shard``'s calls in flight, oldest first."""
        return list(self._in_flight.get(shard, ()))

    async def take(self, shard: int) -> int:
        """The next producer_seq of ``shard`` (from 1), once it is less than a window ahead of
        the oldest call in flight there; ``done`` must follow."""
        while True:
            in_flight = self._in_flight.setdefault(shard, {})
            seq = self._next.get(shard, 1)
            if not in_flight or seq - next(iter(in_flight)) < self._window:
                self._next[shard] = seq + 1
                in_flight[seq] = None
                return seq
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(shard, []).append(waiter)
            await waiter

    def done(self, shard: int, seq: int) -> None:
        """The call ``seq`` of ``shard`` ended (answered or failed): it is resent no more."""
        in_flight = self._in_flight[shard]
        oldest = next(iter(in_flight))
        del in_flight[seq]
        if seq == oldest:
            for waiter in self._waiters.pop(shard, ()):
                if not waiter.done():
                    waiter.set_result(None)
