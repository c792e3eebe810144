"""``kayos up``: a local cluster in the foreground. It starts the cluster, prints where each
member is and commands to paste, then supervises: a member that dies is started again after a
bounded backoff (``kayos.local.supervisor``) until SIGINT or SIGTERM stops everything."""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from kayos.cli.address import TOPOLOGY_DEFAULT
from kayos.local.cluster import LocalCluster, poll_interval_s
from kayos.local.processes import ClusterError, log_tail
from kayos.local.supervisor import GiveUp, Supervisor


def kayos_command() -> str:
    """This installation's ``kayos`` as a user pastes it into the shell ``kayos up`` runs in:
    ``kayos`` when that is on PATH, else the script's path (relative below the current
    directory, e.g. ``.venv/bin/kayos`` under ``make run``)."""
    script = Path(sys.executable).parent / "kayos"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m kayos"
    found = shutil.which("kayos")
    if found is not None and Path(found).absolute() == script.absolute():
        return "kayos"
    relative = os.path.relpath(script)
    return shlex.quote(str(script) if relative.startswith("..") else relative)


def example_commands(cluster: LocalCluster, queue: str = "demo") -> list[str]:
    """Commands that work against ``cluster`` when pasted as they are: produce with acks=all,
    then read a snapshot as a consumer group; with the ``kayos`` client and with curl (at the
    queue's head and tail)."""
    first = cluster.url(cluster.ids[0])
    # The CLI finds the cluster by itself from the default topology file (kayos/cli/address.py).
    found = Path(cluster.topology_path).resolve() == Path(TOPOLOGY_DEFAULT).resolve()
    seed = "" if found else f" --cluster {first}"
    head = cluster.url(cluster.head_of(queue))
    tail = cluster.url(cluster.tails_of(queue)[0])
    body = '{"messages": [{"key": "k1", "value": "hello"}, {"key": "k2", "value": "world"}]}'
    kayos = kayos_command()
    curl = "curl -s"
    if cluster.tls_dir is not None:  # the CA and the client certificate (docs/security.md)
        tls = cluster.tls_dir
        curl += f" --cacert {tls}/ca.pem --cert {tls}/client.pem --key {tls}/client.key"
        if not found:
            kayos = f"KAYOS_TLS_CA={tls}/ca.pem KAYOS_TLS_CERT={tls}/client.pem "
            kayos += f"KAYOS_TLS_KEY={tls}/client.key {kayos_command()}"
    return [
        f"{kayos} produce {queue} hello world{seed}",
        f"{kayos} consume {queue} --group g{seed}",
        "or with curl:",
        f"{curl} -XPOST '{head}/v1/queues/{queue}/messages?acks=all' "
        f"-H 'Content-Type: application/json' -d '{body}'",
        f"{curl} '{tail}/v1/queues/{queue}/consume?group=g'",
    ]


class StopSignal:
    """A stop request that a signal handler may set. A handler runs in the main thread between
    two of its bytecodes, possibly while that thread holds a lock inside ``threading.Event.wait``;
    an ``Event.set`` in the handler then waits on that lock forever (``kayos up`` hung on SIGTERM
    that way). So: a plain flag, and a byte down a pipe to wake ``wait``."""

    def __init__(self) -> None:
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._set = False

    def set(self) -> None:
        self._set = True
        with contextlib.suppress(BlockingIOError):  # a full pipe wakes the waiter as well
            os.write(self._wake_write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for ``set``; returns whether it was set."""
        if not self._set:
            select.select([self._wake_read], [], [], timeout_s)
        return self._set

    def close(self) -> None:
        os.close(self._wake_read)
        os.close(self._wake_write)


def supervise(
    cluster: LocalCluster,
    stop: StopSignal,
    echo: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Until ``stop``: starts again, after a backoff (``kayos.local.supervisor``), each member of
    ``cluster`` that dies; a node's exit is first reported to the manager members (signed,
    ``kayos.local.exits``). Returns 0, or 1 once a member died too often in a row."""
    supervisor = Supervisor()
    for member in cluster.members():
        supervisor.started(member, clock())
    # Every poll interval (50 ms): a node's exit is reported to the managers that soon, and its
    # report ends the dead process's lease at its successor (docs/manager.md).
    while not stop.wait(poll_interval_s):
        exits = cluster.exited()
        died = [(member, f"exited with code {code}") for member, code in exits.items()]
        for member, code in exits.items():
            # Before it runs again: the manager splices the dead process out at once.
            outcome = cluster.report_exit(member, code)
            if outcome is not None:
                echo(f"kayos up: {member}'s exit {outcome}")
        for member in supervisor.due(clock()):
            if stop.is_set():
                break
            # The attempt is the start: a member that fails to start is a quick death, not one
            # measured from its last good start (a front that could never start again was
            # otherwise retried forever once that start was a minute old).
            supervisor.started(member, clock())
            try:
                cluster.start(member, wait=False)
            except (ClusterError, OSError) as exc:
                died.append((member, f"did not start: {exc}"))
                continue
            echo(f"kayos up: {member} started again (pid {cluster.pid(member)})")
        for member, why in died:
            if cluster.pid(member) is None:
                with contextlib.suppress(KeyError):  # a spawn that failed left none to reap
                    cluster.kill(member)  # reaps it and closes its log
            decision = supervisor.exited(member, clock())
            if isinstance(decision, GiveUp):
                echo(
                    f"kayos up: {member} {why}; it died {decision.deaths} times in a row soon "
                    f"after starting: giving up. Log tail:"
                )
                echo(log_tail(cluster.log_path(member)))
                return 1
            echo(
                f"kayos up: {member} {why}; starting it again in {decision.delay_s:.2f}s "
                f"(restart {decision.attempt} in a row; log {cluster.log_path(member)})"
            )
    return 0


def run_foreground(cluster: LocalCluster, echo: Callable[[str], None]) -> int:
    """``kayos up``: starts ``cluster``, prints where it is, and runs until SIGINT or SIGTERM,
    then stops every node. A node that dies meanwhile is started again after a bounded backoff
    (``kayos.local.supervisor``), each restart printed. Returns the exit code: 0 after a signal, 1
    if the cluster did not start or a node kept dying."""
    stop = StopSignal()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster.start_all()
        except ClusterError as exc:
            echo(f"kayos up: {exc}")
            return 1
        if stop.is_set():
            return 0
        shards = cluster.topology.shards.values()
        replicas = len(next(iter(shards)).members)
        echo(
            f"kayos up: {len(cluster.ids)} nodes, {len(shards)} shards, replication factor "
            f"{replicas}, topology {cluster.topology_path}"
        )
        if cluster.tls_dir is not None:
            echo(f"  TLS on every port and link: certificates in {cluster.tls_dir}")
        else:
            echo("  open: no TLS, loopback only (kayos up --tls for TLS; docs/security.md)")
        for line in cluster.describe():
            echo(f"  {line}")
        echo("  try:")
        for line in example_commands(cluster):
            echo(f"    {line}")
        echo("  Ctrl-C to stop.")
        return supervise(cluster, stop, echo)
    finally:
        codes = cluster.stop()
        unclean = {node: code for node, code in codes.items() if code != 0}
        if unclean:
            echo(f"kayos up: nodes that did not exit cleanly: {unclean}")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop.close()
