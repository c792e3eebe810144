"""One owner per directory and ports bound before peers, with real processes
(docs/node-api.md "Owners, locks and ports"): a second node process, a second `kayos up` (same
--data; another --data on the same ports) and a second `open_queue` each fail within seconds with
a clear line and leave the first serving every acknowledged message; `kayos check` passes on every
store afterwards; a kill -9 leaves a lock file that does not block the next owner."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kayos.datadir import LOCK_FILE_NAME, read_holder_pid
from kayos.embedded import open_queue
from kayos.errors import DirectoryInUseError, KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.local.managers import MANAGERS_DEFAULT
from kayos.local.ports import free_ports
from kayos.ports import check_free
from kayos.topology import Topology
from tests.support.cluster import WAIT_S, produce_ok, read_snapshot, wait_until

pytestmark = pytest.mark.integration

KAYOS = [sys.executable, "-m", "kayos"]
# A refused second owner must say so within this long (it starts a Python process and stops at
# its first step; seconds on 2 shared cores).
REFUSAL_S = 20.0
# Candidate fixed base ports tried for a `kayos up` (each needs base+i and base+100+i free).
BASE_PORT_ATTEMPTS = 50


def kayos_check(store: Path) -> None:
    result = subprocess.run(
        [*KAYOS, "check", str(store)], capture_output=True, text=True, timeout=WAIT_S, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK "), result.stdout


def check_every_store(data_root: Path) -> int:
    """`kayos check` on every shard store under ``data_root``; returns how many."""
    stores = sorted(data_root.glob("*/shards/*"))
    for store in stores:
        kayos_check(store)
    return len(stores)


def run_refused(command: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Runs a command that must fail; returns it and the seconds it took."""
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - started
    print(f"{command[3:5]} refused in {took:.2f}s: {result.stdout}{result.stderr}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert took < REFUSAL_S
    return result, took


def fixed_base_port(nodes: int, seed: int) -> int:
    """A base port whose node ports (base+i, base+100+i) and manager ports (base+200+i,
    base+300+i: `kayos up` starts MANAGERS_DEFAULT members) are all free now."""
    rng = random.Random(seed)
    for _ in range(BASE_PORT_ATTEMPTS):
        base = rng.randrange(20_000, 60_000)
        try:
            for i in range(nodes):
                check_free("127.0.0.1", base + i, what="probe", hint="")
                check_free("127.0.0.1", base + 100 + i, what="probe", hint="")
            for i in range(MANAGERS_DEFAULT):
                check_free("127.0.0.1", base + 200 + i, what="probe", hint="")
                check_free("127.0.0.1", base + 300 + i, what="probe", hint="")
        except KayosError:
            continue
        return base
    raise AssertionError("no free fixed ports found")


def up_command(data: Path, base_port: int, nodes: int, *, kestrel_port: int = 0) -> list[str]:
    return [
        *KAYOS, "up", "--data", str(data), "--nodes", str(nodes), "--replicas", str(nodes),
        "--base-port", str(base_port), "--kestrel-port", str(kestrel_port),
    ]  # fmt: skip


@pytest.fixture
def first_up(
    tmp_path: Path, seed: int
) -> Iterator[Callable[[int], tuple[Path, int, subprocess.Popen[str]]]]:
    """Starts one `kayos up` (no Kestrel front); returns its data root, base port and process.
    It is stopped with SIGINT at teardown if a test has not stopped it."""
    processes: list[subprocess.Popen[str]] = []

    def start(nodes: int) -> tuple[Path, int, subprocess.Popen[str]]:
        data = tmp_path / "first"
        base_port = fixed_base_port(nodes, seed)
        process = subprocess.Popen(
            up_command(data, base_port, nodes), stdout=subprocess.PIPE, text=True
        )
        processes.append(process)
        assert process.stdout is not None
        seen = ""
        for line in process.stdout:  # bounded by the launcher's own readiness bound
            seen += line
            if "Ctrl-C to stop" in line:
                return data, base_port, process
        raise AssertionError(f"kayos up did not start:\n{seen}")

    yield start
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        if process.stdout is not None:
            process.stdout.close()


def test_a_second_node_on_a_held_data_dir_is_refused_and_the_first_serves_on(
    tmp_path: Path, start_cluster: Callable[..., LocalCluster]
) -> None:
    cluster = start_cluster(nodes=1, replicas=1)
    url = cluster.url("a")
    produce_ok(url, "demo", [(f"k{i}", f"v{i}") for i in range(100)])
    # The same node id and data dir under another topology file with other ports: both would act
    # as the head of every shard, each giving out the same seqs.
    http_port, bin_port = free_ports(2)
    other = tmp_path / "other.toml"
    other.write_text(
        f'epoch = 1\n[nodes.a]\nhost = "127.0.0.1"\nhttp_port = {http_port}\n'
        f'bin_port = {bin_port}\n[[shards]]\nid = 0\nchain = ["a"]\n'
    )
    data = cluster.data_dir("a")
    result, _ = run_refused(
        [*KAYOS, "node", "--config", str(other), "--id", "a", "--data", str(data)]
    )
    assert result.stderr == (
        f"Error: directory_in_use: node a's data dir {data} is in use by pid "
        f"{cluster.processes['a'].pid} "
        f"(lock file {data / LOCK_FILE_NAME})\n"
    )
    check_free("127.0.0.1", http_port, what="the refused node's port", hint="it never bound")
    produce_ok(url, "demo", [(f"k{i}", f"v{i}") for i in range(100, 200)])
    snapshot = read_snapshot(url, "demo", "g")
    assert [message["seq"] for message in snapshot.messages] == list(range(1, 201))
    assert cluster.stop() == {"a": 0}
    assert check_every_store(cluster.base_dir) == 1


def test_a_node_killed_with_sigkill_leaves_a_lock_file_that_does_not_block_its_restart(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=1, replicas=1)
    url = cluster.url("a")
    produce_ok(url, "demo", [(f"k{i}", f"v{i}") for i in range(50)])
    dead = cluster.processes["a"].pid
    assert cluster.kill("a") == -signal.SIGKILL
    lock_file = cluster.data_dir("a") / LOCK_FILE_NAME
    assert read_holder_pid(str(lock_file)) == dead, "the stale file names the dead owner"
    cluster.start("a")
    assert read_holder_pid(str(lock_file)) == cluster.processes["a"].pid
    cluster.wait_replicated()
    snapshot = read_snapshot(url, "demo", "g")
    assert len(snapshot.messages) == 50
    assert cluster.stop() == {"a": 0}
    assert check_every_store(cluster.base_dir) == 1


def _statuses(topology: Topology) -> dict[str, dict[str, tuple[int, int, str]]]:
    """Each node's replicas: (last_seq, committed_seq, role)."""
    seen: dict[str, dict[str, tuple[int, int, str]]] = {}
    for node, address in topology.nodes.items():
        code, status = http_json(address.http_url + "/v1/status")
        assert code == 200, status
        seen[node] = {
            shard: (replica["last_seq"], replica["committed_seq"], replica["role"])
            for shard, replica in status["shards"].items()
        }
    return seen


def _settled(topology: Topology) -> dict[str, dict[str, tuple[int, int, str]]] | None:
    """The statuses once every replica of each shard holds and has committed the same seq."""
    seen = _statuses(topology)
    for shard in topology.shards.values():
        seqs = {seq for node in shard.members for seq in seen[node][str(shard.id)][:2]}
        if len(seqs) != 1:
            return None
    return seen


def test_a_second_kayos_up_is_refused_within_seconds_and_the_first_is_undisturbed(
    tmp_path: Path, first_up: Callable[[int], tuple[Path, int, subprocess.Popen[str]]]
) -> None:
    data, base_port, first = first_up(2)
    pid = first.pid
    topology = Topology.load(str(data / "cluster.toml"))
    queues = [f"q{i}" for i in range(8)]  # over both shards
    for queue in queues:
        produce_ok(topology.nodes[topology.chain_for(queue).head].http_url, queue, [("k", "v")])
    before = wait_until(lambda: _settled(topology), "every replica to agree on its shard's seqs")

    # The same --data (on other ports): the data root's lock stops it before it writes a thing.
    other_port = fixed_base_port(2, base_port)
    result, _ = run_refused(up_command(data, other_port, 2))
    assert result.stdout.splitlines()[0] == (
        f"kayos up: kayos data root {data} is in use by pid {pid} (lock file "
        f"{data / LOCK_FILE_NAME}): another kayos up runs on it; stop that one or pass "
        "another --data"
    )
    # Another --data on the same ports: stopped by the port check before any node starts.
    second = tmp_path / "second"
    result, _ = run_refused(up_command(second, base_port, 2))
    assert result.stdout.splitlines()[0] == (
        f"kayos up: 127.0.0.1:{base_port} (node a's http port) is in use (address already in "
        "use): pass another --base-port"
    )
    assert sorted(os.listdir(second)) == [LOCK_FILE_NAME], "no topology, no node, no log"
    # Past the launcher (a lost race, or a node started by hand): node b of the same topology on
    # another data dir dies at its bind, before it opens a store or links to a peer.
    result, _ = run_refused(
        [*KAYOS, "node", "--config", str(data / "cluster.toml"), "--id", "b", "--data",
         str(tmp_path / "b")]
    )  # fmt: skip
    assert result.stderr.startswith(
        f"Error: address_in_use: 127.0.0.1:{base_port + 1} (node b's http port) is in use "
        "(address already in "
        "use): pass another --base-port"
    )
    assert not (tmp_path / "b" / "shards").exists()

    assert _statuses(topology) == before, "the first cluster saw nothing"
    for queue in queues:
        chain = topology.chain_for(queue)
        produce_ok(topology.nodes[chain.head].http_url, queue, [("k2", "v2")])
        tail = topology.nodes[chain.tails[0]].http_url

        def both_at_tail(tail: str = tail, queue: str = queue) -> bool:
            return len(read_snapshot(tail, queue, "g").messages) == 2

        wait_until(both_at_tail, f"both messages of {queue} at its tail")
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=60) == 0
    assert check_every_store(data) == 4  # 2 shards x 2 replicas


HOLDING_QUEUE = textwrap.dedent(
    """
    import sys
    from kayos.embedded import open_queue

    queue = open_queue(sys.argv[1])
    for i in range(int(sys.argv[2])):
        queue.produce(b"k%d" % i, b"v%d" % i)
    print("written", queue.last_seq, flush=True)
    sys.stdin.read()
    """
)


def test_a_second_open_queue_from_another_process_is_refused_and_a_kill_9_frees_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q"
    with subprocess.Popen(
        [sys.executable, "-c", HOLDING_QUEUE, str(path), "600"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "written 600\n"
            started = time.monotonic()
            with pytest.raises(DirectoryInUseError, match=f"is in use by pid {holder.pid} "):
                open_queue(str(path))
            assert time.monotonic() - started < 1.0, "refused at once, not after a wait"
        finally:
            holder.kill()
            holder.wait(timeout=WAIT_S)
    with open_queue(str(path)) as queue:
        assert queue.last_seq == 600, "every acknowledged write is there"
        pages = list(queue.consume("g"))
        assert sum(len(page.messages) for page in pages) == 600
    kayos_check(path)


def test_the_kestrel_front_on_a_taken_port_exits_before_it_contacts_the_cluster() -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    (nobody,) = free_ports(1)  # no cluster there: contacting it would fail differently
    with taken:
        result, _ = run_refused(
            [*KAYOS, "kestrel", "--port", str(port), "--no-text", "--no-thrift",
             "--cluster", f"http://127.0.0.1:{nobody}"]
        )  # fmt: skip
    assert result.stderr == (
        f"Error: address_in_use: 127.0.0.1:{port} (kestrel memcache port) is in use "
        "(address already in use): "
        "pass another --port\n"
    )


def test_kayos_up_with_a_taken_kestrel_port_starts_no_node(tmp_path: Path, seed: int) -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    data = tmp_path / "up"
    with taken:
        result, _ = run_refused(up_command(data, fixed_base_port(1, seed), 1, kestrel_port=port))
    assert result.stdout.splitlines()[0] == (
        f"kayos up: 127.0.0.1:{port} (the kestrel front's memcache port) is in use (address "
        "already in use): pass another --kestrel-port (0: no front)"
    )
    assert sorted(os.listdir(data)) == [LOCK_FILE_NAME]
