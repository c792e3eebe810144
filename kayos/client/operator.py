"""What an operator asks of the cluster manager (docs/manager.md): its members' status, and the
signed operator requests (rule 7, ``POST /v1/manager/operator``: add-node, drain, move-shard,
rebalance, queue-create, queue-alter).

A request names the view's epoch, read from the members just before, and is signed with the
cluster secret (purpose ``operator``); after an election or a stale epoch it is asked again.
``kayos ctl`` sends one through ``post_operator`` (a bounded number of tries; the outcome as a
dict it prints), the benchmarks and the chaos campaign through ``post_operator_until`` (tries
until a deadline; the reply, or an exception).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from kayos import limits
from kayos.client.http import HttpTransport
from kayos.errors import KayosError, NotLeaderError
from kayos.identity import ClusterIdentity
from kayos.signing import sign

# A member's ``GET /v1/manager/status`` reply, or why there is none.
ManagerAnswer = dict[str, Any] | str
# Between two tries of ``post_operator_until``: an election or a stale epoch settles in this.
retry_pause_s = 0.05


async def fetch_manager(urls: list[str], timeout_s: float) -> ManagerAnswer:
    """The leader's ``GET /v1/manager/status`` if it answers, else any member's; else why not."""
    transport = HttpTransport()
    await transport.open()
    try:

        async def ask(url: str) -> ManagerAnswer:
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


def operator_message(identity: ClusterIdentity, body: dict[str, Any], epoch: int) -> dict[str, Any]:
    """``body`` at ``epoch``, signed with the cluster secret: what the members check."""
    signed_body = {**body, "epoch": epoch}
    return {"body": signed_body, "mac": sign(identity, "operator", signed_body)}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of an operator request: the manager's ``reply`` once it applied it, else ``error``
    (why not, when there is something to say) and whether trying ``again`` may go otherwise."""

    reply: dict[str, Any] | None
    error: str | None
    again: bool


async def attempt_operator(
    transport: HttpTransport, identity: ClusterIdentity, urls: list[str], body: dict[str, Any]
) -> Attempt:
    """Reads the view's epoch and leader from the members, posts the signed request there."""
    answer = await fetch_manager(urls, limits.ctl_status_timeout_ms_default / 1000)
    if not isinstance(answer, dict):
        return Attempt(None, f"no manager answered: {answer}", again=True)
    url = answer.get("leader_url") or answer.get("members", {}).get(answer.get("member"))
    try:
        reply = await transport.request(
            "POST",
            f"{url}/v1/manager/operator",
            timeout_s=limits.manager_apply_timeout_ms / 1000,
            body=operator_message(identity, body, answer["epoch"]),
        )
    except NotLeaderError as exc:
        return Attempt(None, f"{url}: {exc}", again=True)  # an election: ask again
    except KayosError as exc:
        # A stale epoch or an unreachable leader may pass; any other refusal every member gives.
        again = str(exc).startswith("stale_epoch") or exc.code in ("unavailable", "timeout")
        return Attempt(None, f"{url}: {exc.code}: {exc}", again)
    if isinstance(reply, dict):
        return Attempt(reply, None, again=False)
    return Attempt(None, None, again=True)


async def post_operator(
    identity: ClusterIdentity,
    urls: list[str],
    body: dict[str, Any],
    tries: int = limits.ctl_operator_tries_max,
) -> dict[str, Any]:
    """``kayos ctl``'s outcome of ``body`` (``"op"`` names it) sent to the members at ``urls``:
    ``{"ok": True, "error": None, **reply, "op": op}``, or ``ok`` false with the last errors
    once ``tries`` are spent or the manager refused it."""
    op = str(body["op"])
    errors: list[str] = []
    transport = HttpTransport()
    await transport.open()
    try:
        for _ in range(tries):
            attempt = await attempt_operator(transport, identity, urls, body)
            if attempt.reply is not None:
                return {"ok": True, "error": None, **attempt.reply, "op": op}
            if attempt.error is not None:
                errors.append(attempt.error)
            if not attempt.again:
                break
        return {"ok": False, "op": op, "error": "; ".join(errors[-3:]) or "no manager member"}
    finally:
        await transport.close()


def post_operator_until(
    identity: ClusterIdentity, urls: list[str], body: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """The manager's reply to ``body``, asked again through elections, stale epochs and
    unreachable members until ``timeout_s``: ``RuntimeError`` if the manager refused it,
    ``TimeoutError`` if no try was applied in time. Runs an event loop of its own: call it from a
    thread that runs none."""
    return asyncio.run(_post_until(identity, urls, body, timeout_s))


async def _post_until(
    identity: ClusterIdentity, urls: list[str], body: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: str | None = None
    transport = HttpTransport()
    await transport.open()
    try:
        while time.monotonic() < deadline:
            attempt = await attempt_operator(transport, identity, urls, body)
            if attempt.reply is not None:
                return attempt.reply
            last = attempt.error or last
            if not attempt.again:
                raise RuntimeError(f"operator request {body['op']} refused: {last}")
            await asyncio.sleep(retry_pause_s)  # a bounded retry of an election or a stale epoch
    finally:
        await transport.close()
    raise TimeoutError(f"operator request {body['op']} not applied within {timeout_s}s: {last}")
