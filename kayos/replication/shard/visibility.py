"""What consumers may see on a replica, and waiting for it.

``Visibility`` holds the waits a node's consume and produce paths make on one replica: for the
commit point to reach a seq (``wait_committed``, with the producers parked in ``CommitWaiters``),
for it to pass one, for this member to hold what its upstream said is committed, and for the chain
above to confirm it is whole (``confirm_chain``, docs/replication-protocol.md, "Confirming a
snapshot"). Apart from ``kayos.replication.shard.replica`` because it is one seam of the replica:
it only reads the progress and the upstream link, and waits on ``changed``.
``kayos.replication.shard.replica.ShardReplica`` inherits it and sets every attribute declared
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from kayos.clock import Clock
from kayos.replication.link.stream import FrameStream, Pulse
from kayos.replication.logic import chain


@dataclass(slots=True)
class _Waiter:
    seq: int
    future: asyncio.Future[int]


def _expire(future: asyncio.Future[int]) -> None:
    if not future.done():
        future.set_result(-1)


class CommitWaiters:
    """Producers waiting for the commit point to reach their seq, lowest seq first."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def release(self, seq: int) -> None:
        """The commit point reached ``seq``: every wait for a seq at or below it ends."""
        while self._heap and self._heap[0][0] <= seq:
            _, _, waiter = heapq.heappop(self._heap)
            if not waiter.future.done():
                waiter.future.set_result(seq)

    async def wait(self, seq: int, timeout_s: float) -> None:
        """Returns once ``release`` reached ``seq`` or after ``timeout_s``; raises what ``fail``
        was given."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        entry = (seq, next(self._ids), _Waiter(seq, future))
        heapq.heappush(self._heap, entry)
        # A timer instead of wait_for(shield(...)): the release wakes this task in one step.
        timer = loop.call_later(timeout_s, _expire, future)
        try:
            await future
        finally:
            timer.cancel()
            if (
                not future.done()
                or future.cancelled()
                or future.exception() is not None
                or future.result() < seq
            ):
                # Timed out or cancelled: a seq that never commits would keep its entry for ever.
                with contextlib.suppress(ValueError):
                    self._heap.remove(entry)
                    heapq.heapify(self._heap)

    def fail(self, exc: BaseException) -> None:
        """Every wait under way raises ``exc``."""
        waiters, self._heap = self._heap, []
        for _, _, waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(exc)

    def cancel(self) -> None:
        """Every wait under way is cancelled (the replica closes)."""
        for _, _, waiter in self._heap:
            if not waiter.future.done():
                waiter.future.cancel()


class Visibility:
    """The waits on what consumers may see (see the module's docstring)."""

    # The replica's state this uses (``ShardReplica.__init__`` sets it).
    clock: Clock
    upstream: str | None
    progress: chain.Progress
    changed: Pulse
    commit_waiters: CommitWaiters
    upstream_stream: FrameStream | None
    link_point_heard: bool
    lease_holds: Callable[[], bool]

    async def wait_committed(self, seq: int, timeout_s: float) -> int:
        """The commit point once it reaches ``seq``, or whatever it is after ``timeout_s``."""
        if self.progress.commit_point >= seq or timeout_s <= 0:
            return self.progress.commit_point
        await self.commit_waiters.wait(seq, timeout_s)
        return self.progress.commit_point

    async def wait_visible_through(self, seq: int, timeout_s: float) -> None:
        """Returns once the commit point reaches ``seq``, the link upstream is down (no point is
        coming), or ``timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.progress.commit_point < seq and self.upstream_stream is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)

    def holds_upstream_point(self) -> bool:
        """Whether this replica holds every seq its upstream said is committed: on the current
        link once it has sent its commit point, else the last point heard. A tail serves a new
        snapshot only then: one that rejoined behind the shard's commit (a catch-up lag behind),
        or whose link was rebuilt, would otherwise serve a group an older mark than the one the
        group committed (simulator seed 16). A head (no upstream) always does."""
        if self.upstream is None:
            return True
        if self.upstream_stream is not None and not self.link_point_heard:
            return False
        return self.progress.durable >= self.progress.upstream_point

    async def wait_holds_upstream_point(self, timeout_s: float) -> bool:
        """``holds_upstream_point``, waiting for it at most ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.holds_upstream_point():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)
        return True

    async def confirm_chain(self, timeout_s: float) -> bool:
        """Whether the chain above this member is whole now, up to a head that holds its lease:
        a CONFIRM sent on the current upstream link after the call is answered ``held``
        (docs/replication-protocol.md, "Confirming a snapshot"). A member below the head serves a
        new snapshot only then (docs/node-api.md, "Consume"), and answers its own downstream's
        CONFIRM with it. The manager may have spliced it out while it was paused or cut off, and
        the new chain may have committed a group's mark without it: its old upstream closes the
        link when it adopts the new chain (the real-process campaign, seed 11), a cut-off upstream
        cannot answer, and a cut-off part of the old chain, head included, reaches no lease (one
        hop was not enough: a tail cut off with its upstream kept its link). A head answers from
        its lease (always held without a manager). False: refused, or no answer in time."""
        if self.upstream is None:
            return self.lease_holds()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        since_s = self.clock.monotonic_s()
        asked: tuple[FrameStream, int] | None = None
        while True:
            stream = self.upstream_stream
            if stream is not None:
                if asked is None or asked[0] is not stream:
                    try:
                        asked = (stream, stream.confirm(since_s))
                    except Exception:  # the connection is gone: its reader ends the link
                        asked = None
                if asked is not None:
                    verdict = stream.confirmed(asked[1])
                    if verdict is not None:
                        return verdict
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)

    async def wait_visible_past(self, seq: int, timeout_s: float) -> None:
        """Returns once the commit point is past ``seq`` or after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.progress.commit_point <= seq:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.waiter(), remaining)
