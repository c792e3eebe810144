"""The manager members of a local cluster (``kayos up``, tests): their addresses, how one is
started, and when the group is ready. A face: it reaches members over HTTP only
(``GET /v1/manager/status``, docs/manager.md)."""

from __future__ import annotations

import sys
import time
from typing import Any

from kayos.local.http import http_json
from kayos.manager.member.config import MemberAddr

# Members of a local cluster: three survive one failure (docs/manager.md).
MANAGERS_DEFAULT = 3
# A group elects a leader within about a second (Raft election timeouts in kayos/limits.py);
# this bound trips only on a member that cannot start or reach the others.
leader_timeout_s_default = 30.0
# One status request to a member.
status_timeout_s = 1.0
# How often the group's readiness is polled: a bounded poll of a condition.
poll_interval_s = 0.05


def manager_ids(count: int) -> list[str]:
    if not 0 <= count <= 7:
        raise ValueError("manager members must be 0 .. 7")
    return [f"m{i + 1}" for i in range(count)]


def members_on(ids: list[str], host: str, ports: list[int]) -> list[MemberAddr]:
    """Member i gets ``ports[i]`` for Raft and ``ports[len(ids) + i]`` for HTTP."""
    count = len(ids)
    assert len(ports) == 2 * count, (ids, ports)
    return [MemberAddr(m, host, ports[i], ports[count + i]) for i, m in enumerate(ids)]


def manager_command(topology_path: str, member: str, data_dir: str) -> list[str]:
    return [
        sys.executable, "-m", "kayos", "manager",
        "--topology", topology_path, "--id", member, "--data", data_dir,
    ]  # fmt: skip


def member_status(member: MemberAddr, cluster_secret: bytes | None = None) -> dict[str, Any] | None:
    """The member's ``GET /v1/manager/status`` reply, or None if it does not answer with one.
    ``cluster_secret``: the request proves the cluster's own principal (a cluster that holds
    client credentials answers its status to an admin only: docs/security.md)."""
    try:
        code, body = http_json(  # inside TLS when the process installed it (kayos.tlsconfig)
            member.http_url + "/v1/manager/status",
            timeout_s=status_timeout_s,
            cluster_secret=cluster_secret,
        )
    except (OSError, ValueError):
        return None
    return body if code == 200 and isinstance(body, dict) else None


def wait_leader(
    members: list[MemberAddr],
    timeout_s: float = leader_timeout_s_default,
    cluster_secret: bytes | None = None,
) -> str | None:
    """The member every live member names as leader, once they agree and it leads (its own
    status says so); None if the bound passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answers = (member_status(m, cluster_secret) for m in members)
        statuses = [s for s in answers if s is not None]
        leaders = {s.get("leader") for s in statuses}
        if statuses and len(leaders) == 1:
            leader = leaders.pop()
            if any(s.get("member") == leader and s.get("ready") for s in statuses):
                return str(leader)
        time.sleep(poll_interval_s)  # a bounded poll of a condition
    return None
