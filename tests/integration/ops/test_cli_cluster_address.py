"""Every command that talks to a cluster, run as a user runs it (a process of its own) against
real node processes, named once with ``--cluster`` and once with ``KAYOS_CLUSTER``
(docs/operations.md, "Naming the cluster"); an old name still works, with its note. Each command
runs in a directory whose ``./kayos-data/cluster.toml`` names nodes where nothing listens (the
cluster's secret and manager members, other ports), so a command that ignored the name it was
given would fail. And an HTTP produce without ``acks`` waits for ``acks=all``
(docs/node-api.md, "Produce")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kayos.cli.address import CLUSTER_ENV
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.local.ports import free_ports
from tests.support.cluster import PRODUCE_TIMEOUT_S, WAIT_S, wait_until
from tests.support.kestrel_front import KestrelProcess, tail_entries
from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.integration

WAYS = ("option", "variable")
# How long a write without acks must stay unanswered while the tail is paused, after a later
# acks=1 write was answered: an acks=1 answer takes milliseconds once the head has fsynced.
UNANSWERED_WINDOW_S = 2.0


def dead_copy(cluster: LocalCluster, workdir: Path) -> Path:
    """``workdir/kayos-data/cluster.toml``: the cluster's file with every node's HTTP port moved
    to one where nothing listens (the secret and the manager members stay)."""
    text = cluster.topology_path.read_text()
    dead = free_ports(len(cluster.ids))
    for port, node in zip(dead, cluster.ids, strict=True):
        line = f"http_port = {cluster.topology.nodes[node].http_port}\n"
        assert text.count(line) == 1, line
        text = text.replace(line, f"http_port = {port}\n")
    path = workdir / "kayos-data" / "cluster.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def kayos(workdir: Path, way: str, url: str, *args: str) -> tuple[int, Any, str]:
    """``kayos ARGS`` in ``workdir`` with the cluster named ``way``: exit code, stdout (parsed
    when ``--json``), stderr."""
    env = {k: v for k, v in os.environ.items() if k != CLUSTER_ENV}
    env["PYTHONPATH"] = str(REPO_ROOT)  # this checkout's kayos, from any directory
    named = [*args, "--cluster", url] if way == "option" else list(args)
    if way == "variable":
        env[CLUSTER_ENV] = url
    done = subprocess.run(
        [sys.executable, "-m", "kayos", *named],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * WAIT_S,
        check=False,
    )
    out: Any = done.stdout
    if "--json" in args and done.returncode in (0, 1, 2) and done.stdout.strip():
        out = json.loads(done.stdout)
    return done.returncode, out, done.stderr


@pytest.mark.parametrize("way", WAYS)
def test_every_command_asks_the_cluster_it_is_named(
    start_cluster: Callable[..., LocalCluster], tmp_path: Path, way: str
) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=3, managers=1)
    workdir = tmp_path / "work"
    workdir.mkdir()
    dead = str(dead_copy(cluster, workdir))
    url = cluster.url("b")
    queue = f"named-{way}"

    def run(*args: str) -> tuple[int, Any, str]:
        return kayos(workdir, way, url, *args)

    code, out, err = run("produce", queue, "k", "v")
    assert (code, out) == (0, f"{queue}: seq 1\n"), err
    code, out, err = run("consume", queue, "--group", "g")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["value"] == "v"
    code, out, err = run("ctl", "status", "--json")
    assert code != 2, (out, err)
    assert out["source"] == url
    code, out, err = run("ctl", "retention", queue)
    assert code == 0, err
    assert json.loads(out)["queue"] == queue
    code, out, err = run("ctl", "check", "--digest-seqs", "0", "--json")
    assert code != 2, (out, err)
    assert out["epoch"] is not None
    code, out, err = run("ctl", "queue", "describe", queue, "--json")
    assert code == 0, (out, err)
    assert out["known"] is True
    code, out, err = run("ctl", "compact", "--topology", dead, "--no-wait", "--json")
    assert code == 0, (out, err)
    assert len(out["stores"]) == 9
    code, out, err = run("ctl", "queue", "create", f"c-{way}", "--shards", "2", "--json")
    assert code == 0, (out, err)
    code, out, err = run("ctl", "queue", "alter", f"c-{way}", "--shards", "3", "--json")
    assert code == 0, (out, err)
    assert (out["previous"], out["shards"]) == (2, 3)
    journals = tmp_path / "kestrel-spool"
    journals.mkdir()
    code, out, err = run("import-kestrel", str(journals))
    assert code == 0, (out, err)

    args = ("--cluster", url) if way == "option" else ()
    front_dir = tmp_path / "front"
    front_dir.mkdir()
    front = KestrelProcess(front_dir, args=args, env={CLUSTER_ENV: url} if args == () else {})
    try:
        with front.connect() as sock:
            sock.sendall(b"set jobs 0 0 5\r\nhello\r\n")
            assert sock.recv(64) == b"STORED\r\n"
        assert "hello" in tail_entries(cluster, "jobs"), "the front keeps its items on the cluster"
    finally:
        front.close()


def test_an_old_name_and_the_default_file(
    start_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """``--seed`` still names the cluster, with its note; with no name at all a command asks
    the nodes of ./kayos-data/cluster.toml, and says where it looked when none answers."""
    cluster = start_cluster(nodes=2, replicas=2)
    workdir = tmp_path / "work"
    workdir.mkdir()
    dead_copy(cluster, workdir)
    url = cluster.url("a")
    code, out, err = kayos(workdir, "none", url, "produce", "old", "k", "v", "--seed", url)
    assert (code, out) == (0, "old: seq 1\n"), err
    assert "--seed is deprecated and goes in the next release: use --cluster URL" in err
    code, out, err = kayos(workdir, "none", url, "produce", "old", "k", "v")
    assert code == 1
    assert "(the nodes of ./kayos-data/cluster.toml; name the cluster with --cluster URL" in err
    (workdir / "kayos-data" / "cluster.toml").write_text(cluster.topology_path.read_text())
    code, out, err = kayos(workdir, "none", url, "produce", "old", "k", "v")
    assert (code, out) == (0, "old: seq 2\n"), err


def test_http_produce_without_acks_waits_until_every_member_has_it(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    """No ``acks`` is ``acks=all``: with the tail paused the head holds the write durably and
    still does not answer (``acks=1`` would have); it answers once the tail has it too."""
    cluster = start_cluster(nodes=2, replicas=2)
    head, tail = cluster.topology.shards[0].chain
    queue = next(q for q in (f"q{i}" for i in range(100)) if cluster.topology.shard_for(q) == 0)
    url = f"{cluster.url(head)}/v1/queues/{queue}/messages"  # no ?acks=
    before = durable(cluster, head)
    assert before is not None
    replies: list[tuple[int, Any]] = []
    body = {"messages": [{"key": "k", "value": "v"}]}

    def send() -> None:
        replies.append(http_json(url, method="POST", body=body, timeout_s=PRODUCE_TIMEOUT_S))

    process = cluster.processes[tail]
    process.send_signal(signal.SIGSTOP)
    try:
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        wait_until(lambda: (durable(cluster, head) or 0) > before, "the head to hold it durably")
        # The contrast: a write named acks=1 is answered now, with the tail still paused.
        status, _ = http_json(f"{url}?acks=1", method="POST", body=body, timeout_s=WAIT_S)
        assert status == 200
        # acks=1 would have answered the first write before that second one; give it a window
        # all the same (an answer arriving in it fails the test), then let the tail go.
        sender.join(UNANSWERED_WINDOW_S)
        assert not replies, f"answered before the tail had it: {replies}"
    finally:
        process.send_signal(signal.SIGCONT)
    sender.join(PRODUCE_TIMEOUT_S)
    assert not sender.is_alive()
    ((status, reply),) = replies
    assert status == 200, reply
    assert (durable(cluster, tail) or 0) >= reply["last_seq"], "durable on the tail when answered"


def durable(cluster: LocalCluster, node: str) -> int | None:
    """The node's ``durable_seq`` of shard 0; None when it gives no answer."""
    status = cluster.status(node)
    return None if status is None else int(status["shards"]["0"]["durable_seq"])
