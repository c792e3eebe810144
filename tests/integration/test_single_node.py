"""A real `kayos node` process on a loopback port: produce, consume, high-water marks, bad input,
restart, clean stop. (Chain replication tests join these when nodes replicate.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

STARTUP_S = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _request(base: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class NodeProcess:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(data_dir.parent / "node.log", "ab")  # noqa: SIM115 - closed in close()

    def close(self) -> None:
        if self.process is not None:
            self.stop(signal.SIGKILL)
        self._log.close()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kayos.cli.main",
                "node",
                "--data",
                str(self.data_dir),
                "--port",
                str(self.port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.data_dir.parent / "node.log").read_text()
            try:
                status, _ = _request(self.base, "GET", "/v1/status")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)  # polling a condition with a bound, not synchronising on time
        raise AssertionError(f"node did not answer within {STARTUP_S}s")

    def stop(self, sig: int = signal.SIGINT) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(timeout=30)
        self.process = None
        return code

    def call(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        return _request(self.base, method, path, data)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path / "node")
    process.start()
    yield process
    process.close()


def test_produce_consume_dedup_and_commit(node: NodeProcess) -> None:
    status, first = node.call(
        "POST",
        "/v1/queues/jobs/messages",
        {
            "messages": [
                {"key": "a", "value": "1"},
                {"key": "b", "value": "1"},
                {"key": "a", "value": "2"},
            ]
        },
    )
    assert status == 200
    assert first == {"first_seq": 1, "last_seq": 3}
    status, page = node.call("GET", "/v1/queues/jobs/consume?group=g")
    assert status == 200
    assert [(m["seq"], m["key"], m["value"]) for m in page["messages"]] == [
        (2, "b", "1"),
        (3, "a", "2"),
    ]
    assert page["end"]
    assert page["boundary"] == 3
    assert node.call("POST", "/v1/queues/jobs/groups/g/commit", {"hwm": page["next_hwm"]})[0] == 200
    status, page = node.call("GET", "/v1/queues/jobs/consume?group=g")
    assert page["messages"] == []
    assert page["hwm"] == 3
    status, group = node.call("GET", "/v1/queues/jobs/groups/g")
    assert group == {"hwm": 3, "last_seq": 3, "lag": 0}


def test_paging_through_one_snapshot(node: NodeProcess) -> None:
    messages = [{"key": f"k{i}", "value": str(i)} for i in range(25)]
    assert node.call("POST", "/v1/queues/q/messages", {"messages": messages})[0] == 200
    seen: list[int] = []
    after, upto = 0, -1
    while True:
        _, page = node.call(
            "GET", f"/v1/queues/q/consume?group=g&limit=10&after={after}&upto={upto}"
        )
        if upto < 0:
            upto = page["boundary"]
            node.call(
                "POST", "/v1/queues/q/messages", {"messages": [{"key": "late", "value": "x"}]}
            )
        seen += [m["seq"] for m in page["messages"]]
        after = page["next_hwm"]
        if page["end"]:
            break
    assert seen == list(range(1, 26)), "the late message waits for the next snapshot"


@pytest.mark.parametrize(
    ("path", "raw", "status", "code"),
    [
        ("/v1/queues/jobs/messages", b"{not json", 400, "invalid_request"),
        (
            "/v1/queues/jobs/messages",
            json.dumps({"messages": [{"key": "k" * 300, "value": "v"}]}).encode(),
            413,
            "limit_exceeded",
        ),
        (
            "/v1/queues/bad.name/messages",
            json.dumps({"messages": [{"key": "k", "value": "v"}]}).encode(),
            400,
            "invalid_request",
        ),
        (
            "/v1/queues/jobs/messages",
            json.dumps({"messages": [{"key": 1, "value": "v"}]}).encode(),
            400,
            "invalid_request",
        ),
        ("/v1/queues/jobs/messages", json.dumps({"messages": []}).encode(), 400, "invalid_request"),
    ],
    ids=["malformed-json", "oversize-key", "bad-queue-name", "key-not-string", "empty-batch"],
)
def test_bad_requests_change_nothing(
    node: NodeProcess, path: str, raw: bytes, status: int, code: str
) -> None:
    assert (
        node.call("POST", "/v1/queues/jobs/messages", {"messages": [{"key": "x", "value": "y"}]})[0]
        == 200
    )
    got_status, reply = node.call("POST", path, raw=raw)
    assert (got_status, reply["error"]) == (status, code), reply
    assert reply["message"]
    _, page = node.call("GET", "/v1/queues/jobs/consume?group=g")
    assert [m["key"] for m in page["messages"]] == ["x"]


def test_restart_keeps_messages_and_high_water_marks(tmp_path: Path) -> None:
    process = NodeProcess(tmp_path / "node")
    process.start()
    try:
        process.call("POST", "/v1/queues/jobs/messages", {"messages": [{"key": "a", "value": "1"}]})
        process.call("POST", "/v1/queues/jobs/groups/g/commit", {"hwm": 1})
        assert process.stop(signal.SIGKILL) != 0
        process.start()
        _, group = process.call("GET", "/v1/queues/jobs/groups/g")
        assert group["hwm"] == 1
        assert group["last_seq"] == 1
        assert process.stop(signal.SIGINT) == 0, "Ctrl-C stops the node cleanly"
    finally:
        process.close()
    assert os.path.isdir(tmp_path / "node" / "queues" / "jobs")
