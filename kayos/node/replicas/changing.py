"""The shards whose replica this node is re-making (a topology change, a repair), and the writes
that wait for it (docs/node-api.md, "Writes after a head change").

A write that comes while its shard's replica is closed and opened again waits here, at most
``limits.node_change_wait_ms``, instead of failing ``unavailable`` at once: the client would back
off, and its backoff outgrew the re-make (a head taking over after a kill answered its first
write 0.2-0.4 s late). Reads and everything else still get ``unavailable`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib


class ShardsChanging:
    """A set of shard ids, each with the event its waiters wait on."""

    def __init__(self) -> None:
        self._done: dict[int, asyncio.Event] = {}

    def __contains__(self, shard_id: object) -> bool:
        return shard_id in self._done

    def add(self, shard_id: int) -> None:
        self._done.setdefault(shard_id, asyncio.Event())

    def discard(self, shard_id: int) -> None:
        """The shard's change is over (opened, or failed to open): its waiters go on."""
        event = self._done.pop(shard_id, None)
        if event is not None:
            event.set()

    async def wait(self, shard_id: int, timeout_s: float) -> None:
        """Returns once ``shard_id`` is not changing, or after ``timeout_s`` (the caller then
        finds it still changing and answers as before)."""
        event = self._done.get(shard_id)
        if event is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
