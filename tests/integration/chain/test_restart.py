"""Restarts as a first-class path (issue 10): real ``kayos node`` processes (LocalCluster) stopped
with SIGTERM or killed with SIGKILL in each role, before and after their commit point and the
consumer group's high-water mark were written down, then started again on the same data.

After each restart the chain must resume by itself (writes through the head commit, every member
agrees), every message acknowledged with acks=all must be consumed in order from every tail, and
no replica may have rolled back anything: every write was acknowledged before the stop, so
nothing uncommitted exists to drop (``rolled_back_entries`` in ``GET /v1/status``). Every member
must also hold the head's takeover table, or its next SUBSCRIBE would look diverged.

One cluster serves each parametrised group (the cases do not depend on their order: each writes
its own queue); only the whole-cluster and ``kayos up`` tests start their own.
"""

from __future__ import annotations

import itertools
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.local.kestrel import LocalClusterWithKestrel
from kayos.local.ports import free_ports
from tests.support.cluster import (
    answered_replica,
    answered_status,
    commit_group,
    produce_ok,
    read_snapshot,
    wait_until,
)

pytestmark = pytest.mark.integration

SIGNALS = {"sigterm": signal.SIGTERM, "kill9": signal.SIGKILL}
# Messages per produce call, and produce calls before and after the restart.
BATCH = 5
_case_numbers = itertools.count()


def _cluster(base: Path, **options: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(base, **options)
    cluster.start_all()
    print("\n".join(cluster.describe()))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def chain_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One shard a -> b -> c: a head, a middle and a tail."""
    yield from _cluster(tmp_path_factory.mktemp("chain"), nodes=3, replicas=3, shards=1)


@pytest.fixture(scope="module")
def fanout_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One shard a -> b -> [c, d]: b feeds two fanout tails."""
    yield from _cluster(tmp_path_factory.mktemp("fanout"), nodes=4, replicas=2, fanout=2, shards=1)


# --- what every case checks ------------------------------------------------------------------


def replica_status(cluster: LocalCluster, node: str, shard: int = 0) -> dict[str, Any] | None:
    """The node's replica of ``shard``, None when it holds none or gives no answer: for a
    condition polled by ``wait_until`` (a read outside a wait uses ``answered_replica``)."""
    status = cluster.status(node)
    if status is None:
        return None
    found = status["shards"].get(str(shard))
    return found if isinstance(found, dict) else None


def rolled_back(cluster: LocalCluster) -> dict[str, tuple[int, int]]:
    """Each node's (rolled_back_entries, rolled_back_committed_entries), summed over shards."""
    found = {}
    for node in cluster.ids:
        shards = answered_status(cluster, node)["shards"].values()
        found[node] = (
            sum(int(s["rolled_back_entries"]) for s in shards),
            sum(int(s["rolled_back_committed_entries"]) for s in shards),
        )
    return found


def assert_nothing_rolled_back(cluster: LocalCluster) -> None:
    counts = rolled_back(cluster)
    assert all(count == (0, 0) for count in counts.values()), counts


def assert_takeover_tables_agree(cluster: LocalCluster) -> None:
    for shard in cluster.topology.shards.values():
        tables = {node: answered_replica(cluster, node, shard.id) for node in shard.members}
        head = tables[shard.head]
        assert head is not None
        for node, replica in tables.items():
            assert replica is not None
            assert replica["takeover"] == head["takeover"], (
                f"shard {shard.id}: {node} holds {replica['takeover']}, "
                f"head {shard.head} {head['takeover']}"
            )


def produce_batch(cluster: LocalCluster, queue: str, start: int) -> tuple[list[str], int]:
    """BATCH messages k<start>.. with acks=all at the queue's head; their keys and last seq."""
    keys = [f"k{n:04d}" for n in range(start, start + BATCH)]
    _, last = produce_ok(cluster.url(cluster.head_of(queue)), queue, [(k, f"v-{k}") for k in keys])
    return keys, last


def assert_consumed_in_order(
    cluster: LocalCluster, queue: str, group: str, expected: list[str]
) -> None:
    for tail in cluster.tails_of(queue):
        snapshot = read_snapshot(cluster.url(tail), queue, group)
        keys = [m["key"] for m in snapshot.messages]
        assert keys == expected, f"tail {tail}, group {group}: {keys}"
        assert [m["value"] for m in snapshot.messages] == [f"v-{k}" for k in expected]
        seqs = [m["seq"] for m in snapshot.messages]
        assert seqs == sorted(seqs)


def persisted_through(cluster: LocalCluster, seqs: dict[int, int]) -> bool:
    """Every member below a head has written down a commit point at or past ``seqs[shard]``."""
    for shard in cluster.topology.shards.values():
        for node in shard.members:
            if node == shard.head:
                continue
            replica = replica_status(cluster, node, shard.id)
            if replica is None or int(replica["commit_point_persisted"]) < seqs[shard.id]:
                return False
    return True


def restart_case(cluster: LocalCluster, node: str, sig: int, persisted: bool) -> None:
    """Writes and a group commit, ``sig`` to ``node`` (with its commit point and the group's
    mark written down first, or as soon as the writes are acknowledged), a restart on the same
    data, more writes, then every check."""
    queue = f"r{next(_case_numbers)}-{node}-{sig}-{int(persisted)}"
    first, first_last = produce_batch(cluster, queue, 0)
    commit_group(cluster.url(cluster.head_of(queue)), queue, "g", first_last)
    second, last = produce_batch(cluster, queue, BATCH)
    if persisted:
        wait_until(lambda: persisted_through(cluster, {0: last}), "the commit points written down")
    else:
        replica = answered_replica(cluster, node)
        assert replica is not None
        print(f"{node} wrote down {replica['commit_point_persisted']} of {last} before the stop")
    code = cluster.kill(node, sig)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), code
    cluster.start(node)
    cluster.wait_replicated()
    third, _ = produce_batch(cluster, queue, 2 * BATCH)  # the chain takes writes again
    cluster.wait_replicated()
    assert_consumed_in_order(cluster, queue, "g", second + third)
    assert_consumed_in_order(cluster, queue, "fresh", first + second + third)
    assert_nothing_rolled_back(cluster)
    assert_takeover_tables_agree(cluster)


# --- the matrix ------------------------------------------------------------------------------


@pytest.mark.parametrize("persisted", [False, True], ids=["before-persist", "after-persist"])
@pytest.mark.parametrize("how", list(SIGNALS))
@pytest.mark.parametrize("role", ["head", "middle", "tail"])
def test_restart_in_a_chain(
    chain_cluster: LocalCluster, role: str, how: str, persisted: bool
) -> None:
    node = {"head": "a", "middle": "b", "tail": "c"}[role]
    restart_case(chain_cluster, node, SIGNALS[how], persisted)


@pytest.mark.parametrize("persisted", [False, True], ids=["before-persist", "after-persist"])
@pytest.mark.parametrize("how", list(SIGNALS))
@pytest.mark.parametrize("role", ["head", "fanout-feeder", "fanout-tail"])
def test_restart_with_fanout(
    fanout_cluster: LocalCluster, role: str, how: str, persisted: bool
) -> None:
    node = {"head": "a", "fanout-feeder": "b", "fanout-tail": "d"}[role]
    restart_case(fanout_cluster, node, SIGNALS[how], persisted)


@pytest.mark.parametrize("how", list(SIGNALS))
def test_whole_cluster_restarts(tmp_path: Path, how: str) -> None:
    """Every node stopped (or killed) at once and started again, three times, writes between:
    each start adds a takeover entry at every head, and nothing committed is lost or rolled
    back."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=3, replicas=3)
    queues = ["whole-0", "whole-1", "whole-2", "whole-3"]
    written: dict[str, list[str]] = {queue: [] for queue in queues}
    with cluster:
        for round_ in range(3):
            for queue in queues:
                keys, _ = produce_batch(cluster, queue, len(written[queue]))
                written[queue] += keys
            if round_ == 1:
                seqs = cluster.wait_replicated()
                wait_until(
                    lambda: persisted_through(cluster, seqs),  # noqa: B023 - called at once
                    "the commit points written down",
                )
            if how == "sigterm":
                assert set(cluster.stop().values()) == {0}
            else:
                for node in cluster.ids:
                    cluster.kill(node)
            cluster.start_all()
            for queue in queues:
                assert_consumed_in_order(cluster, queue, "fresh", written[queue])
            assert_nothing_rolled_back(cluster)
            assert_takeover_tables_agree(cluster)


# --- the Kestrel front -----------------------------------------------------------------------

memcache: Any = None


@pytest.fixture(scope="module")
def kestrel_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalClusterWithKestrel]:
    global memcache
    memcache = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")
    cluster = LocalClusterWithKestrel(
        tmp_path_factory.mktemp("kestrel"), nodes=3, replicas=3, kestrel_port=0
    )
    cluster.start_all()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("persisted", [False, True], ids=["before-persist", "after-persist"])
@pytest.mark.parametrize("how", list(SIGNALS))
def test_kestrel_front_restarts(
    kestrel_cluster: LocalClusterWithKestrel, how: str, persisted: bool
) -> None:
    """The front stopped or killed after sets and confirmed reads, then started on its port:
    every STORED item that was not confirmed comes back, in order; a confirmed one only if it
    was killed before the queue's group commit was on every replica."""
    from tests.support.kestrel_front import removed_everywhere, tail_entries

    front = kestrel_cluster.kestrel
    assert front is not None
    queue = f"front{next(_case_numbers)}"
    items = [f"{queue}-i{n}" for n in range(8)]
    connection = memcache.Client([front.address], dead_retry=0, socket_timeout=10)
    try:
        for item in items:
            assert connection.set(queue, item.encode()), f"set {item} not STORED"
        assert connection.get(queue) == items[0].encode()
        assert connection.get(f"{queue}/t=1000/open") == items[1].encode()
        assert connection.get(f"{queue}/close") is None
    finally:
        connection.disconnect_all()
    if persisted:

        def removals_committed() -> bool:
            # The queue keeps entries until consumed: once the group's committed mark passes a
            # confirmed item, the tail's retention floor may rise past it and the item is no
            # longer listed. A committed mark on the tail is on every replica (chain order),
            # so an unlisted confirmed item is removed everywhere; the rest are asked for.
            seqs = tail_entries(kestrel_cluster, queue)
            assert set(items[2:]) <= set(seqs), f"unconfirmed items missing: {sorted(seqs)}"
            done = [seqs[item] for item in items[:2] if item in seqs]
            return removed_everywhere(kestrel_cluster, queue, done)

        wait_until(removals_committed, "removals committed")
    kestrel_cluster.kill("kestrel", SIGNALS[how])
    kestrel_cluster.start("kestrel")
    found = []
    reader = memcache.Client([front.address], dead_retry=0, socket_timeout=10)
    try:
        while (value := reader.get(f"{queue}/t=200/open")) is not None:
            found.append(value.decode())
            assert reader.get(f"{queue}/close") is None
    finally:
        reader.disconnect_all()
    if persisted or how == "sigterm":  # a stop takes its last group commits
        assert found == items[2:]
    else:
        assert found in (items[2:], items[1:], items[0:]), found
    assert_nothing_rolled_back(kestrel_cluster)


# --- kayos up ---------------------------------------------------------------------------------


def _up_ports() -> int:
    """A base port whose HTTP (base + i), binary (base + 100 + i) and manager (Raft base + 200 + i,
    HTTP base + 300 + i) ports are free now."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base + 303 > 65535:
            continue
        try:
            import socket

            probes = []
            for port in (base + offset + i for offset in (0, 100, 200, 300) for i in range(3)):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError("no free run of ports for kayos up")


def send_curl_line(command: str) -> str:
    """The request a printed ``curl -s [-XPOST] URL [-H HEADER] [-d BODY]`` line sends, sent with
    urllib; its reply body (curl -s prints the body alone, whatever the status)."""
    words = shlex.split(command)
    assert words[:2] == ["curl", "-s"], command
    method, url, headers, body = "GET", "", {}, None
    rest = iter(words[2:])
    for word in rest:
        if word.startswith("-X"):
            method = word[2:]
        elif word == "-H":
            name, _, value = next(rest).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-d":
            body = next(rest).encode()
            method = "POST" if method == "GET" else method
        else:
            assert not word.startswith("-"), (word, command)
            url = word
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.read().decode()


def run_try_lines(printed: list[str]) -> None:
    """Runs the commands ``kayos up`` printed under "try:", pasted as they are into a shell in
    its directory (with no virtualenv on PATH, as in a fresh terminal)."""
    start = next(i for i, line in enumerate(printed) if line.strip() == "try:")
    commands = []
    for line in printed[start + 1 :]:
        if "Ctrl-C to stop" in line:
            break
        if line.strip() != "or with curl:":
            commands.append(line.strip())
    assert len(commands) == 4, printed
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    outputs = []
    for command in commands:
        if command.startswith("curl ") and shutil.which("curl", path=env["PATH"]) is None:
            # A fresh machine may have no curl: send the request the line spells out.
            outputs.append(send_curl_line(command))
            continue
        done = subprocess.run(
            ["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        outputs.append(done.stdout)
    assert '"hello"' in outputs[1], outputs  # the consume shows the produced message
    assert '"k2"' in outputs[3], outputs


def test_kayos_up_starts_a_killed_node_again(tmp_path: Path) -> None:
    """``kayos up`` (the real command, real nodes): kill -9 of a node is followed by its restart,
    printed; the chain resumes and acknowledged messages are all consumed."""
    import psutil

    base = _up_ports()
    command = [sys.executable, "-m", "kayos", "up", "--data", str(tmp_path / "data")]
    command += ["--base-port", str(base), "--kestrel-port", "0"]
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as up:
        reader = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")))  # type: ignore[union-attr]
        reader.start()
        try:
            wait_until(lambda: any("Ctrl-C to stop" in line for line in lines), "kayos up ready")
            run_try_lines(lines)
            url = f"http://127.0.0.1:{base}"
            queue = "restarted"
            cluster_view = LocalCluster(tmp_path / "view", nodes=3, replicas=3, base_port=base)
            head = cluster_view.url(cluster_view.head_of(queue))
            produce_ok(head, queue, [("k0", "v-k0")])
            victim = "b"
            pids = {
                p.cmdline()[p.cmdline().index("--id") + 1]: p
                for p in psutil.Process(up.pid).children()
                if "--id" in p.cmdline()
            }
            pids[victim].kill()
            wait_until(
                lambda: any(f"{victim} started again" in line for line in lines),
                "kayos up to start the killed node again",
            )
            assert any(
                f"{victim} exited with code -9; starting it again" in line for line in lines
            ), lines
            cluster_view.wait_replicated()
            produce_ok(head, queue, [("k1", "v-k1")])
            tail = cluster_view.url(cluster_view.tails_of(queue)[0])
            keys = [m["key"] for m in read_snapshot(tail, queue, "g").messages]
            assert keys == ["k0", "k1"]
            status, body = http_json(f"{url}/v1/status")
            assert status == 200
            assert body["ready"] is True
        finally:
            up.send_signal(signal.SIGINT)
            code = up.wait(timeout=60)
            reader.join(timeout=10)
    assert code == 0, lines
    assert any("stopped cleanly" in line for line in lines), lines
