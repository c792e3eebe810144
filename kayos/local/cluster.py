"""A local cluster of real ``kayos node`` processes on loopback: ``kayos up``, the bench and the
integration tests start nodes through this one class.

It is a face: it writes the topology file, starts and signals processes, and reaches nodes over
HTTP only (``GET /v1/status``, docs/node-api.md). It imports no storage or node code, so what it
sees is what any client sees.

Ports are probed free (``kayos.local.ports``); another process may take one between our probe and
the node's bind. A node that fails to start for that reason is detected from its log, and the whole
cluster is started again on fresh ports (every node reads every address from the one file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from kayos.datadir import DirectoryLock
from kayos.errors import DirectoryInUseError, KayosError
from kayos.identity import ClusterIdentity, write_private
from kayos.local.certs import local_tls, tls_table
from kayos.local.exits import report_exit
from kayos.local.http import http_json
from kayos.local.managers import manager_command, manager_ids, members_on, wait_leader
from kayos.local.ports import free_ports
from kayos.local.processes import (
    START_MARKER,
    ClusterError,
    die_with_parent,
    failure_reason,
    log_tail,
    stop_process,
)
from kayos.manager.member.config import Config, MemberAddr, managers_toml
from kayos.ports import check_free
from kayos.topology import NodeAddr, ShardChain, Topology, rotated

# A node opens its stores and links before it says ready; a cold start of a few shards takes well
# under a second, so this bound only trips on a node that is stuck or crashed.
ready_timeout_s_default = 30.0
# After SIGTERM a node closes its stores (one last fsync) and exits; past this it is killed.
stop_timeout_s_default = 10.0
# How often readiness and catch-up conditions are polled: a bounded poll of a condition.
poll_interval_s = 0.05
# Starting the whole cluster again on fresh ports after a lost race for a probed port.
port_race_attempts_max = 3
# One status request; a node that does not answer within this is treated as not ready yet.
status_request_timeout_s = 2.0

NODE_IDS = "abcdefghijklmnopqrstuvwxyz"
# What a node's log says when another process took a port probed free for it.
_ADDRESS_IN_USE = ("address already in use", "errno 98", "eaddrinuse")


def existing_identity(path: Path) -> ClusterIdentity | None:
    """The identity in an earlier run's topology file, if there is a readable one."""
    try:
        return Topology.load(str(path)).identity
    except (OSError, KayosError):
        return None


def node_ids(count: int) -> list[str]:
    """Node ids ``a``, ``b``, ... (the names docs/node-api.md uses)."""
    if not 1 <= count <= len(NODE_IDS):
        raise ValueError(f"node count must be 1 .. {len(NODE_IDS)}")
    return list(NODE_IDS[:count])


def build_topology(
    addresses: list[NodeAddr],
    *,
    replicas: int,
    shard_count: int | None = None,
    fanout: int = 0,
    epoch: int = 1,
) -> Topology:
    """Rotated roles (``topology.rotated``); with ``fanout`` > 0, each shard's chain of
    ``replicas`` nodes feeds the next ``fanout`` nodes in rotation, which are its tails."""
    if fanout == 0:
        return rotated(addresses, replicas=replicas, shard_count=shard_count, epoch=epoch)
    if replicas < 1 or fanout < 0 or replicas + fanout > len(addresses):
        raise ValueError(f"replicas + fanout must be at most the {len(addresses)} nodes")
    ids = [address.id for address in addresses]
    count = len(ids) if shard_count is None else shard_count
    shards = {}
    for shard in range(count):
        members = [ids[(shard + k) % len(ids)] for k in range(replicas + fanout)]
        shards[shard] = ShardChain(shard, tuple(members[:replicas]), tuple(members[replicas:]))
    return Topology(epoch, {address.id: address for address in addresses}, shards)


class LocalCluster:
    """``nodes`` node processes on ``host``, one directory each under ``base_dir``.

    Layout: ``base_dir/cluster.toml`` (the topology), ``base_dir/<id>/`` (a node's data) and
    ``base_dir/logs/<id>.log`` (its stdout and stderr, appended across restarts).

    With ``base_port`` node i listens on HTTP ``base_port + i`` and binary ``base_port + 100 + i``
    (``kayos up``: 7101.., 7201..); without it the ports are picked free. Call from a thread that
    lives as long as the cluster: on Linux the nodes die with the thread that started them.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        nodes: int = 3,
        replicas: int = 3,
        shards: int | None = None,
        fanout: int = 0,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        ready_timeout_s: float = ready_timeout_s_default,
        stop_timeout_s: float = stop_timeout_s_default,
        env: dict[str, str] | None = None,
        node_command: list[str] | None = None,
        managers: int = 0,
        manager_config: Config | None = None,
        queue_shards: dict[str, int] | None = None,
        tls: bool = False,
        client_auth: bool = False,
    ) -> None:
        self.base_dir = Path(base_dir)
        # Queues spread over several shards (docs/node-api.md, "Queues over several shards").
        self.queue_shards = dict(queue_shards or {})
        self.ids = node_ids(nodes)
        self.replicas = replicas
        self.shard_count = shards
        self.fanout = fanout
        self.host = host
        self.base_port = base_port
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.env = env
        # What runs a node; the arguments ``--config F --id N --data D`` follow. Tests put a stub
        # here to test the launcher alone.
        self.node_command = node_command or [sys.executable, "-m", "kayos", "node"]
        self.topology_path = self.base_dir / "cluster.toml"
        # Manager members (docs/manager.md): started after the nodes, supervised like them.
        self.manager_ids = manager_ids(managers)
        self.manager_config = manager_config
        self.manager_members: list[MemberAddr] = []
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        # Nodes started from their own file rather than the cluster's (add_outside_node).
        self.config_paths: dict[str, Path] = {}
        self._logs: dict[str, IO[bytes]] = {}
        # The cluster's id and secret: kept from an earlier run's file in base_dir (its data
        # directories belong to that cluster), else new.
        self.identity = existing_identity(self.topology_path) or ClusterIdentity.generate()
        self._root_lock: DirectoryLock | None = None
        self.topology = self._make_topology()
        # TLS on every port and link (docs/security.md): certificates in base_dir/tls.
        self.tls_dir: str | None = None
        self.client_auth = client_auth
        if tls:
            members = dict.fromkeys([*self.ids, *self.manager_ids], self.host)
            self.tls_dir = local_tls(str(self.base_dir), members)

    # --- addresses -----------------------------------------------------------------------------

    def _make_topology(self) -> Topology:
        count, managers = len(self.ids), len(self.manager_ids)
        if self.base_port is None:
            ports = free_ports(2 * count + 2 * managers, self.host)
            http_ports, bin_ports = ports[:count], ports[count : 2 * count]
            manager_ports = ports[2 * count :]
        else:
            http_ports = [self.base_port + i for i in range(count)]
            bin_ports = [self.base_port + 100 + i for i in range(count)]
            # Raft base+200+i, HTTP base+300+i (kayos up: 7301.., 7401..).
            manager_ports = [self.base_port + 200 + i for i in range(managers)]
            manager_ports += [self.base_port + 300 + i for i in range(managers)]
        self.manager_members = members_on(self.manager_ids, self.host, manager_ports)
        addresses = [
            NodeAddr(node, self.host, http_port, bin_port)
            for node, http_port, bin_port in zip(self.ids, http_ports, bin_ports, strict=True)
        ]
        built = build_topology(
            addresses, replicas=self.replicas, shard_count=self.shard_count, fanout=self.fanout
        )
        return dataclasses.replace(built, queues=self.queue_shards).with_identity(self.identity)

    @property
    def urls(self) -> dict[str, str]:
        """Each node's HTTP base URL, by node id."""
        return {node: address.http_url for node, address in self.topology.nodes.items()}

    def url(self, node: str) -> str:
        return self.topology.nodes[node].http_url

    def data_dir(self, node: str) -> Path:
        return self.base_dir / node

    def log_path(self, node: str) -> Path:
        return self.base_dir / "logs" / f"{node}.log"

    def head_of(self, queue: str) -> str:
        return self.topology.chain_for(queue).head

    def tails_of(self, queue: str) -> tuple[str, ...]:
        return self.topology.chain_for(queue).tails

    # --- life cycle ----------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start_all(self) -> None:
        """Writes the topology file, starts every node, and waits until all are ready and every
        shard's replicas are linked and agree (a node says ready before its replication links
        are up, and a tail catching up refuses reads). A lost race for a probed port starts
        everything again on fresh ports."""
        for attempt in range(1, port_race_attempts_max + 1):
            self.preflight()
            write_private(str(self.topology_path), self.topology_text())
            for node in self.ids:
                self._spawn(node)
            try:
                self.wait_ready(self.ids)
                self.wait_replicated(self.ready_timeout_s)
                for member in self.manager_ids:
                    self._spawn(member)
                self.wait_manager_leader()
                return
            except ClusterError:
                raced = self.base_port is None and any(
                    self._lost_port_race(node) for node in self.ids
                )
                self.stop()
                if not raced or attempt == port_race_attempts_max:
                    raise
                self.topology = self._make_topology()

    def preflight(self) -> None:
        """Before any process starts or any file is written: owns the data root (a second
        launcher on it is refused; docs/node-api.md "Owners, locks and ports") and, with fixed
        ports, checks each can be bound, so a cluster that would collide with a running one
        starts nothing. ``ClusterError`` says which and how to move it."""
        if self._root_lock is None:
            try:
                self._root_lock = DirectoryLock.acquire(self.base_dir, what="kayos data root")
            except DirectoryInUseError as exc:
                raise ClusterError(
                    f"{exc}: another kayos up runs on it; stop that one or pass another --data"
                ) from exc
            except KayosError as exc:
                raise ClusterError(str(exc)) from exc
        try:
            self.check_ports()
        except ClusterError:
            self.release_root()
            raise

    def check_ports(self) -> None:
        """With fixed ports (``base_port``), ``ClusterError`` if any node's is taken."""
        if self.base_port is None:
            return  # ports probed free just now; a lost race is retried on fresh ones
        for address in self.topology.nodes.values():
            for kind, port in (("http", address.http_port), ("bin", address.bin_port)):
                self.check_port(port, f"node {address.id}'s {kind} port", "--base-port")
        for member in self.manager_members:
            for kind, port in (("raft", member.raft_port), ("http", member.http_port)):
                self.check_port(port, f"manager {member.id}'s {kind} port", "--base-port")

    def check_port(self, port: int, what: str, flag: str) -> None:
        """``ClusterError`` if ``port`` is taken now, naming ``flag`` as the way to move it."""
        try:
            check_free(self.host, port, what=what, hint=f"pass another {flag}")
        except KayosError as exc:  # AddressInUseError, or the bind failed otherwise
            raise ClusterError(str(exc)) from exc

    def release_root(self) -> None:
        """Gives up the data root (after ``stop``: nothing of this launcher runs on it)."""
        lock, self._root_lock = self._root_lock, None
        if lock is not None:
            lock.release()

    def start(self, node: str, *, wait: bool = True) -> None:
        """(Re)starts one node on its data directory and waits until it is ready (unless
        ``wait`` is false: ``kayos up`` restarting a node that died polls it itself)."""
        if self.running(node):
            raise ClusterError(f"node {node} is already running")
        self._spawn(node)
        if wait and node in self.manager_ids:
            self.wait_manager_leader()
        elif wait:
            self.wait_ready([node])

    def add_outside_node(self, node: str) -> NodeAddr:
        """Starts node ``node``, which the cluster's file does not name, as an operator adds one:
        free ports and its own file (the cluster's topology naming it too, at the same epoch).
        From then on it is started and signalled like the others; telling the manager (``kayos
        ctl add-node``) is the caller's part. Returns its address."""
        if node in self.topology.nodes or node in self.manager_ids:
            raise ClusterError(f"node {node} is already in the cluster")
        address = self._outside_address(node)
        nodes = {**self.topology.nodes, node: address}
        self.topology = dataclasses.replace(self.topology, nodes=nodes)
        self.config_paths[node] = self.base_dir / f"{node}.toml"
        write_private(str(self.config_paths[node]), self.topology_text())
        self.ids.append(node)
        self.start(node)
        return address

    def _outside_address(self, node: str) -> NodeAddr:
        """Where ``add_outside_node`` puts node ``node``: free ports on the cluster's host (a
        subclass with other networking gives its own)."""
        http_port, bin_port = free_ports(2, self.host)
        return NodeAddr(node, self.host, http_port, bin_port)

    def members(self) -> list[str]:
        """What ``kayos up`` supervises: every node and manager member (and, in a subclass,
        other processes)."""
        return [*self.ids, *self.manager_ids]

    # --- manager members -----------------------------------------------------------------------

    def topology_text(self) -> str:
        """The topology file: the nodes and shards, then the manager members and bounds."""
        text = self.topology.dumps_toml()
        if self.manager_members:
            text += "\n" + managers_toml(self.manager_members, self.manager_config)
        if self.tls_dir is not None:
            text += "\n" + tls_table(self.tls_dir, self.client_auth)
        return text

    def manager_url(self, member: str) -> str:
        return next(m.http_url for m in self.manager_members if m.id == member)

    @property
    def manager_urls(self) -> list[str]:
        """Every manager member's HTTP base URL (what an operator request is sent to)."""
        return [member.http_url for member in self.manager_members]

    def wait_manager_leader(self, timeout_s: float | None = None) -> str | None:
        """The manager group's leader once every running member agrees on one (None without
        managers); ``ClusterError`` with the members' logs if the bound passes."""
        if not self.manager_members:
            return None
        running = [m for m in self.manager_members if self.running(m.id)]
        leader = wait_leader(
            running,
            self.ready_timeout_s if timeout_s is None else timeout_s,
            self.cluster_secret,
        )
        if leader is None:
            logs = "\n".join(f"{m}: {log_tail(self.log_path(m), 10)}" for m in self.manager_ids)
            raise ClusterError(f"the manager members elected no leader in time:\n{logs}")
        return leader

    def pid(self, node: str) -> int | None:
        """The process id of a running node, else None."""
        process = self.processes.get(node)
        return process.pid if process is not None and process.poll() is None else None

    def kill(self, node: str, sig: int = signal.SIGKILL) -> int:
        """Sends ``sig`` to one node and waits for it to exit; returns its exit code."""
        code = stop_process(self.processes.pop(node), sig, self.stop_timeout_s)
        self._close_log(node)
        return code

    def wait_exit(self, node: str) -> int:
        """Waits for a node already sent a signal to exit (SIGKILL past ``stop_timeout_s``);
        returns its exit code."""
        code = stop_process(self.processes.pop(node), None, self.stop_timeout_s)
        self._close_log(node)
        return code

    def stop(self) -> dict[str, int]:
        """SIGTERM to every node, SIGKILL to any still running after ``stop_timeout_s``;
        returns each node's exit code. The manager members stop first: a node stopping cleanly
        says goodbye to the leader, which would splice each out in turn (docs/manager.md), while
        a whole cluster stopping should keep its chains for its next start."""
        codes: dict[str, int] = {}
        managers = [m for m in self.processes if m in self.manager_ids]
        others = [m for m in self.processes if m not in self.manager_ids]
        for group in (managers, others):
            for member in group:
                with contextlib.suppress(ProcessLookupError):
                    self.processes[member].send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            for member in group:
                codes[member] = stop_process(
                    self.processes.pop(member),
                    None,
                    max(0.0, deadline - time.monotonic()),
                    self.stop_timeout_s,
                )
                self._close_log(member)
        self.release_root()
        return codes

    def report_exit(self, member: str, code: int) -> str | None:
        """Reports a node process's exit to the manager members (``kayos.local.exits``) and
        says how it went; None for a member that is no node, or without managers."""
        if member not in self.topology.nodes or not self.manager_members:
            return None
        return report_exit(
            self.identity, self.manager_urls, member, str(self.data_dir(member)), code
        )

    def running(self, node: str) -> bool:
        process = self.processes.get(node)
        return process is not None and process.poll() is None

    def exited(self) -> dict[str, int]:
        """Nodes this cluster started that have exited on their own, with their exit codes."""
        codes = {node: process.poll() for node, process in self.processes.items()}
        return {node: code for node, code in codes.items() if code is not None}

    def _spawn(self, node: str) -> None:
        assert node in self.topology.nodes or node in self.manager_ids, node
        assert not self.running(node), node
        self.data_dir(node).mkdir(parents=True, exist_ok=True)
        self.log_path(node).parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(node), "ab")  # noqa: SIM115 - closed when the node stops
        log.write(f"{START_MARKER} {node} at {time.ctime()}\n".encode())
        log.flush()
        self._logs[node] = log
        command = [
            *self.node_command,
            "--config",
            str(self.config_paths.get(node, self.topology_path)),
            "--id",
            node,
            "--data",
            str(self.data_dir(node)),
        ]
        if node in self.manager_ids:
            command = manager_command(str(self.topology_path), node, str(self.data_dir(node)))
        command = self.spawn_command(node, command)
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        self.processes[node] = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: a Ctrl-C at the terminal reaches the launcher, which stops the
            # nodes in order, rather than every node at once.
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )

    def spawn_command(self, member: str, command: list[str]) -> list[str]:
        """The command that starts ``member``, as built above; a subclass may wrap it (the chaos
        campaign's network namespaces, the listen flags behind its fault proxies)."""
        return command

    def _close_log(self, node: str) -> None:
        log = self._logs.pop(node, None)
        if log is not None:
            log.close()

    def _lost_port_race(self, node: str) -> bool:
        tail = log_tail(self.log_path(node)).lower()
        return any(marker in tail for marker in _ADDRESS_IN_USE)

    # --- conditions ----------------------------------------------------------------------------

    @property
    def cluster_secret(self) -> bytes:
        """The secret the cluster proves now: its file's, which a rotation changes."""
        with contextlib.suppress(OSError, KayosError):
            identity = Topology.load(str(self.topology_path)).identity
            if identity is not None:
                return identity.secret
        return self.identity.secret

    def status(self, node: str) -> dict[str, Any] | None:
        """The node's ``GET /v1/status`` reply, or None if it does not answer with one."""
        try:
            code, body = http_json(
                self.url(node) + "/v1/status",
                timeout_s=status_request_timeout_s,
                cluster_secret=self.cluster_secret,
            )
        except (OSError, ValueError):
            return None
        return body if code == 200 and isinstance(body, dict) else None

    def wait_ready(self, nodes: list[str], timeout_s: float | None = None) -> None:
        """Waits until each node answers ``/v1/status`` with ``"ready": true``; raises
        ``ClusterError`` with the node's log tail if it exits or the bound passes."""
        deadline = time.monotonic() + (self.ready_timeout_s if timeout_s is None else timeout_s)
        waiting = list(nodes)
        while waiting:
            for node in list(waiting):
                process = self.processes.get(node)
                if process is None or process.poll() is not None:
                    code = None if process is None else process.returncode
                    reason = failure_reason(self.log_path(node))
                    raise ClusterError(
                        f"node {node} failed to start: {reason}\n"
                        f"(it exited with code {code} before it was ready) log "
                        f"{self.log_path(node)}:\n{log_tail(self.log_path(node))}"
                    )
                status = self.status(node)
                if status is not None and status.get("ready") is True:
                    waiting.remove(node)
            if not waiting:
                return
            if time.monotonic() > deadline:
                node = waiting[0]
                raise ClusterError(
                    f"node {node} not ready within the bound; log "
                    f"{self.log_path(node)}:\n{log_tail(self.log_path(node))}"
                )
            time.sleep(poll_interval_s)  # a bounded poll of a condition

    def wait_replicated(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Waits until, for every shard, every member reports the same ``last_seq`` and
        ``committed_seq`` and none is catching up; returns each shard's seq."""
        deadline = time.monotonic() + timeout_s
        while True:
            agreed = self._replicated_seqs()
            if agreed is not None:
                return agreed
            if time.monotonic() > deadline:
                seen = {node: self.status(node) for node in self.topology.nodes}
                raise ClusterError(f"replicas did not converge within {timeout_s}s: {seen}")
            time.sleep(poll_interval_s)  # a bounded poll of a condition

    def live_topology(self) -> Topology:
        """The newest topology the running nodes hold: after the manager changed chains it is
        at a higher epoch than the file this launcher wrote (nodes keep it in their data
        directories, docs/node-api.md "Topology changes"), and a restart must judge the chains by
        it. The file's when no node answers with a newer one."""
        newest = self.topology
        for node in self.topology.nodes:
            try:
                code, body = http_json(
                    self.url(node) + "/v1/topology", timeout_s=status_request_timeout_s
                )
                found = Topology.from_json(body) if code == 200 else None
            except (OSError, ValueError, KayosError):
                continue
            if found is not None and found.epoch > newest.epoch:
                newest = found
        return newest

    def _replicated_seqs(self) -> dict[int, int] | None:
        statuses = {node: self.status(node) for node in self.topology.nodes}
        agreed: dict[int, int] = {}
        for shard in self.live_topology().shards.values():
            seqs: set[int] = set()
            for node in shard.members:
                status = statuses[node]
                if status is None:
                    return None
                replica = status.get("shards", {}).get(str(shard.id))
                if replica is None or replica.get("catching_up"):
                    return None
                if shard.upstream_of(node) and replica.get("upstream_linked") is False:
                    return None
                seqs.add(int(replica["last_seq"]))
                seqs.add(int(replica["committed_seq"]))
            if len(seqs) != 1:
                return None
            agreed[shard.id] = seqs.pop()
        return agreed

    def describe(self) -> list[str]:
        """One line per node and per shard chain, for ``kayos up`` and test logs."""
        lines = [
            f"node {node}: {address.http_url}  (binary {address.host}:{address.bin_port})  "
            f"data {self.data_dir(node)}  log {self.log_path(node)}  pid {self.pid(node)}"
            for node, address in self.topology.nodes.items()
        ]
        for shard in self.live_topology().shards.values():
            chain = " -> ".join(shard.chain)
            fanout = f" -> [{', '.join(shard.fanout)}]" if shard.fanout else ""
            lines.append(
                f"shard {shard.id}: {chain}{fanout}  (head first; tails: {', '.join(shard.tails)})"
            )
        lines += [
            f"manager {m.id}: {m.http_url}  (raft {m.raft_address})  data {self.data_dir(m.id)}  "
            f"log {self.log_path(m.id)}  pid {self.pid(m.id)}"
            for m in self.manager_members
        ]
        return lines
