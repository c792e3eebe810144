"""The supervisor's report that a node process exited (docs/manager.md, "Evidence and proof of
death"): ``kayos up`` is the parent of every node process and learns of each exit from the kernel,
so before it starts the node again it tells the manager members, signed (purpose ``exited``),
which process (the incarnation in the node's ``DATA/incarnation``) is gone. The leader logs it as
proof of death; a follower answers 421 with the leader's URL. A face: HTTP only.
"""

from __future__ import annotations

from typing import Any

from kayos.datadir import read_incarnation
from kayos.identity import ClusterIdentity
from kayos.local.http import http_json
from kayos.signing import sign

# One report request to a member: the supervisor waits for it before it restarts the node (a
# report that arrives after the restart names a dead incarnation and changes nothing, but the
# new process would be spliced out if the view had not heard it yet).
report_timeout_s = 1.0
# Members tried (redirects followed) for one report: each of three members and a redirect or two.
report_tries_max = 5


def exit_message(
    identity: ClusterIdentity, node: str, incarnation: str, code: int
) -> dict[str, Any]:
    """The signed report: ``{"body": {"node", "incarnation", "code"}, "mac"}``."""
    body = {"node": node, "incarnation": incarnation, "code": code}
    return {"body": body, "mac": sign(identity, "exited", body)}


def report_exit(
    identity: ClusterIdentity, urls: list[str], node: str, data_dir: str, code: int
) -> str:
    """Posts the report of ``node``'s exit to the members at ``urls`` (the leader's answer
    ends it; a follower's redirect is followed); what happened, for the supervisor's output."""
    incarnation = read_incarnation(data_dir)
    if incarnation is None:
        return "no incarnation to report (the process wrote none)"
    if not urls:
        return "no manager to report to"
    message = exit_message(identity, node, incarnation, code)
    pending = list(urls)
    last = "no member answered"
    for _ in range(report_tries_max):
        if not pending:
            break
        url = pending.pop(0)
        try:
            status, reply = http_json(
                f"{url}/v1/manager/exited", method="POST", body=message, timeout_s=report_timeout_s
            )
        except (OSError, ValueError) as exc:
            last = f"{url}: {exc}"
            continue
        if status == 200 and isinstance(reply, dict):
            return f"reported to the manager (incarnation {incarnation}: {reply.get('state')})"
        error = reply.get("error") if isinstance(reply, dict) else None
        redirect = error.get("redirect") if isinstance(error, dict) else None
        if status == 421 and isinstance(redirect, str) and redirect not in pending:
            pending.insert(0, redirect)
        last = f"{url}: HTTP {status}: {reply!r:.120}"
    return f"not reported: {last}"
