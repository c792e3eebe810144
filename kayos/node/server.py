"""Running nodes: one node in this process (``kayos node``), or a local set (``kayos up``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from aiohttp import web

from kayos.node.app import Node, make_app


async def serve(data_dir: str, host: str, port: int, ready: asyncio.Event | None = None) -> None:
    """Serves until SIGINT/SIGTERM, then closes every store cleanly."""
    node = Node(data_dir)
    runner = web.AppRunner(make_app(node), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        node.close()
