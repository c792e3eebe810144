"""The simulator's world: one event heap, a fake clock, a seeded ``random.Random``, the network.

Nothing here reads a real clock, opens a socket or starts a thread: time is ``World.now`` (float
milliseconds), advanced only by taking the next event off the heap, and every random draw comes
from the one ``World.rng`` seeded by the run. Events at the same time run in the order they were
scheduled, so a seed always replays the same run.

The network (docs/testing.md, "The simulator"): a replication link is a pair of FIFO queues (a TCP
connection): messages on it arrive in order, each after its own delay, or not at all once the link
is closed. A link ends with a cause its ends see: ``reset`` (a crash of either end: the kernel
resets the connection; a reset fault; a partition of kind ``reject``), ``refused`` (opened to a
dead process or across a ``reject`` partition), ``silence`` (an end that cannot hear the other, a
``drop`` partition or a paused process, for ``peer_silence_ms``) or ``closed`` (an end closed it).
Messages that are not on a link (heartbeats, the manager's orders, client requests and replies)
are datagrams: each may be lost, and a partition of either kind drops them; a request sent with a
``refused`` callback hears of a dead process or a ``reject`` partition at once, as a TCP client
would.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Endpoints that are not nodes.
MANAGER = "mgr"
CLIENT = "client"


@dataclass
class Link:
    """One replication connection of one shard: ``upstream`` serves, ``downstream`` subscribed."""

    id: int
    upstream: str
    downstream: str
    shard: int
    open: bool = True
    cause: str = ""  # why it ended: reset, refused, silence, closed
    delivered: int = 0  # messages delivered on it (none: a connection never made)
    # The time the last message in each direction is due: a later one never overtakes it.
    due: dict[str, float] = field(default_factory=dict)
    # Messages a partition holds back (TCP retransmits them once it heals), by send order.
    held: list[tuple[int, str, Callable[..., None], tuple[Any, ...]]] = field(default_factory=list)
    sent: int = 0


class Endpoint:
    """Something that receives messages: a node, the manager, the client."""

    id: str
    paused = False

    def reachable(self) -> bool:
        """Up (not crashed); a paused endpoint is reachable but defers what it receives."""
        return True

    def deliver(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        fn(*args)


class World:
    def __init__(
        self,
        seed: int,
        *,
        delay_ms: tuple[float, float],
        slow_delay_ms: float,
        slow_share: float,
        datagram_loss: float,
        peer_silence_ms: float,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = 0
        self.endpoints: dict[str, Endpoint] = {}
        # Partitions: each cut pair and its kind, "drop" (silence) or "reject" (resets).
        self.cut: dict[frozenset[str], str] = {}
        self.links: dict[int, Link] = {}
        self._link_ids = 0
        self.delay_ms = delay_ms
        self.slow_delay_ms = slow_delay_ms
        self.slow_share = slow_share
        self.datagram_loss = datagram_loss
        self.peer_silence_ms = peer_silence_ms
        self.events_run = 0
        # Called when a link closes, once per end that is a node: (node, link).
        self.on_link_closed: Callable[[str, Link], None] = lambda node, link: None
        # Called when a node crashes (node), and when a pair is cut (a, b, kind).
        self.on_crash: list[Callable[[str], None]] = []
        self.on_cut: list[Callable[[str, str, str], None]] = []

    # --- the clock -------------------------------------------------------------------------------

    def at(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self._order += 1
        heapq.heappush(self._heap, (self.now + max(0.0, delay), self._order, fn, args))

    def run_until(self, until_ms: float, stop: Callable[[], bool] | None = None) -> None:
        """Runs events due before ``until_ms`` (bounded: the heap only holds finite work per
        simulated millisecond), or until ``stop()`` holds after an event."""
        heap = self._heap
        while heap and heap[0][0] <= until_ms:
            when, _, fn, args = heapq.heappop(heap)
            self.now = when
            self.events_run += 1
            fn(*args)
            if stop is not None and stop():
                return
        self.now = max(self.now, until_ms)

    # --- the network -----------------------------------------------------------------------------

    def is_cut(self, a: str, b: str) -> bool:
        return bool(self.cut) and frozenset((a, b)) in self.cut

    def cut_kind(self, a: str, b: str) -> str | None:
        """The kind of the partition between ``a`` and ``b`` (None: none)."""
        return self.cut.get(frozenset((a, b))) if self.cut else None

    def refuses(self, src: str, dst: str) -> bool:
        """Whether a connection from ``src`` to ``dst`` is refused at once: ``dst`` is a dead
        process, or a ``reject`` partition lies between them."""
        return self.cut_kind(src, dst) == "reject" or not self.endpoints[dst].reachable()

    def delay(self) -> float:
        """One message's delay."""
        return self._delay()

    def _delay(self) -> float:
        rng = self.rng
        if rng.random() < self.slow_share:
            return rng.uniform(self.delay_ms[1], self.slow_delay_ms)
        return rng.uniform(*self.delay_ms)

    def send(self, src: str, dst: str, fn: Callable[..., None], *args: Any) -> None:
        """A datagram: lost with ``datagram_loss``, dropped by a partition."""
        if self.is_cut(src, dst) or self.rng.random() < self.datagram_loss:
            return
        self.at(self._delay(), self._arrive, src, dst, None, fn, args)

    def request(
        self, src: str, dst: str, refused: Callable[[], None], fn: Callable[..., None], *args: Any
    ) -> None:
        """A request on a TCP connection: as a datagram, but a dead process or a ``reject``
        partition answers it with a reset, which ``refused()`` hears one round trip later."""
        if self.cut_kind(src, dst) == "reject":
            self.at(2 * self._delay(), refused)
            return
        if self.is_cut(src, dst) or self.rng.random() < self.datagram_loss:
            return
        self.at(self._delay(), self._arrive_request, src, dst, refused, fn, args)

    def _arrive_request(
        self,
        src: str,
        dst: str,
        refused: Callable[[], None],
        fn: Callable[..., None],
        args: tuple[Any, ...],
    ) -> None:
        if self.refuses(src, dst):
            self.at(self._delay(), refused)
            return
        self._arrive(src, dst, None, fn, args)

    def open_link(self, upstream: str, downstream: str, shard: int) -> Link:
        self._link_ids += 1
        link = Link(self._link_ids, upstream, downstream, shard)
        self.links[link.id] = link
        kind = self.cut_kind(upstream, downstream)
        if kind == "reject":
            self.at(2 * self._delay(), self.close_link, link, "refused")
        elif kind is not None:
            self.at(self.peer_silence_ms, self.close_link, link, "silence")
        return link

    def send_on(self, link: Link, src: str, fn: Callable[..., None], *args: Any) -> None:
        if not link.open:
            return
        link.sent += 1
        self._send_on(link, src, link.sent, fn, args)

    def _send_on(
        self, link: Link, src: str, number: int, fn: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        dst = link.downstream if src == link.upstream else link.upstream
        if self.is_cut(src, dst):
            link.held.append((number, src, fn, args))  # until the heal, or the silence closes it
            return
        due = max(self.now + self._delay(), link.due.get(src, 0.0))
        link.due[src] = due
        self._order += 1
        heapq.heappush(
            self._heap, (due, self._order, self._arrive, (src, dst, link, fn, args, number))
        )

    def _arrive(
        self,
        src: str,
        dst: str,
        link: Link | None,
        fn: Callable[..., None],
        args: tuple[Any, ...],
        number: int = 0,
    ) -> None:
        if link is not None and not link.open:
            return
        if self.is_cut(src, dst):
            if link is not None:
                link.held.append((number, src, fn, args))
            return
        endpoint = self.endpoints[dst]
        if not endpoint.reachable():
            if link is not None:
                # A connection to a dead process is refused (never made) or reset.
                self.close_link(link, "reset" if link.delivered else "refused")
            return
        if link is not None:
            link.delivered += 1
            if endpoint.paused:
                self.at(self.peer_silence_ms, self._silence_paused, link, endpoint)
        endpoint.deliver(fn, args)

    def close_link(self, link: Link, cause: str = "closed") -> None:
        if not link.open:
            return
        link.open = False
        link.cause = cause
        self.links.pop(link.id, None)
        for end in (link.upstream, link.downstream):
            self.on_link_closed(end, link)

    def links_of(self, node: str) -> list[Link]:
        return [link for link in self.links.values() if node in (link.upstream, link.downstream)]

    def partition(self, a: str, b: str, kind: str = "drop") -> None:
        """Cuts ``a`` from ``b``: ``drop`` silences their links (closed after
        ``peer_silence_ms``), ``reject`` resets them at once."""
        pair = frozenset((a, b))
        if pair in self.cut:
            return
        self.cut[pair] = kind
        for link in sorted(self.links.values(), key=lambda link: link.id):
            if {link.upstream, link.downstream} == set(pair):
                if kind == "reject":
                    self.at(self._delay(), self._silence, link, pair, "reset")
                else:
                    self.at(self.peer_silence_ms, self._silence, link, pair, "silence")
        for hook in self.on_cut:
            hook(a, b, kind)

    def _silence(self, link: Link, pair: frozenset[str], cause: str) -> None:
        if pair in self.cut:
            self.close_link(link, cause)

    def _silence_paused(self, link: Link, endpoint: Endpoint) -> None:
        if endpoint.paused:
            self.close_link(link, "silence")

    def heal(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        if pair not in self.cut:
            return
        del self.cut[pair]
        for link in list(self.links.values()):
            if {link.upstream, link.downstream} == set(pair) and link.held:
                held, link.held = sorted(link.held, key=lambda h: h[0]), []
                for number, src, fn, args in held:
                    self._send_on(link, src, number, fn, args)
