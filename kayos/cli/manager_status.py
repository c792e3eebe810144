"""Asking the cluster manager's members for their status (kayos ctl status and the operator
commands share it)."""

from __future__ import annotations

import asyncio

from kayos.cli.status_view import NodeAnswer


async def fetch_manager(urls: list[str], timeout_s: float) -> NodeAnswer:
    """The leader's ``GET /v1/manager/status`` if it answers, else any member's; else why not."""
    from kayos.client.http import HttpTransport
    from kayos.errors import KayosError

    transport = HttpTransport()
    await transport.open()
    try:

        async def ask(url: str) -> NodeAnswer:
            try:
                answer = await transport.request(
                    "GET", f"{url}/v1/manager/status", timeout_s=timeout_s
                )
            except KayosError as exc:
                return f"{type(exc).__name__}: {exc}"
            return answer if isinstance(answer, dict) else f"not a status reply: {answer!r:.80}"

        answers = await asyncio.gather(*(ask(url) for url in urls))
        found = [a for a in answers if isinstance(a, dict)]
        for answer in found:
            if answer.get("member") is not None and answer.get("member") == answer.get("leader"):
                return answer
        if found:
            return found[0]
        return "; ".join(str(a) for a in answers)
    finally:
        await transport.close()
