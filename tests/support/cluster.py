"""Real `kayos node` processes on loopback (kayos.local.cluster.LocalCluster) and the plain-HTTP
calls of docs/node-api.md the integration tests make. Every wait is a bounded poll of a
condition."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.signing import sign

# Bounds of the waits below: generous for 2 shared cores, and only ever reached by a failure.
WAIT_S = 30.0
# An acks=all produce may wait for a restarted replica (the node's own bound is 30 s).
PRODUCE_TIMEOUT_S = 60.0


@contextlib.contextmanager
def small_disk(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``mount_point`` (made if missing), unmounted after: a
    node's data directory whose disk fills (docs/retention.md, "Disk full"). Needs root; the test
    is skipped, saying why, without it or when the mount fails."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs of a fixed size needs root")
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def write_ballast(path: Path, size_bytes: int) -> None:
    """A file of ``size_bytes`` zeros: space a test frees later by deleting it."""
    with path.open("wb") as out:
        out.write(b"\0" * size_bytes)


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Polls ``condition`` until it returns something truthy; fails the test after the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)  # a bounded poll of a condition, not a synchronisation by time


def produce(
    url: str,
    queue: str,
    messages: list[tuple[str, str | None]],
    *,
    acks: str = "all",
    txn: bool | None = None,
) -> tuple[int, Any]:
    """``POST /v1/queues/{q}/messages``; ``None`` as a value deletes the key."""
    body: dict[str, Any] = {
        "messages": [
            {"key": k, "delete": True} if v is None else {"key": k, "value": v} for k, v in messages
        ]
    }
    if txn is not None:
        body["txn"] = txn
    return http_json(
        f"{url}/v1/queues/{queue}/messages?acks={acks}",
        method="POST",
        body=body,
        timeout_s=PRODUCE_TIMEOUT_S,
    )


def produce_ok(url: str, queue: str, messages: list[tuple[str, str | None]]) -> tuple[int, int]:
    """``produce`` that must succeed with one seq per message; its first and last seq."""
    status, reply = produce(url, queue, messages)
    assert status == 200, reply
    assert reply["last_seq"] - reply["first_seq"] + 1 == len(messages), reply
    return int(reply["first_seq"]), int(reply["last_seq"])


@dataclass
class Snapshot:
    """One consumer snapshot ``(hwm, boundary]`` as ``read_snapshot`` read it, page by page."""

    hwm: int
    boundary: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    pages: int = 0


def read_snapshot(
    url: str, queue: str, group: str, *, limit: int = 1000, wait_ms: int = 0
) -> Snapshot:
    """Reads one consumer snapshot ``(hwm, boundary]`` page by page, as of one boundary; with
    ``wait_ms`` the first request long-polls for new commits."""
    status, page = http_json(
        f"{url}/v1/queues/{queue}/consume?group={group}&limit={limit}&wait_ms={wait_ms}"
    )
    assert status == 200, page
    snapshot = Snapshot(page["hwm"], page["boundary"], list(page["messages"]), 1)
    while not page["end"]:
        status, page = http_json(
            f"{url}/v1/queues/{queue}/consume?group={group}&limit={limit}"
            f"&after={page['next']}&upto={snapshot.boundary}"
        )
        assert status == 200, page
        assert page["boundary"] == snapshot.boundary, "every page is read as of one boundary"
        snapshot.messages += page["messages"]
        snapshot.pages += 1
    return snapshot


def http_raw(url: str, data: bytes, content_type: str, *, method: str = "POST") -> tuple[int, Any]:
    """A request with a body as given (for malformed bodies); the reply decoded as JSON."""
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read() or b"null")


def commit_group(url: str, queue: str, group: str, hwm: int) -> None:
    """Commits ``group``'s mark ``hwm`` on ``queue`` at ``url``; it must be taken as given."""
    status, reply = http_json(
        f"{url}/v1/queues/{queue}/groups/{group}/commit",
        method="POST",
        body={"hwm": hwm},
        timeout_s=PRODUCE_TIMEOUT_S,
    )
    assert status == 200, reply
    assert reply["hwm"] == hwm, reply


def shard_seqs(cluster: LocalCluster, node: str, shard: int) -> tuple[int, int] | None:
    """``(last_seq, committed_seq)`` of one replica from ``GET /v1/status``; None when the node
    gives no answer or holds no replica of ``shard``: for a condition polled by ``wait_until``
    only (a read outside a wait uses ``answered_seqs``)."""
    status = cluster.status(node)
    if status is None:
        return None
    replica = status["shards"].get(str(shard))
    return None if replica is None else (int(replica["last_seq"]), int(replica["committed_seq"]))


def answered_status(cluster: LocalCluster, node: str, timeout_s: float = WAIT_S) -> dict[str, Any]:
    """The node's ``GET /v1/status`` reply, asked again until it gives one (within the bound).
    ``LocalCluster.status`` returns None for a request that got no reply in its short timeout,
    as on a loaded box: that is no answer, never one to assert on."""
    status: dict[str, Any] = wait_until(
        lambda: cluster.status(node), f"{node} to answer GET /v1/status", timeout_s
    )
    return status


def answered_replica(cluster: LocalCluster, node: str, shard: int = 0) -> dict[str, Any] | None:
    """The node's replica of ``shard`` in an answered status; None only when the node answered
    and holds no replica of it (never for a node that gave no answer)."""
    found = answered_status(cluster, node)["shards"].get(str(shard))
    return found if isinstance(found, dict) else None


def answered_seqs(cluster: LocalCluster, node: str, shard: int) -> tuple[int, int]:
    """``(last_seq, committed_seq)`` of a replica the node holds, from an answered status."""
    replica = answered_replica(cluster, node, shard)
    assert replica is not None, f"{node} answered holding no replica of shard {shard}"
    return int(replica["last_seq"]), int(replica["committed_seq"])


def fingerprint(cluster: LocalCluster, queue: str) -> tuple[Any, Any]:
    """Every replica's seqs and ``queue``'s content as a consumer sees it: what a refused request
    must leave as it was. Read once the replicas agree: a member learns the commit point of
    its last batch a moment after the tail has it, and a refused request that wrote anything
    still shows (the seqs differ once settled)."""
    cluster.wait_replicated()
    seqs = {}
    for node in cluster.topology.nodes:
        status = answered_status(cluster, node)
        seqs[node] = {
            shard: (replica["last_seq"], replica["committed_seq"])
            for shard, replica in status["shards"].items()
        }
    tail = cluster.url(cluster.tails_of(queue)[0])
    return seqs, read_snapshot(tail, queue, "observer").messages


def catch_up(cluster: LocalCluster, node: str, body: dict[str, Any], *, mac: str | None = None):
    """A signed ``POST /v1/admin/catch-up`` of ``body`` to ``node`` (``mac``: a forged one)."""
    assert cluster.identity is not None
    signed = {"body": body, "mac": mac or sign(cluster.identity, "catch-up", body)}
    return http_json(f"{cluster.url(node)}/v1/admin/catch-up", method="POST", body=signed)


def shard_status(cluster: LocalCluster, node: str, shard: int = 0) -> dict[str, Any] | None:
    """The node's replica of ``shard``, None when it holds none or gives no answer: for a
    condition polled by ``wait_until`` (a read outside a wait uses ``answered_replica``)."""
    status = cluster.status(node)
    if status is None:
        return None
    found = status["shards"].get(str(shard))
    return found if isinstance(found, dict) else None


def learned_through(cluster: LocalCluster, node: str, seq: int) -> bool:
    """The learner on ``node`` is linked to its upstream and holds exactly through ``seq``."""
    learner = shard_status(cluster, node)
    return (
        learner is not None
        and learner["role"] == "learner"
        and learner["upstream_linked"]
        and learner["durable_seq"] == seq
    )


def ctl(*args: str) -> tuple[int, Any, str]:
    """Runs ``kayos ctl ARGS``: its exit code, its stdout (parsed when ``--json``), its stderr."""
    command = [sys.executable, "-m", "kayos", "ctl", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=4 * WAIT_S, check=False)
    out: Any = done.stdout
    if "--json" in args and done.stdout.strip():
        out = json.loads(done.stdout)
    return done.returncode, out, done.stderr


def served_metric(cluster: LocalCluster, node: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name{labels...}`` ``node`` serves at ``GET /metrics`` (other
    labels ignored), None when it serves none."""
    with urllib.request.urlopen(f"{cluster.url(node)}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            return float(match.group(2))
    return None
