"""One owner per directory (kayos.datadir), ports bound early with a clear error (kayos.ports),
and how the launcher and the Kestrel front use both before they start anything
(docs/node-api.md "Owners, locks and ports"). Real files, real flock, real sockets; the other
owners are real child processes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.datadir import LOCK_FILE_NAME, DirectoryLock, read_holder_pid
from kayos.embedded import open_queue
from kayos.errors import AddressInUseError, DirectoryInUseError, KayosError
from kayos.local.cluster import LocalCluster
from kayos.local.ports import free_ports
from kayos.local.processes import ClusterError, failure_reason
from kayos.ports import bind_listener, check_free
from kestrel_compat.core.config import KestrelConfig
from kestrel_compat.server import check_ports

pytestmark = pytest.mark.integration

# A child that takes the lock of argv[1], says so on stdout and waits until its stdin closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from kayos.datadir import DirectoryLock

    lock = DirectoryLock.acquire(sys.argv[1])
    print("held", flush=True)
    sys.stdin.read()
    """
)
# Bounds for the child's start and exit: generous for 2 shared cores.
CHILD_TIMEOUT_S = 30.0


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock of ``tmp_path / "d"``."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "d")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "held\n"  # blocks until the child holds it
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=CHILD_TIMEOUT_S)


def listening_socket() -> tuple[socket.socket, int]:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken, int(taken.getsockname()[1])


# --- the lock ------------------------------------------------------------------------------------


def test_the_lock_records_the_owner_and_a_second_open_in_this_process_is_refused(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "d"
    with DirectoryLock.acquire(directory, what="data dir") as lock:
        assert lock.held
        assert read_holder_pid(str(directory / LOCK_FILE_NAME)) == os.getpid()
        with pytest.raises(DirectoryInUseError) as refused:
            DirectoryLock.acquire(directory, what="data dir")
        assert refused.value.holder_pid == os.getpid()
        assert refused.value.path == str(directory)
        assert str(refused.value) == (
            f"data dir {directory} is in use by pid {os.getpid()} "
            f"(lock file {directory / LOCK_FILE_NAME})"
        )
    assert not lock.held
    DirectoryLock.acquire(directory).release()  # given up: the next owner gets it
    assert (directory / LOCK_FILE_NAME).exists(), "the file stays; only the flock goes"


def test_another_process_holding_it_is_named_and_a_kill_9_frees_it(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    directory = tmp_path / "d"
    with pytest.raises(DirectoryInUseError, match=f"is in use by pid {holder.pid} "):
        DirectoryLock.acquire(directory)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=CHILD_TIMEOUT_S)
    # The stale file still names the dead owner; it does not block the next one.
    assert read_holder_pid(str(directory / LOCK_FILE_NAME)) == holder.pid
    with DirectoryLock.acquire(directory):
        assert read_holder_pid(str(directory / LOCK_FILE_NAME)) == os.getpid()


def test_a_lock_file_with_garbage_in_it_does_not_matter(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    (directory / LOCK_FILE_NAME).write_bytes(b"not a pid at all, and long" * 10)
    assert read_holder_pid(str(directory / LOCK_FILE_NAME)) is None
    with DirectoryLock.acquire(directory):
        assert (directory / LOCK_FILE_NAME).read_text() == f"{os.getpid()}\n"


def test_a_directory_that_cannot_be_made_is_a_kayos_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(KayosError, match="cannot lock data dir"):
        DirectoryLock.acquire(tmp_path / "file" / "d")


def test_open_queue_owns_its_directory_until_closed(tmp_path: Path) -> None:
    path = str(tmp_path / "q")
    queue = open_queue(path)
    queue.produce(b"k", b"v")
    with pytest.raises(DirectoryInUseError, match=f"queue dir {path} is in use by pid"):
        open_queue(path)
    assert queue.last_seq == 1, "the refused open changed nothing"
    queue.close()
    with open_queue(path) as again:
        assert again.last_seq == 1


def test_open_queue_refuses_a_directory_another_process_holds(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(DirectoryInUseError, match=f"by pid {holder.pid} "):
        open_queue(str(tmp_path / "d"))
    assert not [name for name in os.listdir(tmp_path / "d") if name != LOCK_FILE_NAME]


# --- ports ---------------------------------------------------------------------------------------


def test_a_taken_port_is_one_line_naming_it_and_the_flag() -> None:
    taken, port = listening_socket()
    with taken, pytest.raises(AddressInUseError) as refused:
        bind_listener("127.0.0.1", port, what="node a's http port", hint="pass another --x")
    assert str(refused.value) == (
        f"127.0.0.1:{port} (node a's http port) is in use (address already in use): "
        "pass another --x"
    )
    assert refused.value.port == port
    check_free("127.0.0.1", port, what="w", hint="h")  # closed now: free again


def test_a_port_bound_early_is_taken_at_once_and_peers_wait_to_be_served() -> None:
    listener = bind_listener("127.0.0.1", 0, what="w", hint="h")
    port = int(listener.getsockname()[1])
    with listener:
        # Taken at once, even for a binder that also sets SO_REUSEADDR (a socket only bound,
        # not listening, let a second process bind the same port and reach peers first).
        with pytest.raises(AddressInUseError):
            check_free("127.0.0.1", port, what="w", hint="h")
        with pytest.raises(AddressInUseError):
            bind_listener("127.0.0.1", port, what="w", hint="h")
        # A peer that connects before the server runs waits in the backlog to be served.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:
            accepted, _ = listener.accept()
            with accepted:
                peer.sendall(b"x")
                assert accepted.recv(1) == b"x"


def test_the_kestrel_front_checks_its_ports_with_their_flags() -> None:
    taken, port = listening_socket()
    base = KestrelConfig()
    server = replace(base.server, host="127.0.0.1", port=0, text_port=port, thrift_port=None)
    with taken, pytest.raises(AddressInUseError, match=f":{port} .*pass another --text-port$"):
        check_ports(replace(base, server=server))


def test_kayos_node_on_a_taken_port_exits_1_with_one_line(tmp_path: Path) -> None:
    taken, port = listening_socket()
    (bin_port,) = free_ports(1)
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'epoch = 1\n[nodes.a]\nhost = "127.0.0.1"\nhttp_port = {port}\nbin_port = {bin_port}\n'
        '[[shards]]\nid = 0\nchain = ["a"]\n'
    )
    with taken:
        result = CliRunner().invoke(
            cli, ["node", "--config", str(config), "--id", "a", "--data", str(tmp_path / "a")]
        )
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"Error: address_in_use: 127.0.0.1:{port} (node a's http port) is in use "
        "(address already in use): "
        "pass another --base-port to kayos up, or change http_port of node a in the topology "
        "file\n"
    )
    assert not (tmp_path / "a" / "shards").exists(), "no store was opened"


def test_kayos_node_on_a_held_data_dir_exits_1_naming_the_holder(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    http_port, bin_port = free_ports(2)
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'epoch = 1\n[nodes.a]\nhost = "127.0.0.1"\nhttp_port = {http_port}\n'
        f'bin_port = {bin_port}\n[[shards]]\nid = 0\nchain = ["a"]\n'
    )
    data = tmp_path / "d"
    result = CliRunner().invoke(
        cli, ["node", "--config", str(config), "--id", "a", "--data", str(data)]
    )
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"Error: directory_in_use: node a's data dir {data} is in use by pid {holder.pid} "
        f"(lock file {data / LOCK_FILE_NAME})\n"
    )
    check_free("127.0.0.1", http_port, what="w", hint="h")  # it did not keep the ports


# --- the launcher --------------------------------------------------------------------------------


def test_a_second_launcher_on_one_data_root_is_refused_before_it_writes(tmp_path: Path) -> None:
    first = LocalCluster(tmp_path / "up", nodes=1, replicas=1)
    first.preflight()
    second = LocalCluster(tmp_path / "up", nodes=1, replicas=1)
    with pytest.raises(ClusterError, match="another kayos up runs on it") as refused:
        second.preflight()
    assert str(refused.value).startswith(f"kayos data root {tmp_path / 'up'} is in use by pid ")
    assert not (tmp_path / "up" / "cluster.toml").exists()
    first.release_root()
    second.preflight()
    second.release_root()


def test_the_launcher_checks_fixed_ports_before_it_starts_anything(tmp_path: Path) -> None:
    taken, port = listening_socket()
    # The taken port is node a's own (base_port is a's HTTP port): a neighbour of it could be
    # taken by anything else on the host, and the check would rightly name that one instead.
    cluster = LocalCluster(tmp_path / "up", nodes=2, replicas=2, base_port=port)
    with taken, pytest.raises(ClusterError, match=r"\(node a's http port\).*--base-port$"):
        cluster.start_all()
    assert cluster.processes == {}
    assert not (tmp_path / "up" / "cluster.toml").exists()
    # The failed attempt gave the root up (taken straight: preflight would probe the ports again,
    # and any of them may be some other process's by now).
    DirectoryLock.acquire(tmp_path / "up", what="the data root").release()


def test_failure_reason_is_the_first_line_of_the_last_error(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(
        "--- kayos launcher: starting node a at then\nError: an old failure\n"
        "--- kayos launcher: starting node a at now\n"
        "Traceback (most recent call last):\n  File x\n"
        "kayos.errors.StorageError: cannot open store s: no\n"
    )
    assert failure_reason(log) == "kayos.errors.StorageError: cannot open store s: no"
    log.write_text(log.read_text() + "Error: 127.0.0.1:1 is in use\n")
    assert failure_reason(log) == "127.0.0.1:1 is in use"
    log.write_text("--- kayos launcher: starting node a at now\n")
    assert failure_reason(log) == "(nothing in its log)"


def test_the_launcher_names_the_node_that_failed_and_the_first_line_of_why(tmp_path: Path) -> None:
    refuse = "print('Error: directory_in_use: d is in use by pid 1 (lock file d/LOCK)'); exit(1)"
    cluster = LocalCluster(
        tmp_path / "up", nodes=1, replicas=1, node_command=[sys.executable, "-c", refuse]
    )
    with pytest.raises(ClusterError) as failed:
        cluster.start_all()
    assert str(failed.value).splitlines()[0] == (
        "node a failed to start: directory_in_use: d is in use by pid 1 (lock file d/LOCK)"
    )
    assert cluster.processes == {}


def test_connections_accepted_on_an_early_bound_port_send_at_once() -> None:
    """asyncio turns Nagle's algorithm off only on sockets whose proto is IPPROTO_TCP, and an
    accepted socket takes its listener's: a listener made with proto 0 held every small reply for
    the peer's delayed ACK (single acks=all writes went from about 1.2 ms to 44 ms)."""
    listener = bind_listener("127.0.0.1", 0, what="a test port", hint="none")
    port = listener.getsockname()[1]
    nodelay: list[int] = []

    async def run() -> None:
        seen = asyncio.Event()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            seen.set()
            writer.close()

        server = await asyncio.start_server(accepted, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await seen.wait()
            writer.close()

    asyncio.run(asyncio.wait_for(run(), timeout=30))
    assert nodelay == [1]
