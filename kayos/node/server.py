"""Running one node in this process (``kayos node --config F --id N --data D``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal

from aiohttp import web

from kayos import limits
from kayos.node.app import make_app
from kayos.node.runtime import Node
from kayos.topology import Topology


def tune_gc() -> None:
    """Fewer, not longer, garbage collections: a node's hot path allocates many short-lived
    acyclic objects (freed by reference counting) and keeps a large cache of recent batches that
    every full collection would walk again; collection pauses show up as commit latency."""
    gc.collect()
    gc.freeze()  # what start-up allocated (modules, config) is never scanned again
    gc.set_threshold(*limits.gc_thresholds)


async def serve(
    topology: Topology, node_id: str, data_dir: str, ready: asyncio.Event | None = None
) -> None:
    """Serves until SIGINT/SIGTERM, then closes links and stores cleanly."""
    node = Node(topology, node_id, data_dir)
    await node.start()
    tune_gc()
    # keepalive_timeout also runs from a connection's start until its first request is whole
    # (aiohttp >= 3.10), so it drops half-sent requests as well as idle keep-alive connections.
    runner = web.AppRunner(
        make_app(node),
        access_log=None,
        keepalive_timeout=limits.http_idle_ms_max / 1000,
        shutdown_timeout=limits.http_shutdown_ms_max / 1000,
    )
    await runner.setup()
    site = web.TCPSite(runner, node.address.host, node.address.http_port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    logging.getLogger("kayos.node").info(
        "node %s serving http %s bin %s", node_id, node.address.http_port, node.address.bin_port
    )
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await node.stop()
