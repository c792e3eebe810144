"""Reading a running cluster for ``kayos ctl``: the topology, then every node's status at once
(``kayos ctl status`` and ``kayos ctl check`` share it)."""

from __future__ import annotations

import asyncio
from typing import Any

from kayos.cli.ctl.status.common import NodeAnswer
from kayos.cli.ctl.status.view import summarise, unreachable


async def fetch_summary(
    urls: list[str], timeout_s: float, hint: str = "", *, groups: bool = False
) -> dict[str, Any]:
    """The topology from the first of ``urls`` that serves it, then every node's status at once
    (``hint``: where the URLs came from, for the message when none answers; ``groups``: with
    each tail's consumer groups and their lag, ``GET /v1/status?groups=1``)."""
    from kayos.client.http import HttpTransport
    from kayos.errors import KayosError
    from kayos.topology import Topology

    transport = HttpTransport()
    await transport.open()
    try:
        errors: list[str] = []
        for url in urls:
            try:
                reply = await transport.request("GET", f"{url}/v1/topology", timeout_s=timeout_s)
                topology = Topology.from_json(reply)
                break
            except KayosError as exc:
                errors.append(str(exc))
        else:
            return unreachable(urls, "; ".join(errors), hint)

        async def ask(url: str) -> NodeAnswer:
            try:
                path = f"{url}/v1/status" + ("?groups=1" if groups else "")
                answer = await transport.request("GET", path, timeout_s=timeout_s)
            except KayosError as exc:
                return f"{type(exc).__name__}: {exc}"
            return answer if isinstance(answer, dict) else f"not a status reply: {answer!r:.80}"

        nodes = list(topology.nodes.values())
        answers = await asyncio.gather(*(ask(node.http_url) for node in nodes))
        return summarise(url, topology, {n.id: a for n, a in zip(nodes, answers, strict=True)})
    finally:
        await transport.close()
