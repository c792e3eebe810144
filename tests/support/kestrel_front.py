"""The Kestrel front as a real process: started on any free ports, its replies read within a bound,
and what a Kayos cluster behind it holds of a Kestrel queue (the tail's log, the group state of
every member)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack

from kayos.local.cluster import LocalCluster
from kestrel_compat.backends.kayos_backend import queue_for
from kestrel_compat.core.persistence import decode_removed
from tests.support.cluster import WAIT_S, wait_until
from tests.support.layout import REPO_ROOT

STARTUP_S = 30.0
REPLY_S = 5.0


class KestrelProcess:
    """``python -m kestrel_compat`` on loopback, every front on a free port, its log in
    ``tmp_path``; ``close`` stops it (SIGTERM, then kill)."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        config: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``args`` go on the command line; ``env`` is added to this process's environment."""
        self.host = "127.0.0.1"
        self.port = 0
        command = [sys.executable, "-m", "kestrel_compat", "--host", self.host, "--port", "0"]
        command += list(args)
        # Any free ports for the text and thrift fronts too, so parallel runs never collide.
        command += ["--text-port", "0", "--thrift-port", "0"]
        if config is not None:
            path = tmp_path / "kestrel.toml"
            path.write_text(config)
            command += ["--config", str(path)]
        self._log = open(tmp_path / "kestrel.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **(env or {})},
        )
        self.port = self._read_port()

    def _read_port(self) -> int:
        assert self.process.stdout is not None
        deadline = time.monotonic() + STARTUP_S
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the server did not report its port in time"
            ready, _, _ = select.select([self.process.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 1)
                assert chunk, "the server exited before listening"
                line += chunk
        assert line.startswith(b"kestrel listening on "), line
        return int(line.rsplit(b":", 1)[1])

    def connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=REPLY_S)
        return sock

    def wait_exit(self, timeout_s: float) -> int:
        return self.process.wait(timeout=timeout_s)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


def read_exactly(sock: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes from ``sock`` (fewer at EOF), within ``REPLY_S``."""
    data = b""
    deadline = time.monotonic() + REPLY_S
    while len(data) < size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or a reset), waiting at most ``REPLY_S``."""
    sock.settimeout(REPLY_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def node_get(url: str) -> Any:
    """A node's msgpack answer to a GET of ``url``; None when it gives none."""
    request = urllib.request.Request(url, headers={"Accept": "application/msgpack"})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return msgpack.unpackb(response.read(), raw=False)
    except (urllib.error.URLError, OSError):
        return None


def tail_entries(cluster: LocalCluster, queue: str) -> dict[str, int]:
    """Every entry of the Kestrel queue's log on its shard's tail above its retention floor,
    value -> seq: the front keeps its queues `until_consumed` (docs/retention.md), so confirmed
    items may be gone below the floor, and a read from below it is refused (410)."""
    kayos_queue = queue_for(queue)
    url = cluster.url(cluster.tails_of(kayos_queue)[0])
    page = None

    def first_page() -> bool:
        # A restarted tail refuses reads while it catches up (503), and the floor may rise
        # between the two requests (410): ask again until it answers, within the bound.
        nonlocal page
        retention = node_get(f"{url}/v1/queues/{kayos_queue}/retention")
        floor = int(retention.get("floor") or 0) if isinstance(retention, dict) else 0
        page = node_get(
            f"{url}/v1/queues/{kayos_queue}/consume?group=probe&limit=1000&after={floor}"
        )
        return page is not None

    wait_until(first_page, f"the tail of {kayos_queue} to answer a read from its floor")
    assert page is not None
    found = {m["value"].decode(): m["seq"] for m in page["messages"]}
    while not page["end"]:
        page = node_get(
            f"{url}/v1/queues/{kayos_queue}/consume?group=probe&limit=1000"
            f"&after={page['next']}&upto={page['boundary']}"
        )
        assert page is not None, "the tail did not answer"
        found.update({m["value"].decode(): m["seq"] for m in page["messages"]})
    return found


def removed_everywhere(cluster: LocalCluster, queue: str, seqs: list[int]) -> bool:
    """True once every member's replica of the queue's group state marks each seq removed."""
    kayos_queue = queue_for(queue)
    for node in cluster.topology.chain_for(kayos_queue).members:
        info = node_get(f"{cluster.url(node)}/v1/queues/{kayos_queue}/groups/{queue}")
        if info is None:
            return False
        hwm, blob = int(info["hwm"]), info.get("state") or b""
        removed = decode_removed(hwm, blob)
        if not all(seq <= hwm or seq in removed for seq in seqs):
            return False
    return True
