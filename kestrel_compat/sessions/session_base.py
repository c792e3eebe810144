"""What every Kestrel connection does, whatever its protocol (Kestrel's ``KestrelHandler``).

``SessionBase`` is one connection's share of the server: it counts in ``curr_connections`` and
``total_connections``, decides once whether a connection limit makes it refuse reads or writes for
life (spec §7), and runs blocked fetches: ``fetch`` waits on the event loop for an add or abort to
wake it and, if the client leaves meanwhile, deregisters without taking an item (spec §3.4-§3.5).
``PendingReads`` is Kestrel's ``SimplePendingReads``: the open reads of one connection per queue,
oldest first, which the memcache and text protocols share and abort when the connection ends. The
thrift protocol keeps its open reads server-wide instead (``thrift_session``).

The protocol sessions subclass ``SessionBase`` and turn its refusals into their own replies.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from kestrel_compat import limits
from kestrel_compat.core.queue import Item, KestrelQueue, Waiter
from kestrel_compat.sessions.service import KestrelService


class ClientGone(Exception):
    """The client left while its request waited; nothing more is written to it."""


def _resolver(future: asyncio.Future[None]) -> Callable[[], None]:
    def wake() -> None:
        if not future.done():
            future.set_result(None)

    return wake


class PendingReads:
    """One connection's open reads, per queue name, oldest first (Kestrel's SimplePendingReads)."""

    def __init__(self) -> None:
        self._reads: dict[str, deque[tuple[KestrelQueue, int]]] = {}

    def count(self, name: str) -> int:
        return len(self._reads.get(name, ()))

    def add(self, name: str, queue: KestrelQueue, xid: int) -> None:
        self._reads.setdefault(name, deque()).append((queue, xid))

    def _pop(self, name: str, count: int) -> list[tuple[KestrelQueue, int]]:
        # Kestrel's ItemIdList.pop(count): all of them or none.
        pending = self._reads.get(name)
        if not pending or count > len(pending) or count <= 0:
            return []
        return [pending.popleft() for _ in range(count)]

    def confirm(self, name: str, count: int = 1) -> int:
        """Confirm the ``count`` oldest open reads on ``name``; none unless there are that many."""
        taken = self._pop(name, count)
        for queue, xid in taken:
            queue.confirm(xid)
        return len(taken)

    def confirm_all(self, name: str) -> int:
        return self.confirm(name, self.count(name))

    def abort(self, name: str) -> int:
        """Put the oldest open read on ``name`` back at the head of its queue."""
        taken = self._pop(name, 1)
        for queue, xid in taken:
            queue.unremove(xid)
        return len(taken)

    def abort_all(self) -> None:
        """Every open read back at its head, oldest first (spec §3.4)."""
        reads, self._reads = self._reads, {}
        for pending in reads.values():
            for queue, xid in pending:
                queue.unremove(xid)


class SessionBase:
    """One connection of any protocol: counting, connection limits, blocked fetches."""

    def __init__(self, service: KestrelService) -> None:
        self.service = service
        self.collection = service.collection
        self.max_open_reads = service.server_config.max_open_transactions
        self.finished = False
        self._gone: asyncio.Future[None] | None = None
        service.sessions += 1
        stats = self.collection.stats
        stats.curr_connections += 1
        stats.total_connections += 1
        server = service.server_config
        write_limit = server.connection_limit_refuse_writes
        read_limit = server.connection_limit_refuse_reads
        self.refuse_writes = write_limit is not None and service.sessions > write_limit
        self.refuse_reads = read_limit is not None and service.sessions > read_limit

    # --- lifecycle ---

    def client_left(self) -> None:
        """The peer closed its side: a blocked fetch gives up without taking an item."""
        gone = self._gone_future()
        if not gone.done():
            gone.set_result(None)

    def _gone_future(self) -> asyncio.Future[None]:
        if self._gone is None:
            self._gone = asyncio.get_running_loop().create_future()
        return self._gone

    def finish(self) -> None:
        """The connection ended, for any reason; ``end_reads`` settles its open reads."""
        if self.finished:
            return
        self.finished = True
        self.end_reads()
        self.service.sessions -= 1
        self.collection.stats.curr_connections -= 1
        self.service.after_change()

    def end_reads(self) -> None:
        """What the connection's end does to its open reads; each protocol says."""
        raise NotImplementedError

    # --- open reads, as each protocol keeps them ---

    def open_read_count(self, name: str) -> int:
        """This connection's open reads on queue ``name``, as maxOpenTransactions counts them."""
        raise NotImplementedError

    def remember_open_read(self, name: str, queue: KestrelQueue, item: Item) -> int:
        """Keep a new open read; return the id the client learns (0: none)."""
        raise NotImplementedError

    # --- status and limits (spec §7) ---

    @property
    def reads_blocked(self) -> bool:
        status = self.service.status
        return self.refuse_reads or (status is not None and status.blocks_reads)

    @property
    def writes_blocked(self) -> bool:
        status = self.service.status
        return self.refuse_writes or (status is not None and status.blocks_writes)

    # --- blocked fetches (spec §3.5) ---

    @staticmethod
    def deadline(timeout_ms: int | None) -> float | None:
        """A relative wait as a deadline on the loop's clock; None: do not wait."""
        if timeout_ms is None or timeout_ms <= 0:
            return None
        return asyncio.get_running_loop().time() + min(timeout_ms, limits.wait_ms_max) / 1000

    async def fetch(
        self, queue: KestrelQueue, deadline: float | None, *, transactional: bool, peek: bool
    ) -> Item | None:
        """Fetch now, or wait until ``deadline`` (loop time) for an add or abort to wake us."""
        item = self.collection.fetch(queue, transactional=transactional, peek=peek)
        if item is None and queue.behind_items and not (queue.closed or queue.paused):
            # Read-behind: the queue holds items, all in the log; a fetch waits for the refill
            # whatever its t= (docs/kestrel-compat.md §10).
            if queue.wants_refill():
                self.service.after_change()
            refill_deadline = asyncio.get_running_loop().time() + limits.read_behind_wait_ms / 1000
            deadline = refill_deadline if deadline is None else max(deadline, refill_deadline)
        if item is not None or deadline is None or queue.closed or queue.paused:
            return item
        # Only a fetch that may wait asks for the loop: asyncio.get_running_loop() costs a getpid
        # system call, a good part of a request that does not wait.
        loop = asyncio.get_running_loop()
        while True:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return None
            gone = self._gone_future()
            if gone.done():
                raise ClientGone("the client left before its fetch could wait")
            woken: asyncio.Future[None] = loop.create_future()
            waiter = Waiter(_resolver(woken))
            queue.add_waiter(waiter)
            try:
                await asyncio.wait(
                    [woken, gone], timeout=remaining_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                registered = queue.remove_waiter(waiter)
                if not registered and woken.done() and (gone.done() or self._cancelled()):
                    # Woken but never ran the fetch (our client left): pass the wake-up on.
                    queue.trigger()
            if gone.done():
                raise ClientGone("the client left while its fetch waited")
            if not woken.done():
                return None  # Timed out.
            item = self.collection.fetch(queue, transactional=transactional, peek=peek)
            if item is not None or loop.time() >= deadline or queue.closed or queue.paused:
                return item
            if queue.wants_refill():
                self.service.after_change()

    @staticmethod
    def _cancelled() -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def monitor_until(
        self,
        name: str,
        deadline: float | None,
        items_max: int,
        *,
        opening: bool,
        on_item: Callable[[Item, int], Awaitable[bool]],
    ) -> None:
        """Kestrel's monitorUntil (spec §5, §11): fetch one item after another, each handed to
        ``on_item`` with its open-read id, until ``items_max`` items, the deadline (None: only
        what is there now), this connection's open reads on the queue reaching
        maxOpenTransactions, an empty fetch, or ``on_item`` returning False. Raises
        ``IllegalQueueName`` from the creation."""
        loop = asyncio.get_running_loop()
        items_left = items_max
        while not self.reads_blocked:
            if items_left <= 0 or (deadline is not None and deadline <= loop.time()):
                return
            if self.open_read_count(name) >= self.max_open_reads:
                return
            if name in self.collection.aliases:
                return  # An alias reads as an empty queue.
            queue = self.collection.queue(name)
            if queue is None:
                return  # Shutting down.
            item = await self.fetch(queue, deadline, transactional=opening, peek=False)
            self.collection.count_result(item)
            if item is None:
                return
            read_id = self.remember_open_read(name, queue, item) if opening else 0
            if not await on_item(item, read_id):
                return
            items_left -= 1


class PendingReadsSession(SessionBase):
    """A session whose open reads belong to the connection (memcache, text): aborted at its end."""

    def __init__(self, service: KestrelService) -> None:
        super().__init__(service)
        self.open_reads = PendingReads()

    def end_reads(self) -> None:
        """Every open read is aborted, oldest first (spec §3.4)."""
        self.open_reads.abort_all()

    def open_read_count(self, name: str) -> int:
        return self.open_reads.count(name)

    def remember_open_read(self, name: str, queue: KestrelQueue, item: Item) -> int:
        self.open_reads.add(name, queue, item.xid)
        if self.finished:
            self.open_reads.abort_all()  # The client left as the item arrived (spec §3.4).
        return 0
