"""A group's mark held at a tail of in-process managed nodes: the middle's store commits held (a
slow disk) while the mark is forwarded, and the middle cut from its head."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kayos.node.marks import read_mark
from kayos.node.runtime import HWM_META, Node
from kayos.replication.replica import ShardReplica
from tests.support.links import until
from tests.support.nodes import QUEUE, grant

GROUP = "g"
KEY = f"{HWM_META}{QUEUE}/{GROUP}"


def wait_before_commits(replica: ShardReplica, wait: Callable[[], Awaitable[Any]]) -> None:
    """Every store commit of ``replica`` that starts from now on first awaits ``wait()``."""
    real = replica.timed_commit

    async def held(*args: Any, **kwargs: Any) -> Any:
        await wait()
        return await real(*args, **kwargs)

    replica.timed_commit = held  # type: ignore[method-assign]


def hold_commits(replica: ShardReplica) -> asyncio.Event:
    """Holds every store commit of ``replica`` that starts from now on until the returned event
    is set (what it took in is forwarded meanwhile, as a member with a slow disk does)."""
    release = asyncio.Event()
    wait_before_commits(replica, release.wait)
    return release


async def marked(nodes: dict[str, Node]) -> ShardReplica:
    """Two acks=all writes at a and the group's mark 1 committed; returns c's replica once it
    serves a snapshot from that mark."""
    grant(nodes["a"])
    await nodes["a"].produce(QUEUE, [b"k0", b"k1"], [b"v0", b"v1"], None, None, acks=-1)
    await nodes["a"].commit_group(QUEUE, GROUP, 1, None)
    tail = nodes["c"].replicas[0]
    await until(lambda: read_mark(tail, KEY)[0] == 1, "c holds the mark 1")
    page = await nodes["c"].consume(QUEUE, GROUP, after=None, upto=None, limit=10, wait_ms=0)
    assert page.hwm == 1
    return tail


async def cut_middle(nodes: dict[str, Node], *, for_good: bool) -> None:
    """Ends the middle's link to the head (``for_good``: and stops it subscribing again)."""
    middle = nodes["b"].replicas[0]
    if for_good:
        next(link for link in nodes["b"]._links if link.replica is middle).stop()
    stream = middle.upstream_stream
    assert stream is not None
    stream.close()


@dataclass
class Held:
    """The mark 2 committed at the head, forwarded by the middle, durable on the tail; the
    middle's store commits held until ``release`` is set; ``commit`` the group commit's call."""

    tail: ShardReplica
    middle: ShardReplica
    release: asyncio.Event
    commit: asyncio.Task[int]


@contextlib.asynccontextmanager
async def mark_2_held(nodes: dict[str, Node]) -> AsyncIterator[Held]:
    """The mark 1 committed (``marked``), then the mark 2 at the head, forwarded, durable on the
    tail while the middle's commits are held (released on exit)."""
    tail = await marked(nodes)
    middle = nodes["b"].replicas[0]
    release = hold_commits(middle)
    commit = asyncio.create_task(nodes["a"].commit_group(QUEUE, GROUP, 2, None))
    try:
        await until(lambda: read_mark(tail, KEY)[0] == 2, "c holds the mark 2")
        yield Held(tail, middle, release, commit)
    finally:
        release.set()
        if not commit.done():
            commit.cancel()
        await asyncio.gather(commit, return_exceptions=True)
