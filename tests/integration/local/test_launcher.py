"""LocalCluster on its own, with a stub node: a tiny HTTP server that reads the topology file and
answers ``GET /v1/status`` (docs/node-api.md). Checks ports, readiness, restart, stop and the
errors that quote a node's log."""

from __future__ import annotations

import pathlib
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from kayos import limits
from kayos.local.cluster import LocalCluster, build_topology, node_ids
from kayos.local.ports import free_ports
from kayos.local.processes import ClusterError
from kayos.local.up import supervise
from kayos.topology import NodeAddr, Topology

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    from pathlib import Path

STUB_NODE = textwrap.dedent(
    """
    import argparse, http.server, json, os, signal, sys, time, tomllib

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--id")
    parser.add_argument("--data")
    args = parser.parse_args()
    mode = os.environ.get("STUB_MODE", "ok")
    if mode == "crash":
        print("stub: refusing to start", flush=True)
        sys.exit(3)
    raced = os.path.join(os.path.dirname(args.config), "raced")
    if mode == "race" and not os.path.exists(raced):
        open(raced, "w").close()
        print("OSError: [Errno 98] Address already in use", flush=True)
        sys.exit(1)
    with open(args.config, "rb") as f:
        topology = tomllib.load(f)
    me = topology["nodes"][args.id]
    starts = os.path.join(args.data, "starts")
    with open(starts, "a") as f:
        f.write("x")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            shards = {
                str(s["id"]): {"role": "head", "last_seq": 0, "committed_seq": 0,
                               "catching_up": False}
                for s in topology["shards"] if args.id in s["chain"] + s["fanout"]
            }
            body = json.dumps({"node": args.id, "epoch": topology["epoch"],
                               "ready": mode != "never", "shards": shards}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer((me["host"], me["http_port"]), Handler)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print(f"stub {args.id} on {me['http_port']}", flush=True)
    server.serve_forever()
    """
)


def _cluster(tmp_path: Path, **kwargs: object) -> LocalCluster:
    script = tmp_path / "stub_node.py"
    script.write_text(STUB_NODE)
    return LocalCluster(
        tmp_path / "cluster",
        node_command=[sys.executable, str(script)],
        ready_timeout_s=10.0,
        **kwargs,  # type: ignore[arg-type]
    )


def test_free_ports_are_distinct() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8


def test_free_ports_stay_below_the_ephemeral_range_and_skip_taken_ones() -> None:
    # A port the kernel may hand to an outgoing connection is no port to start a node on.
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral_low = int(ranges.read().split()[0])
    seed = 20261124
    print(f"seed {seed}")
    first = free_ports(1, rng=random.Random(seed))[0]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        ports = free_ports(50, rng=random.Random(seed))  # draws `first` first, and skips it
    assert first not in ports
    assert len(set(ports)) == 50
    assert all(port < ephemeral_low for port in [first, *ports])


def test_rotated_topology_and_fanout() -> None:
    addresses = [NodeAddr(n, "127.0.0.1", 1000 + i, 2000 + i) for i, n in enumerate(node_ids(4))]
    plain = build_topology(addresses[:3], replicas=3)
    assert [plain.shards[i].chain for i in range(3)] == [
        ("a", "b", "c"),
        ("b", "c", "a"),
        ("c", "a", "b"),
    ]
    fan = build_topology(addresses, replicas=2, shard_count=1, fanout=2)
    assert fan.shards[0].chain == ("a", "b")
    assert fan.shards[0].tails == ("c", "d")
    with pytest.raises(ValueError, match="replicas"):
        build_topology(addresses, replicas=3, fanout=2)


def test_start_restart_stop(tmp_path: Path) -> None:
    with _cluster(tmp_path, nodes=3, replicas=3, shards=3) as cluster:
        assert Topology.load(str(cluster.topology_path)) == cluster.topology
        assert set(cluster.urls) == {"a", "b", "c"}
        for node in cluster.urls:
            assert status_once_answered(cluster, node)["node"] == node
        assert cluster.kill("b") == -signal.SIGKILL
        assert not cluster.running("b")
        assert cluster.status("b") is None
        cluster.start("b")
        assert cluster.running("b")
        assert (cluster.data_dir("b") / "starts").read_text() == "xx", "same data directory"
        with pytest.raises(ClusterError, match="already running"):
            cluster.start("b")
    assert cluster.processes == {}
    assert "stub b on" in cluster.log_path("b").read_text()


def test_stop_returns_exit_codes(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, nodes=2, replicas=2)
    cluster.start_all()
    assert cluster.stop() == {"a": 0, "b": 0}


def test_a_node_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, nodes=1, replicas=1, env={"STUB_MODE": "crash"})
    with pytest.raises(ClusterError, match="refusing to start"):
        cluster.start_all()
    assert cluster.processes == {}


def test_a_node_that_never_gets_ready_times_out(tmp_path: Path) -> None:
    script = tmp_path / "stub_node.py"
    script.write_text(STUB_NODE)
    cluster = LocalCluster(
        tmp_path / "cluster",
        nodes=1,
        replicas=1,
        node_command=[sys.executable, str(script)],
        ready_timeout_s=1.0,
        env={"STUB_MODE": "never"},
    )
    with pytest.raises(ClusterError, match="not ready within"):
        cluster.start_all()
    assert cluster.processes == {}


def test_a_lost_port_race_starts_again_on_fresh_ports(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, nodes=2, replicas=2, env={"STUB_MODE": "race"})
    first = cluster.topology
    with cluster:
        assert cluster.topology != first
        assert Topology.load(str(cluster.topology_path)) == cluster.topology


UP_SCRIPT = textwrap.dedent(
    """
    import sys
    from kayos.local.cluster import LocalCluster
    from kayos.local.up import run_foreground

    cluster = LocalCluster(sys.argv[1], nodes=3, replicas=3,
                           node_command=[sys.executable, sys.argv[2]])
    sys.exit(run_foreground(cluster, lambda line: print(line, flush=True)))
    """
)


@pytest.fixture
def up_process(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``run_foreground`` (what ``kayos up`` runs) over stub nodes, in a child process so the
    signals it handles are its own."""
    (tmp_path / "stub_node.py").write_text(STUB_NODE)
    (tmp_path / "up.py").write_text(UP_SCRIPT)
    command = [sys.executable, str(tmp_path / "up.py"), str(tmp_path / "up")]
    with subprocess.Popen(
        [*command, str(tmp_path / "stub_node.py")], stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:  # a hung launcher fails its test, not the run
                    process.kill()


def _read_until(process: subprocess.Popen[str], marker: str) -> str:
    assert process.stdout is not None
    seen = ""
    for line in process.stdout:  # bounded by the launcher's own readiness bound
        seen += line
        if marker in line:
            return seen
    raise AssertionError(f"{marker!r} never printed:\n{seen}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_up_runs_until_a_signal_then_stops_every_node(
    tmp_path: Path, up_process: subprocess.Popen[str], sig: int
) -> None:
    printed = _read_until(up_process, "Ctrl-C to stop")
    assert "shard 1: b -> c -> a" in printed
    assert "curl -s -XPOST" in printed
    up_process.send_signal(sig)
    assert up_process.wait(timeout=30) == 0
    for node in "abc":
        log = (tmp_path / "up" / "logs" / f"{node}.log").read_text()
        assert f"stub {node} on" in log


def test_up_starts_a_killed_node_again(tmp_path: Path, up_process: subprocess.Popen[str]) -> None:
    import psutil

    printed = _read_until(up_process, "Ctrl-C to stop")
    nodes = psutil.Process(up_process.pid).children()
    victim = next(node for node in nodes if node.cmdline()[-4:-1] == ["--id", "b", "--data"])
    assert f"pid {victim.pid}" in printed, "kayos up prints each node's pid"
    victim.kill()
    printed = _read_until(up_process, "b started again")
    assert "b exited with code -9; starting it again in 0.25s (restart 1 in a row" in printed
    assert up_process.poll() is None, "the cluster keeps running"
    starts = tmp_path / "up" / "b" / "starts"
    wait_until_true(lambda: starts.read_text() == "xx", "the stub b to start a second time")
    up_process.send_signal(signal.SIGTERM)
    assert up_process.wait(timeout=30) == 0


def wait_until_true(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # a bounded poll of a condition


def status_once_answered(cluster: LocalCluster, node: str) -> dict[str, Any]:
    """The node's status, asked again until it answers: None is a request with no reply in the
    launcher's short timeout (a loaded box), not an answer."""
    answers: list[dict[str, Any]] = []

    def answered() -> bool:
        status = cluster.status(node)
        if status is not None:
            answers.append(status)
        return status is not None

    wait_until_true(answered, f"{node} to answer GET /v1/status")
    return answers[0]


def test_the_produce_bench_help_states_the_parameters_defaults() -> None:
    # The CLI leaves defaults to ProduceBenchParameters; its help text repeats them.
    from click.testing import CliRunner

    from kayos.bench.produce import ProduceBenchParameters
    from kayos.cli.main import cli

    text = " ".join(CliRunner().invoke(cli, ["bench", "produce", "--help"]).output.split())
    defaults = ProduceBenchParameters()
    for option, value in [
        ("--messages", defaults.messages),
        ("--batch", defaults.batch),
        ("--in-flight", defaults.in_flight),
        ("--replicas", defaults.replicas),
        ("--singles", defaults.singles),
        ("--queue-shards", defaults.queue_shards),
    ]:
        assert f"[default: {value}]" in text.split(option, 1)[1].split("--", 1)[0]


STOP_SIGNAL_STRESS = textwrap.dedent(
    """
    import signal
    from kayos.local.up import StopSignal

    stop = StopSignal()
    signal.signal(signal.SIGALRM, lambda *_: stop.set())
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    for _ in range(200_000):
        stop.wait(0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    print("woken", stop.is_set(), stop.wait(30))
    """
)


def test_the_stop_signal_can_be_set_from_a_signal_handler_at_any_moment() -> None:
    # A handler firing every 0.2 ms lands inside the waiter's own calls again and again; with a
    # threading.Event (what kayos up used) it blocked on the lock its own thread held, and
    # `kayos up` hung on SIGTERM. The flag and pipe take no lock.
    done = subprocess.run(
        [sys.executable, "-c", STOP_SIGNAL_STRESS], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "woken True True"), done.stderr[-2000:]


class _NeverStarts:
    """A cluster whose one member died once and fails every start (say its port stays taken)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.died = True

    def members(self) -> list[str]:
        return ["kestrel"]

    def exited(self) -> dict[str, int]:
        died, self.died = self.died, False
        return {"kestrel": 1} if died else {}

    def start(self, member: str, *, wait: bool = True) -> None:
        self.attempts += 1
        raise ClusterError("127.0.0.1:22133 is in use (address already in use)")

    def pid(self, member: str) -> None:
        return None

    def kill(self, member: str) -> int:
        return -1

    def log_path(self, member: str) -> pathlib.Path:
        return pathlib.Path("/nonexistent/kestrel.log")

    def report_exit(self, member: str, code: int) -> str | None:
        return None  # no node, no manager to report to


class _FakeTimeStop:
    """A stop that is never asked for; each wait moves a fake clock on by 100 s (time passes only
    while the supervisor waits), up to ``waits_max`` waits."""

    def __init__(self, waits_max: int) -> None:
        self.now_s = 0.0
        self.waits_left = waits_max

    def wait(self, timeout_s: float) -> bool:
        self.now_s += 100.0
        self.waits_left -= 1
        return self.waits_left < 0

    def is_set(self) -> bool:
        return self.waits_left < 0


def test_a_member_that_never_starts_again_is_given_up_on() -> None:
    # Every failed start comes long after the member's last good one; counted from that start,
    # each death looked like the first in a row, and kayos up retried such a front forever.
    cluster = _NeverStarts()
    stop = _FakeTimeStop(waits_max=1000)
    lines: list[str] = []
    code = supervise(cluster, stop, lines.append, clock=lambda: stop.now_s)  # type: ignore[arg-type]
    assert code == 1, lines[-3:]
    assert cluster.attempts == limits.node_restarts_max
    assert "giving up" in lines[-2]
