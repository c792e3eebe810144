"""``kayos bench kestrel``: the Kestrel memcache front's rates under a real memcache client, and
the same client workload against memcached for scale.

Workload: python-memcached clients, each with its own connection, from ``clients`` threads (or
processes) at once, ``ops`` operations per scenario shared among them, 100-byte items, all
clients on one queue. Threads by default: their GIL holds the clients to about one core, which
leaves the server a core of its own on a small machine; with processes, 16 client interpreters
take every core from the single-threaded front (memcached needs far less CPU), so the ratio then
measures who wins the CPU more than what a request costs. Both are there to compare.

- ``set``: ``set q 0 0 100`` answered ``STORED``;
- ``get_open_close``: one reliable read, ``get q/open`` (an item) then ``get q/close`` (``END``):
  two requests per op. The queue holds the items the ``set`` scenario just stored.

Each scenario runs against the front with its memory backend and, with ``cluster``, against a
front keeping its items on a ``LocalCluster`` of three node processes (replication factor 3,
fsync on: every ``set`` is committed on the whole chain before ``STORED``). The front and the
nodes are child processes on this machine. When a memcached binary is on PATH (or an address is
given) the same requests go to memcached: there ``q/open`` is a plain key holding an item of the
same size and ``q/close`` a miss, so the bytes on the wire match. ``ratio`` is the front's ops/s
over memcached's (target >= 0.5).

Figures per scenario: ``ops_per_s`` (ops over the wall time from the moment every client is
connected until the last one finishes), ``p50_ms``/``p99_ms`` (per op, as the client sees it).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from kayos.bench.produce import machine_facts, percentile_ms
from kayos.local.cluster import LocalCluster
from kayos.local.kestrel import KestrelFront
from kayos.local.ports import free_ports

WORKLOADS = ("set", "get_open_close")
BENCH_QUEUE = "bench"
WORKERS = ("threads", "processes")
# Client round trips before timing starts (connects, warms the server's paths).
warmup_ops = 20
# How long memcached may take to accept connections, and a client to get ready.
startup_timeout_s = 30.0
# One request, as python-memcached waits for it (a cluster-backed set waits for the chain).
client_socket_timeout_s = 60.0


@dataclass(frozen=True, slots=True)
class KestrelBenchParameters:
    clients: tuple[int, ...] = (1, 16)
    ops: int = 20_000
    cluster_ops: int = 5_000
    value_bytes: int = 100
    cluster: bool = False
    memcached: str | None = None
    workers: str = "threads"

    def __post_init__(self) -> None:
        if not self.clients or min(self.clients) < 1:
            raise ValueError("clients must be counts >= 1")
        if self.ops < 1 or self.cluster_ops < 1 or self.value_bytes < 0:
            raise ValueError("ops and cluster_ops must be >= 1, value_bytes >= 0")
        if self.workers not in WORKERS:
            raise ValueError(f"workers must be one of {', '.join(WORKERS)}")


@dataclass(slots=True)
class ClientRun:
    started: float = 0.0
    finished: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    error: str | None = None


# --- one client (a thread or a process) ---


def _client_ops(address: str, workload: str, queue: str, ops: int, value: bytes) -> Iterator[Any]:
    """Yields once connected and warm, then runs ``ops`` operations when resumed; the caller
    times them. Raises on a reply that is not what the workload expects."""
    import memcache  # python-memcached, in the dev extra

    client = memcache.Client([address], dead_retry=0, socket_timeout=client_socket_timeout_s)
    try:
        for _ in range(warmup_ops):
            if not client.set(f"{queue}-warm", value) or client.get(f"{queue}-warm") is None:
                raise RuntimeError(f"warm-up against {address} failed")
        yield None
        if workload == "set":
            for _ in range(ops):
                began = time.perf_counter()
                if not client.set(queue, value):
                    raise RuntimeError("set not STORED")
                yield time.perf_counter() - began
        else:
            open_key, close_key = f"{queue}/open", f"{queue}/close"
            for _ in range(ops):
                began = time.perf_counter()
                if client.get(open_key) is None:
                    raise RuntimeError("get/open found no item")
                client.get(close_key)
                yield time.perf_counter() - began
    finally:
        client.disconnect_all()


def _run_client(
    address: str, workload: str, queue: str, ops: int, value: bytes, barrier: Any
) -> ClientRun:
    run = ClientRun()
    try:
        steps = _client_ops(address, workload, queue, ops, value)
        next(steps)
        barrier.wait(startup_timeout_s)
        run.started = time.monotonic()
        run.latencies_s = list(steps)
        run.finished = time.monotonic()
    except Exception as error:  # Reported to the parent, which fails the bench with it.
        run.error = repr(error)
        with contextlib.suppress(Exception):
            barrier.abort()
    return run


def _client_process(
    address: str, workload: str, queue: str, ops: int, value: bytes, barrier: Any, results: Any
) -> None:
    run = _run_client(address, workload, queue, ops, value, barrier)
    results.put((run.started, run.finished, run.latencies_s, run.error))


def drive(
    address: str, workload: str, clients: int, ops: int, value: bytes, workers: str, queue: str
) -> dict[str, Any]:
    """Runs one scenario: ``clients`` clients share ``ops`` operations; returns its figures."""
    shares = [ops // clients + (1 if n < ops % clients else 0) for n in range(clients)]
    shares = [share for share in shares if share > 0]
    runs: list[ClientRun] = []
    if workers == "threads":
        barrier: Any = threading.Barrier(len(shares))
        threads = [
            threading.Thread(
                target=lambda share=share: runs.append(
                    _run_client(address, workload, queue, share, value, barrier)
                )
            )
            for share in shares
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(len(shares))
        results = context.Queue()
        processes = [
            context.Process(
                target=_client_process,
                args=(address, workload, queue, share, value, barrier, results),
            )
            for share in shares
        ]
        for process in processes:
            process.start()
        for _ in processes:
            started, finished, latencies, error = results.get(
                timeout=startup_timeout_s + client_socket_timeout_s * max(shares)
            )
            runs.append(ClientRun(started, finished, latencies, error))
        for process in processes:
            process.join(startup_timeout_s)
    errors = [run.error for run in runs if run.error is not None]
    if errors:
        raise RuntimeError(f"{workload} with {clients} clients against {address}: {errors[0]}")
    seconds = max(run.finished for run in runs) - min(run.started for run in runs)
    latencies = [latency for run in runs for latency in run.latencies_s]
    return {
        "ops": len(latencies),
        "seconds": round(seconds, 3),
        "ops_per_s": round(len(latencies) / seconds) if seconds > 0 else 0,
        "p50_ms": percentile_ms(latencies, 0.50),
        "p99_ms": percentile_ms(latencies, 0.99),
    }


# --- the servers ---


@contextlib.contextmanager
def memcached_server(given: str | None) -> Iterator[str | None]:
    """The memcached to compare with: ``given`` (HOST:PORT) as is, else a ``memcached`` from
    PATH started on a free loopback port for the bench, else None."""
    if given is not None:
        yield given
        return
    binary = shutil.which("memcached")
    if binary is None:
        yield None
        return
    port = free_ports(1)[0]
    command = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "256"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command += ["-u", "root"]  # memcached refuses to run as root without it
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
                raise RuntimeError(f"memcached did not start: {stderr.strip()}")
            time.sleep(0.05)  # a bounded poll of a condition
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def _prepare_memcached(address: str, clients: int, value: bytes) -> None:
    """memcached has no queues: ``q/open`` is a key that holds an item (a hit, as the front's
    open read is) and ``q/close`` a key that holds none."""
    import memcache

    client = memcache.Client([address], dead_retry=0, socket_timeout=client_socket_timeout_s)
    try:
        queue = f"{BENCH_QUEUE}{clients}"
        if not client.set(f"{queue}/open", value):
            raise RuntimeError(f"memcached at {address} refused a set")
        client.delete(f"{queue}/close")
    finally:
        client.disconnect_all()


def _scenarios(
    address: str, parameters: KestrelBenchParameters, ops: int, value: bytes, *, memcached: bool
) -> dict[tuple[str, int], dict[str, Any]]:
    figures = {}
    for clients in parameters.clients:
        queue = f"{BENCH_QUEUE}{clients}"
        if memcached:
            _prepare_memcached(address, clients, value)
        for workload in WORKLOADS:
            figures[workload, clients] = drive(
                address, workload, clients, ops, value, parameters.workers, queue
            )
    return figures


def _front_scenarios(
    log: str, cluster: str | None, parameters: KestrelBenchParameters, value: bytes
) -> tuple[dict[tuple[str, int], dict[str, Any]], int | None]:
    """Starts a front (on ``cluster`` if given), runs the scenarios, stops it: the figures and
    the front's exit code."""
    front = KestrelFront(log, cluster=cluster)
    front.start()
    ops = parameters.ops if cluster is None else parameters.cluster_ops
    try:
        figures = _scenarios(front.address, parameters, ops, value, memcached=False)
    finally:
        code = front.stop()
    return figures, code


def bench_kestrel(
    parameters: KestrelBenchParameters,
    base: str | None = None,
    phase: Callable[[str], None] = lambda _name: None,
) -> dict[str, Any]:
    """Runs every scenario (memcached, the memory-backed front, and the cluster-backed front
    with ``parameters.cluster``) and returns the figures with the parameters and machine facts;
    ``phase`` is told which backend runs as it begins (a progress display)."""
    directory = base or tempfile.mkdtemp(prefix="kayos-bench-kestrel-")
    value = bytes(range(256))[: parameters.value_bytes].ljust(parameters.value_bytes, b"x")
    results: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    exits: dict[str, int | None] = {}
    try:
        with memcached_server(parameters.memcached) as memcached:
            if memcached is not None:
                phase("memcached")
                results["memcached"] = _scenarios(
                    memcached, parameters, parameters.ops, value, memcached=True
                )
        log = os.path.join(directory, "kestrel-memory.log")
        phase("the front on the memory backend")
        results["memory"], exits["memory"] = _front_scenarios(log, None, parameters, value)
        if parameters.cluster:
            phase("the front on a local 3-node chain")
            with LocalCluster(os.path.join(directory, "cluster"), nodes=3, replicas=3) as cluster:
                log = os.path.join(directory, "kestrel-cluster.log")
                seed = cluster.url(cluster.ids[0])
                results["cluster"], exits["cluster"] = _front_scenarios(
                    log, seed, parameters, value
                )
    finally:
        if base is None:
            shutil.rmtree(directory, ignore_errors=True)
    scenarios = []
    baseline = results.get("memcached", {})
    for backend in ("memory", "cluster"):
        for (workload, clients), figures in results.get(backend, {}).items():
            row: dict[str, Any] = {
                "backend": backend,
                "workload": workload,
                "clients": clients,
                **figures,
            }
            reference = baseline.get((workload, clients))
            if reference is not None:
                row["memcached_ops_per_s"] = reference["ops_per_s"]
                row["memcached_p50_ms"] = reference["p50_ms"]
                row["memcached_p99_ms"] = reference["p99_ms"]
                row["ratio"] = (
                    round(figures["ops_per_s"] / reference["ops_per_s"], 3)
                    if reference["ops_per_s"]
                    else None
                )
            scenarios.append(row)
    memory_ratios = [
        row["ratio"] for row in scenarios if row["backend"] == "memory" and row.get("ratio")
    ]
    return {
        "bench": "kestrel",
        "scenarios": scenarios,
        "memcached": parameters.memcached or shutil.which("memcached"),
        "min_memory_ratio": min(memory_ratios) if memory_ratios else None,
        "ratio_target": 0.5,
        "front_exit_codes": exits,
        "parameters": {**asdict(parameters), "clients": list(parameters.clients)},
        "machine": machine_facts(),
    }
