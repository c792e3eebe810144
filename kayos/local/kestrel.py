"""The Kestrel front (``kayos kestrel``) as a child process, and a ``LocalCluster`` that runs one
beside its nodes: ``kayos up``, ``kayos bench kestrel`` and the failover tests start it here.

Like ``kayos.local.cluster`` this is a face: it starts and signals a process and learns its port
from the one line the front prints once bound (``kestrel listening on HOST:PORT``); it imports
nothing of the front or the nodes.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from kayos.cli.address import CLUSTER_ENV, TLS_ENV
from kayos.local.cluster import LocalCluster, poll_interval_s
from kayos.local.processes import (
    ClusterError,
    die_with_parent,
    failure_reason,
    log_tail,
    stop_process,
)

# The front connects to the cluster (topology, group list) and recovers every queue before it
# binds; a few seconds at most on a loaded box, so this bound only trips on a stuck front.
kestrel_ready_timeout_s = 60.0
# After SIGTERM the front closes its connections and takes its last group commits.
kestrel_stop_timeout_s = 15.0
# After the memcache port's line, how long the lines of the other ports asked for may take (the
# front prints them at once; a front that does not serve a protocol yet never prints its line).
other_ports_wait_s = 2.0
# The id a LocalClusterWithKestrel gives the front among its nodes (exit codes, log path).
KESTREL = "kestrel"
_LISTENING = b"kestrel listening on "  # the memcache port; "kestrel <protocol> listening on" else


class KestrelFront:
    """One ``python -m kayos kestrel`` process; stdout and stderr appended to ``log_path``.

    ``port=0`` lets the front pick a port, and ``port`` is the one it bound after ``start``; a
    restart reuses it, so clients reconnect to the same address. ``cluster`` is a node's HTTP URL
    (items kept on that cluster), else the front keeps items in its memory. ``text_port`` and
    ``thrift_port`` (0: any free port) serve those protocols too; None leaves them out. After
    ``start``, ``ports`` maps each protocol that listens to its port. ``config``: a TOML file
    for ``--config``."""

    def __init__(
        self,
        log_path: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cluster: str | None = None,
        text_port: int | None = None,
        thrift_port: int | None = None,
        ready_timeout_s: float = kestrel_ready_timeout_s,
        stop_timeout_s: float = kestrel_stop_timeout_s,
        log_level: str = "WARNING",
        config: str | os.PathLike[str] | None = None,
    ) -> None:
        self.log_path = Path(log_path)
        self.config = config
        self.host = host
        self.port = port
        self.cluster = cluster
        self.text_port = text_port
        self.thrift_port = thrift_port
        self.ports: dict[str, int] = {}
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_level = log_level
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        # The front's client TLS files (KAYOS_TLS_CA and friends) when the cluster speaks TLS.
        self.tls_env: dict[str, str] = {}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "kayos", "kestrel", "--host", self.host]
        command += ["--port", str(self.port), "--log-level", self.log_level]
        if self.cluster is not None:
            command += ["--cluster", self.cluster]
        if self.config is not None:
            command += ["--config", str(self.config)]
        for name, port in (("text", self.text_port), ("thrift", self.thrift_port)):
            command += [f"--no-{name}"] if port is None else [f"--{name}-port", str(port)]
        return command

    def start(self) -> None:
        """Spawns the front and waits until it says it listens; ``ClusterError`` with its log
        tail if it exits first or the bound passes."""
        if self.running():
            raise ClusterError("the kestrel front is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the front stops
        log.write(f"--- kayos: starting the kestrel front at {time.ctime()}\n".encode())
        log.flush()
        offset = log.tell()
        self._log = log
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # The front's cluster is the one this runner names (--cluster) or none: never a
            # KAYOS_CLUSTER the user's shell happens to export (the front would read it).
            env={**_without(os.environ, CLUSTER_ENV), "PYTHONUNBUFFERED": "1", **self.tls_env},
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        self.ports = self._wait_listening(offset)
        self.port = self.ports["memcache"]  # a restart binds the same ports
        if self.text_port is not None:
            self.text_port = self.ports.get("text", self.text_port)
        if self.thrift_port is not None:
            self.thrift_port = self.ports.get("thrift", self.thrift_port)

    def _listening(self, offset: int) -> dict[str, int]:
        """The ports the front has said it listens on, by protocol."""
        ports: dict[str, int] = {}
        with open(self.log_path, "rb") as handle:
            handle.seek(offset)
            for line in handle.read().splitlines():
                words = line.split()
                if len(words) >= 4 and words[0] == b"kestrel" and b":" in words[-1]:
                    if line.startswith(_LISTENING):
                        ports["memcache"] = int(words[-1].rsplit(b":", 1)[1])
                    elif words[2] == b"listening":
                        ports[words[1].decode()] = int(words[-1].rsplit(b":", 1)[1])
        return ports

    def _wait_listening(self, offset: int) -> dict[str, int]:
        assert self.process is not None
        wanted = {"memcache"}
        wanted |= {"text"} if self.text_port is not None else set()
        wanted |= {"thrift"} if self.thrift_port is not None else set()
        deadline = time.monotonic() + self.ready_timeout_s
        others_deadline: float | None = None
        while True:
            ports = self._listening(offset)
            if "memcache" in ports:
                others_deadline = others_deadline or time.monotonic() + other_ports_wait_s
                if wanted <= ports.keys() or time.monotonic() > others_deadline:
                    return ports
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                what = (
                    f"failed to start: {failure_reason(self.log_path)}\n(it exited with code "
                    f"{code})"
                    if code is not None
                    else "did not listen in time;"
                )
                self.kill()
                raise ClusterError(
                    f"the kestrel front {what} log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            time.sleep(poll_interval_s)  # a bounded poll of a condition

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        """The exit code if the front has exited on its own, else None."""
        return None if self.process is None else self.process.poll()

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        """Sends ``sig`` and waits for the exit (SIGKILL past the bound); returns the exit
        code, None if it was not started."""
        process = self.process
        if process is None:
            return None
        code = stop_process(process, sig, self.stop_timeout_s)
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def stop(self) -> int | None:
        """SIGTERM (a graceful stop), SIGKILL past ``stop_timeout_s``."""
        return self.kill(signal.SIGTERM)

    def restart(self) -> None:
        """Stops (if running) and starts again on the same port."""
        if self.running():
            self.stop()
        self.start()


def try_it_command(address: str, queue: str = "jobs") -> str:
    """A one-line memcache session against the front at ``address`` (python-memcached is in the
    venv's dev extra): set, then an open read and its confirmation."""
    code = (
        f"import memcache; c = memcache.Client(['{address}']); c.set('{queue}', 'hello'); "
        f"print(c.get('{queue}/t=1000/open'), c.get('{queue}/close'))"
    )
    python = os.path.relpath(sys.executable)  # .venv/bin/python under `make run`
    if python.startswith(".."):
        python = sys.executable
    return f'{shlex.quote(python)} -c "{code}"'


class LocalClusterWithKestrel(LocalCluster):
    """``kayos up``: a ``LocalCluster`` whose nodes are joined by the Kestrel front on
    ``kestrel_port`` (memcache), ``text_port`` and ``thrift_port`` (None: not served). It starts
    once every node is ready and the chains agree, with ``--cluster`` the first node's URL, and
    stops first (it takes its last group commits), then the nodes. Among the exit codes, its log
    path and ``exited`` it is the member ``"kestrel"``."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        kestrel_port: int,
        text_port: int | None = None,
        thrift_port: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_dir, **options)
        self.kestrel: KestrelFront | None = None
        self.kestrel_port = kestrel_port
        self.text_port = text_port
        self.thrift_port = thrift_port

    def log_path(self, node: str) -> Path:
        if node == KESTREL:
            return self.base_dir / "logs" / "kestrel.log"
        return super().log_path(node)

    def check_ports(self) -> None:
        """The nodes' ports, then the front's: all are checked before anything starts."""
        super().check_ports()
        fronts = (
            ("memcache", self.kestrel_port, "--kestrel-port (0: no front)"),
            ("text", self.text_port, "--kestrel-text-port (0: none)"),
            ("thrift", self.thrift_port, "--kestrel-thrift-port (0: none)"),
        )
        for protocol, port, flag in fronts:
            if port:  # None: not served; 0: any free port
                self.check_port(port, f"the kestrel front's {protocol} port", flag)

    def start_all(self) -> None:
        super().start_all()
        front = KestrelFront(
            self.log_path(KESTREL),
            host=self.host,
            port=self.kestrel_port,
            cluster=self.url(self.ids[0]),
            text_port=self.text_port,
            thrift_port=self.thrift_port,
        )
        if self.tls_dir is not None:
            files = [f"{self.tls_dir}/{name}" for name in ("ca.pem", "client.pem", "client.key")]
            front.tls_env = dict(zip(TLS_ENV, files, strict=True))
        try:
            front.start()
        except ClusterError as exc:
            super().stop()
            raise ClusterError(f"{exc}\n(--kestrel-port 0 starts the nodes without it)") from exc
        self.kestrel = front

    def stop(self) -> dict[str, int]:
        codes: dict[str, int] = {}
        if self.kestrel is not None:
            code = self.kestrel.stop()
            if code is not None:
                codes[KESTREL] = code
            self.kestrel = None
        codes.update(super().stop())
        return codes

    def members(self) -> list[str]:
        return [*super().members(), KESTREL]

    def start(self, node: str, *, wait: bool = True) -> None:
        """As ``LocalCluster.start``; ``"kestrel"`` starts the front again on its ports (it
        always waits until the front listens)."""
        if node != KESTREL:
            super().start(node, wait=wait)
        elif self.kestrel is not None:
            self.kestrel.start()

    def kill(self, node: str, sig: int = signal.SIGKILL) -> int:
        if node != KESTREL:
            return super().kill(node, sig)
        code = self.kestrel.kill(sig) if self.kestrel is not None else None
        return -1 if code is None else code

    def pid(self, node: str) -> int | None:
        if node != KESTREL:
            return super().pid(node)
        process = self.kestrel.process if self.kestrel is not None else None
        return process.pid if process is not None and process.poll() is None else None

    def exited(self) -> dict[str, int]:
        codes = super().exited()
        if self.kestrel is not None:
            code = self.kestrel.exit_code()
            if code is not None:
                codes[KESTREL] = code
        return codes

    def describe(self) -> list[str]:
        lines = super().describe()
        if self.kestrel is not None:
            address, seed = self.kestrel.address, self.url(self.ids[0])
            others = "".join(
                f", {protocol} {self.host}:{port}"
                for protocol, port in self.kestrel.ports.items()
                if protocol != "memcache"
            )
            lines.append(
                f"kestrel: memcache {address}{others}  (items on this cluster via {seed})"
                f"  log {self.log_path(KESTREL)}"
            )
            lines.append(f"  try: {try_it_command(address)}")
        return lines


def _without(environ: Mapping[str, str], name: str) -> dict[str, str]:
    return {key: value for key, value in environ.items() if key != name}
