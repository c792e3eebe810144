"""How ``AsyncClient.consume`` pages a consumer snapshot (docs/node-api.md, "Consume"): every
shard's first page at once, a long-poll over all of them when none has entries, and each next page
asked for while the caller works on the one before. ``fetch`` is the client's request for one page
(routed and retried); what is here only orders the requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from kayos.client.types import Page
from kayos.errors import ProtocolError

# One page: (shard, query parameters, how long the node may long-poll in seconds).
Fetch = Callable[[int, dict[str, str], float], Awaitable[Page]]


def forget(task: asyncio.Task[Any]) -> None:
    """Marks a dropped task's outcome as seen (no "exception was never retrieved" warning)."""
    if not task.cancelled():
        task.exception()


async def first_pages(
    fetch: Fetch, shards: tuple[int, ...], params: dict[str, str], wait_ms: int
) -> list[Page]:
    """Every shard's first page at once; with ``wait_ms`` and all of them empty, long-polls
    every shard and, once one has entries, reads the others anew without waiting."""
    pages = await asyncio.gather(*(fetch(s, params, 0.0) for s in shards))
    if not wait_ms or any(len(page) or not page.end for page in pages):
        return list(pages)
    waiting = dict(params, wait_ms=str(wait_ms))
    polls = [asyncio.ensure_future(fetch(s, waiting, wait_ms / 1000)) for s in shards]
    try:
        done, _pending = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
        found = next(iter(done)).result()
    finally:
        for poll in polls:
            if not poll.done():
                poll.cancel()
                poll.add_done_callback(forget)
    others = [s for s in shards if s != found.shard]
    rest = await asyncio.gather(*(fetch(s, params, 0.0) for s in others))
    return [found, *rest]


async def snapshot_pages(
    fetch: Fetch, page: Page, params: dict[str, str]
) -> AsyncGenerator[Page, None]:
    """The pages of one shard's snapshot from its first ``page``."""
    pending: asyncio.Task[Page] | None = None
    try:
        while True:
            if not page.end:
                # The next page's position is known: its request runs while the caller
                # works on this page (node and client overlap instead of taking turns).
                later = dict(params, after=str(page.next), upto=str(page.boundary))
                pending = asyncio.ensure_future(fetch(page.shard, later, 0.0))
            yield page
            if pending is None:
                return
            after = page.next
            following = await pending
            pending = None
            if following.boundary != page.boundary or (
                following.next <= after and not following.end
            ):
                raise ProtocolError(
                    f"consume page after {after} broke the snapshot (boundary "
                    f"{page.boundary} -> {following.boundary}, next {following.next})"
                )
            page = following
    finally:
        if pending is not None:  # the caller stopped early: drop the page asked for ahead
            pending.cancel()
            pending.add_done_callback(forget)
