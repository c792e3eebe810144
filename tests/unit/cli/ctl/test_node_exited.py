"""`kayos ctl node-exited` (docs/manager.md, "Evidence and proof of death"): a supervisor's report
that a node's process ended, signed with the topology file's secret, naming the incarnation the
process wrote to its data directory; systemd's `$EXIT_STATUS` may be a signal's name. A stand-in
manager member on loopback (a thread) checks what arrives."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.datadir import write_incarnation
from kayos.manager.member import config
from kayos.signing import check_signed

pytestmark = pytest.mark.unit


class Member:
    """A manager member that answers every report 200 and keeps what it got."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append({"path": self.path, "message": json.loads(body)})
                reply = json.dumps({"node": "a", "state": "down"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                return

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def member() -> Iterator[Member]:
    running = Member()
    running.thread.start()
    yield running
    running.server.shutdown()
    running.server.server_close()


def topology_with_member(tmp_path: Path, http_port: int) -> Path:
    out = tmp_path / "cluster.toml"
    result = CliRunner().invoke(
        cli,
        ["init", "--out", str(out), "--node", "a=127.0.0.1:7101:7201",
         "--manager", f"m1=127.0.0.1:7301:{http_port}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_report_names_the_process_incarnation_and_is_signed(
    tmp_path: Path, member: Member
) -> None:
    topology = topology_with_member(tmp_path, member.port)
    data = tmp_path / "a"
    data.mkdir()
    write_incarnation(str(data), "5f2c0e1d9a8b7c6d")
    result = CliRunner().invoke(
        cli,
        ["ctl", "node-exited", "a", "--topology", str(topology), "--data", str(data),
         "--code", "KILL"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "reported to the manager" in result.output
    [got] = member.received
    assert got["path"] == "/v1/manager/exited"
    body = got["message"]["body"]
    assert body == {"node": "a", "incarnation": "5f2c0e1d9a8b7c6d", "code": -1}
    identity = config.load(str(topology)).identity
    check_signed(identity, "exited", body, got["message"]["mac"])  # raises if it does not verify


def test_no_member_answering_exits_1_and_says_so(tmp_path: Path) -> None:
    topology = topology_with_member(tmp_path, closed_port())
    data = tmp_path / "a"
    data.mkdir()
    write_incarnation(str(data), "5f2c0e1d9a8b7c6d")
    result = CliRunner().invoke(
        cli, ["ctl", "node-exited", "a", "--topology", str(topology), "--data", str(data)]
    )
    assert result.exit_code == 1
    assert "not reported" in result.output


def test_a_process_that_wrote_no_incarnation_is_not_reported(
    tmp_path: Path, member: Member
) -> None:
    topology = topology_with_member(tmp_path, member.port)
    result = CliRunner().invoke(
        cli,
        ["ctl", "node-exited", "a", "--topology", str(topology), "--data", str(tmp_path / "none")],
    )
    assert result.exit_code == 1
    assert "no incarnation" in result.output
    assert member.received == []
