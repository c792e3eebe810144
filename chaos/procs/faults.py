"""The faults a real-process campaign injects, and the seeded schedule that picks them.

``schedule(seed)`` is pure: the i-th fault of a seed is always the same (kind, node, how long),
so ``--seed`` replays a run's faults in the same order (the timing of the load around them is the
machine's). ``inject`` carries one fault out against a ``LocalCluster`` and returns what happened;
every fault ends with the cluster whole again (each node running, none paused).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from chaos.procs import drains, guard, losses, membership, moves, netfaults
from kayos import limits
from kayos.local.cluster import LocalCluster
from kayos.replication.wire import frames as fr

# What a campaign picks from, with relative weights: process faults (what hardware and operators
# do to a node) most often, the whole-cluster restart and the misuses less.
KIND_WEIGHTS: dict[str, int] = {
    "kill9": 5,
    "sigterm": 3,
    "pause": 4,
    "restart_all": 1,
    "second_process": 1,
    "stranger": 2,
    "hostile_http": 2,
    # With the manager (chaos/procs/membership.py): faults at the moments chains change.
    "kill_manager_leader": 2,
    "splice_then_kill": 1,
    "splice_then_pause": 1,
    "rejoin_kill_self": 1,
    "rejoin_kill_tail": 1,
    "corrupt_down": 2,
    "power_loss": 1,
    "kill_with_pauses": 2,
    "wipe_down": 1,
}
KINDS = tuple(KIND_WEIGHTS)
# Network faults (chaos/procs/netfaults.py) need a proxied or namespaced cluster, and operator
# moves and drains (chaos/procs/moves.py, drains.py) a spare node: a campaign draws them only
# when asked (--kinds), never by default.
ALL_KIND_WEIGHTS: dict[str, int] = {
    **KIND_WEIGHTS,
    **netfaults.KIND_WEIGHTS,
    **moves.KIND_WEIGHTS,
    **drains.KIND_WEIGHTS,
    **losses.KIND_WEIGHTS,
}
ALL_KINDS = tuple(ALL_KIND_WEIGHTS)
# The kinds that need the spare node (moves.add_spare), and so no fault proxy.
SPARE_KINDS = moves.KINDS | drains.KINDS | losses.KINDS
# The kinds whose hold is a down time of 0 .. down_s_max.
HELD_KINDS = frozenset(
    {"kill9", "sigterm", "restart_all", "corrupt_down", *membership.HANDLERS, *SPARE_KINDS}
)
# The kinds that need manager members running (a campaign with ``managers=0`` leaves them out).
MANAGER_KINDS = frozenset(
    {
        "kill_manager_leader",
        "splice_then_kill",
        "splice_then_pause",
        "rejoin_kill_self",
        "rejoin_kill_tail",
        *SPARE_KINDS,
    }
)

# How long a killed or stopped node stays down before it is started again.
down_s_max = 2.0
# How long a node may go without answering GET /v1/status before a fault reports that it
# stopped answering (each request gives up after kayos.local.cluster.status_request_timeout_s),
# and the pause between asks.
status_answer_wait_s = 30.0
status_poll_s = 0.1
# A pause holds a node from a blink up to twice the silence bound: some pauses pass
# limits.peer_silence_ms_max (its links are dropped and rebuilt), some do not.
pause_s_min = 0.1
pause_s_max = 2 * limits.peer_silence_ms_max / 1000
# A second node process on a live data directory must be refused (or at least exit, its ports
# being held): it gets this long to exit before it is killed and recorded as having run.
second_process_exit_s_max = 20.0
# What a node refused by a data-dir lock says in its log (lower case); "address already in use"
# is a port, not the lock, and does not count.
_LOCK_WORDS = ("directoryinuseerror", "directory_in_use", "lock file")
# One raw-socket exchange or hostile HTTP request; a node answers on loopback in milliseconds.
probe_timeout_s = 10.0


@dataclass(frozen=True, slots=True)
class Fault:
    index: int
    kind: str
    node: str
    hold_s: float  # down time, pause length; 0 where it means nothing

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "node": self.node, "hold_s": self.hold_s}


def schedule(seed: int, nodes: list[str], kinds: tuple[str, ...] = KINDS) -> Iterator[Fault]:
    """The seed's faults, in order, without end."""
    rng = random.Random(seed)
    weights = [ALL_KIND_WEIGHTS[kind] for kind in kinds]
    index = 0
    while True:
        kind = rng.choices(kinds, weights)[0]
        node = rng.choice(nodes)
        if kind == "pause":
            hold_s = round(rng.uniform(pause_s_min, pause_s_max), 3)
        elif kind in HELD_KINDS:
            hold_s = round(rng.uniform(0.0, down_s_max), 3)
        elif kind in netfaults.HOLD_S:
            hold_s = round(rng.uniform(*netfaults.HOLD_S[kind]), 3)
        else:
            hold_s = 0.0
        yield Fault(index, kind, node, hold_s)
        index += 1


def inject(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    """Carries out one fault; returns what was observed (``unexpected`` lists anything a node
    should not have done: a stranger let in, a hostile request answered 2xx or 5xx)."""
    handler = _HANDLERS[fault.kind]
    return handler(cluster, fault)


def _hold(seconds: float) -> None:
    # The fault's own length (a node kept down or paused), not a wait for a condition.
    time.sleep(seconds)


def _kill_and_restart(cluster: LocalCluster, fault: Fault, sig: int) -> dict[str, Any]:
    code = cluster.kill(fault.node, sig)
    _hold(fault.hold_s)
    cluster.start(fault.node)
    result: dict[str, Any] = {"exit_code": code}
    if sig == signal.SIGTERM and code != 0:
        result["unexpected"] = [f"node {fault.node} exited {code} after SIGTERM"]
    return result


def _kill9(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    return _kill_and_restart(cluster, fault, signal.SIGKILL)


def _sigterm(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    return _kill_and_restart(cluster, fault, signal.SIGTERM)


def _pause(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    pid = cluster.pid(fault.node)
    assert pid is not None, f"node {fault.node} is not running"
    os.kill(pid, signal.SIGSTOP)
    try:
        _hold(fault.hold_s)
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"past_silence_bound": fault.hold_s * 1000 > limits.peer_silence_ms_max}


def _restart_all(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    """SIGTERM to every node at once (manager members keep running), all started again."""
    for node in cluster.ids:
        pid = cluster.pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    # Each node gets the one SIGTERM above: a second one, sent once the first one's clean stop
    # has closed the node's event loop (its handler gone), would kill it by default (-15).
    codes = {node: cluster.wait_exit(node) for node in cluster.ids}
    _hold(fault.hold_s)
    for node in cluster.ids:
        cluster.start(node, wait=False)
    cluster.wait_ready(cluster.ids)
    bad = [f"node {node} exited {code} on SIGTERM" for node, code in codes.items() if code != 0]
    return {"exit_codes": codes, **({"unexpected": bad} if bad else {})}


def _second_process(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    """Starts another ``kayos node`` on a running node's data directory and config."""
    log_path = cluster.base_dir / "logs" / f"second-{fault.node}-{fault.index}.log"
    command = [
        *cluster.node_command,
        "--config",
        str(cluster.config_paths.get(fault.node, cluster.topology_path)),
        "--id",
        fault.node,
        "--data",
        str(cluster.data_dir(fault.node)),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            code: int | None = process.wait(timeout=second_process_exit_s_max)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=second_process_exit_s_max)
            code = None
    text = log_path.read_text(errors="replace").lower()
    if code is None:
        outcome = "ran"  # it served alongside the live node until killed
    elif code != 0 and any(word in text for word in _LOCK_WORDS):
        outcome = "refused_lock"  # the data-dir lock (docs/node-api.md) turned it away
    elif code != 0:
        outcome = "exited_other"  # e.g. its ports were taken, after it had opened the stores
    else:
        outcome = "exited_0"
    return {
        "outcome": outcome,
        "exit_code": code,
        "log": str(log_path),
        "live": cluster.running(fault.node),
    }


def _stranger(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    """A replication HELLO to the node's binary port from someone without the secret, then an
    acknowledgement it has no right to give. It must be refused and the link closed."""
    # A node in no chain of the file (the spare of chaos/procs/moves.py) is sent the first one.
    chains = [c for c in cluster.topology.shards.values() if fault.node in c.members]
    chain = (chains or list(cluster.topology.shards.values()))[0]
    position = chain.members.index(fault.node) if chains else -1
    claimed = chain.members[(position + 1) % len(chain.members)]
    frames_seen: list[str] = []
    decoder = fr.FrameDecoder()
    with guard.probe_connection(cluster, fault.node, probe_timeout_s) as sock:
        sock.settimeout(probe_timeout_s)
        sock.sendall(
            fr.encode(
                fr.Hello(fr.PROTOCOL_VERSION, claimed, chain.id, cluster.topology.epoch, "middle")
            )
        )
        accepted = False
        sent_proof = False
        deadline = time.monotonic() + probe_timeout_s
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                data = b""
            if not data:
                break
            for frame in decoder.feed(data):
                frames_seen.append(type(frame).__name__)
                if isinstance(frame, fr.AuthChallenge) and not sent_proof:
                    sent_proof = True
                    sock.sendall(
                        fr.encode(
                            fr.AuthProof(
                                frame.cluster_id,
                                secrets.token_bytes(limits.auth_nonce_bytes),
                                bytes(32),
                            )
                        )
                        + fr.encode(fr.Subscribe(chain.id, 1, ()))
                        + fr.encode(fr.Ack(chain.id, 10**9))
                    )
                elif isinstance(frame, fr.AuthOk | fr.HelloOk | fr.Subscribed):
                    accepted = True
    # Then stolen-but-wrong credentials, when the node holds any (chaos/procs/guard.py).
    stolen = guard.knock_with_stolen_names(cluster, fault.node)
    result: dict[str, Any] = {
        "frames": frames_seen,
        "refused": not accepted and not stolen["let_in"],
        "stolen_tries": stolen["tries"],
    }
    unexpected = list(stolen["let_in"])
    if accepted:
        unexpected.append(f"node {fault.node} let a stranger in: {frames_seen}")
    if unexpected:
        result["unexpected"] = unexpected
    return result


def hostile_request(
    cluster: LocalCluster, base: str, path: str, method: str, body: bytes | None, content_type: str
) -> int | str:
    """One request of ``hostile_requests`` to the node at ``base``: its status, or what failed.
    Inside TLS when the cluster has it, and proving the workload's credential when the cluster
    holds credentials, so that a refusal is the node's input check's, not its door's."""
    headers = {"Content-Type": content_type} if body is not None else {}
    headers |= guard.workload_authorization(method, path)
    request = urllib.request.Request(base + path, data=body, method=method, headers=headers)  # noqa: S310 - loopback URLs we built
    try:
        with guard.probe_urlopen(cluster, request, probe_timeout_s) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.read()
        return int(error.code)
    except (OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def hostile_requests(queue: str) -> list[tuple[str, str, bytes | None, str]]:
    """(method, path, body, content type) of requests every node must refuse with a 4xx."""
    produce = f"/v1/queues/{queue}/messages?acks=all"
    js = "application/json"
    return [
        ("POST", produce, b"[" * 100_000 + b"]" * 100_000, js),
        ("POST", produce, json.dumps({"messages": [{"key": "k", "valeu": "x"}]}).encode(), js),
        (
            "POST",
            produce,
            json.dumps({"messages": [{"key": "k", "value": "x", "expiry_ms": 2**64}]}).encode(),
            js,
        ),
        ("POST", produce, json.dumps({"messages": [{"key": "", "value": "x"}]}).encode(), js),
        ("POST", produce, b'{"messages": [{"key": "k", "value": "\\ud800"', js),
        ("POST", produce, b"\xff\xfe garbage \x00", js),
        ("POST", produce, b"\xc1\xc1\xc1", "application/msgpack"),
        ("POST", produce, b'"' + b'\\"' * 20_000, js),
        ("GET", f"/v1/queues/{queue}/consume?group=g&limit=-1", None, js),
        ("GET", f"/v1/queues/{queue}/consume?group=g&after=1e9", None, js),
        ("GET", f"/v1/queues/{queue}/consume?group=g&after=18446744073709551616", None, js),
        ("POST", f"/v1/queues/{queue}/groups/g/commit", json.dumps({"hwm": 2**64}).encode(), js),
        (
            "POST",
            f"/v1/queues/{queue}/groups/g/commit",
            json.dumps({"hwm": 1, "x": 1}).encode(),
            js,
        ),
        ("GET", "/v1/shards/99999999999999999999999/groups", None, js),
        ("DELETE", "/v1/topology", None, js),
    ]


def queue_headed_by(cluster: LocalCluster, node: str, prefix: str) -> str:
    """A queue name (``prefix-N``) whose shard's chain has ``node`` at its head."""
    for number in range(10_000):
        queue = f"{prefix}-{number}"
        if cluster.topology.chain_for(queue).head == node:
            return queue
    raise AssertionError(f"no queue headed by {node}")


def answers_status(
    cluster: LocalCluster, node: str, within_s: float = status_answer_wait_s
) -> bool:
    """Whether ``node`` answers ``GET /v1/status``, asked again until it does or ``within_s``
    passes: one request that got no reply in its short timeout (as on a loaded box) is no
    verdict."""
    deadline = time.monotonic() + within_s
    while cluster.status(node) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(status_poll_s)  # a bounded poll of the node, not a synchronisation by time
    return True


def _hostile_http(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    """Requests a node must refuse, sent where they would otherwise be served (a produce to the
    head of its queue, a consume to the tail) so the refusal is the input check's, not a redirect.
    The queue is not one the workload uses: anything taken would go unseen by the checker, so a
    2xx here is itself reported."""
    node = fault.node
    if all(node not in chain.members for chain in cluster.topology.shards.values()):
        node = next(iter(cluster.topology.shards.values())).head  # the spare heads nothing
    queue = queue_headed_by(cluster, node, "chaos-hostile")
    # The file's chains name the first nodes; after drains and losses some are gone for good:
    # a request for one goes to the fault's own (running) node instead, whose refusal of a
    # request for a shard it does not serve is a 4xx as well.
    node = node if node in cluster.ids else fault.node
    tail_node = cluster.tails_of(queue)[0]
    tail_node = tail_node if tail_node in cluster.ids else fault.node
    head, tail = cluster.url(node), cluster.url(tail_node)
    answers: list[int | str] = []
    unexpected: list[str] = []
    for method, path, body, content_type in hostile_requests(queue):
        url = tail if "/consume" in path else head
        answer = hostile_request(cluster, url, path, method, body, content_type)
        answers.append(answer)
        # 503: the shard is changing or catching up (the manager moves chains during a
        # campaign), a defined "retry" refusal that takes nothing in.
        if not isinstance(answer, int) or not (400 <= answer < 500 or answer == 503):
            unexpected.append(f"{method} {path[:80]} -> {answer}")
    for asked in {node, tail_node}:
        if not answers_status(cluster, asked):
            unexpected.append(f"node {asked} stopped answering /v1/status")
    result: dict[str, Any] = {"requests": len(answers), "answers": answers}
    if unexpected:
        result["unexpected"] = unexpected
    return result


def _membership(kind: str) -> Callable[[LocalCluster, Fault], dict[str, Any]]:
    handler = membership.HANDLERS[kind]

    def inject_one(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
        return handler(cluster, fault.node, fault.hold_s)

    return inject_one


def _corrupt_down(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    return membership.corrupt_down(cluster, fault.node, fault.hold_s, fault.index)


_HANDLERS: dict[str, Callable[[LocalCluster, Fault], dict[str, Any]]] = {
    "kill9": _kill9,
    "sigterm": _sigterm,
    "pause": _pause,
    "restart_all": _restart_all,
    "second_process": _second_process,
    "stranger": _stranger,
    "hostile_http": _hostile_http,
    **{kind: _membership(kind) for kind in membership.HANDLERS},
    "corrupt_down": _corrupt_down,
}
assert set(_HANDLERS) == set(KIND_WEIGHTS)


def _network_fault(kind: str) -> Callable[[LocalCluster, Fault], dict[str, Any]]:
    handler = netfaults.HANDLERS[kind]

    def inject_one(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
        return handler(cluster, fault.node, fault.hold_s, fault.index)

    return inject_one


_HANDLERS.update({kind: _network_fault(kind) for kind in netfaults.HANDLERS})


def _move_under_fault(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    return moves.move_under_fault(cluster, fault.node, fault.hold_s, fault.index)


_HANDLERS["move_under_fault"] = _move_under_fault


def _drain_under_fault(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    return drains.drain_under_fault(cluster, fault.node, fault.hold_s, fault.index)


_HANDLERS["drain_under_fault"] = _drain_under_fault


def _lose_for_good(cluster: LocalCluster, fault: Fault) -> dict[str, Any]:
    return losses.lose_for_good(cluster, fault.node, fault.hold_s, fault.index)


_HANDLERS["lose_for_good"] = _lose_for_good
assert set(_HANDLERS) == set(ALL_KIND_WEIGHTS)
