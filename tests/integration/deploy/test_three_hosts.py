"""Three hosts as docs/deploy.md sets them up, rehearsed on one machine: three network namespaces
(chaos/procs/netns.py), each a host with an address of its own. deploy/cluster.example.toml with
the namespaces' addresses in place of the example's, given a real identity by `kayos init --from`
(the documented command), goes to every host's /etc/kayos/cluster.toml (under a scratch root per
host). On each host run the systemd units' exact ExecStart lines (`%i` and the environment file
rendered, the host paths moved under its root): `kayos-node@<node>` and `kayos-manager@<member>`
for the node and member the example puts there, and `kayos-kestrel` on one host.

Then: writes with acks=all on a queue of every shard, through the client and through the Kestrel
front; the host that runs the manager's leader vanishes (every process kill -9'd, its network
links down); the two remaining members elect a leader and splice the host's node out of every
chain; more writes; and every acknowledged message is consumed, through the client and the front.
Root only (namespaces), skipped elsewhere saying why; about a minute."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pytest

from chaos.procs import netns
from kayos.client.sync import Client
from kayos.errors import KayosError
from kayos.local.http import http_json
from kayos.manager.member import config
from kayos.topology import Topology
from tests.support.cluster import WAIT_S, wait_until
from tests.support.deploy.units import (
    DEPLOY,
    KESTREL_UNIT,
    MANAGER_UNIT,
    NODE_UNIT,
    UNITS,
    exec_start,
    in_root,
    read_environment_file,
)

memcache: Any = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REASON = netns.unavailable_reason()
EXAMPLE = DEPLOY / "cluster.example.toml"
KESTREL_ENV = UNITS / "kestrel.env.example"
# The kayos script of the interpreter running the tests: what /opt/kayos/venv/bin/kayos is here.
KAYOS = Path(sys.executable).with_name("kayos")
# Messages written with acks=all to each queue, before the kill and after the repair.
BEFORE, AFTER = 60, 30
BATCH = 10
# Kestrel items set through the front before and after the kill.
KESTREL_QUEUE = "deploy-jobs"
KESTREL_ITEMS = 5
# A splice after a leader's death: a new leader within ~1 s, then a full detection window (6 s
# by default: the example sets no [manager] bounds) before the node counts as down; far above.
REPAIR_S = 60.0
# A clean stop of a process at the end (the units give systemd's 30 s).
STOP_S = 30.0


@dataclass
class Host:
    """One namespace: a host of the example, with its scratch root and the processes it runs."""

    name: str
    address: str
    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, TextIO] = field(default_factory=dict)

    def log_path(self, unit: str) -> Path:
        return self.root / "log" / f"{unit}.log"


@dataclass
class Rehearsal:
    network: netns.Network
    hosts: dict[str, Host]
    topology: Topology
    members: dict[str, str]  # member id -> the host it runs on
    kayos: str = str(KAYOS)

    def start(self, host: Host, unit: str, argv: list[str]) -> None:
        host.log_path(unit).parent.mkdir(parents=True, exist_ok=True)
        log = host.log_path(unit).open("w")
        host.logs[unit] = log
        command = [*self.network.exec_prefix(host.name), *in_root(argv, host.root, self.kayos)]
        print(f"{host.name} ({host.address}): {unit}: {' '.join(command)}")
        host.processes[unit] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def node_url(self, node: str) -> str:
        address = self.topology.nodes[node]
        return f"http://{address.host}:{address.http_port}"

    def member_url(self, member: str) -> str:
        return next(m.http_url for m in self.setup_members() if m.id == member)

    def setup_members(self) -> tuple[config.MemberAddr, ...]:
        return config.members_from(str(self.hosts["a"].root / "etc/kayos/cluster.toml"))

    def kill_host(self, host: Host) -> None:
        """The host vanishes: every process kill -9'd, then its network links down, so what was
        sent to it goes unanswered (a dead machine), not refused (a machine with nothing on a
        port)."""
        for process in host.processes.values():
            process.kill()
            process.wait(STOP_S)
        namespace = self.network.namespace(host.name)
        left = netns.run("ip", "netns", "pids", namespace).split()
        assert left == [], f"processes left on {host.name}: {left}"
        for line in netns.run("ip", "-n", namespace, "-o", "link", "show").splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link != "lo":
                netns.run("ip", "-n", namespace, "link", "set", link, "down")

    def stop_all(self) -> None:
        running = [p for h in self.hosts.values() for p in h.processes.values()]
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_S)
        for host in self.hosts.values():
            for log in host.logs.values():
                log.close()

    def print_logs(self) -> None:
        for host in self.hosts.values():
            for unit in host.logs:
                tail = host.log_path(unit).read_text(errors="replace").splitlines()[-25:]
                print(f"--- {host.name}: {unit} (last {len(tail)} lines)\n" + "\n".join(tail))


def rendered_example(network: netns.Network, where: Path) -> Path:
    """cluster.example.toml with each host's example address replaced by its namespace's."""
    example = Topology.load(str(EXAMPLE))
    text = EXAMPLE.read_text()
    for node in example.nodes.values():
        assert text.count(f'"{node.host}"') == 2, "each example host has one node and one member"
        text = text.replace(f'"{node.host}"', f'"{network.hosts[node.id]}"')
    path = where / "cluster.example.toml"
    path.write_text(text)
    return path


def kayos_init(example: Path, out: Path) -> None:
    done = subprocess.run(
        [str(KAYOS), "init", "--from", str(example), "--out", str(out)],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    print(done.stdout.strip())


def add_offline(name: str, out: Path, table: Path) -> None:
    """`kayos ctl credentials add NAME --table FILE`: a credential with every role, into the table
    file the hosts' nodes read at start."""
    done = subprocess.run(
        [str(KAYOS), "ctl", "credentials", "add", name, "--grant", "admin+consume+produce=*",
         "--out", str(out), "--table", str(table)],
        capture_output=True, text=True, timeout=WAIT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.fixture
def rehearsal(tmp_path: Path) -> Iterator[Rehearsal]:
    if REASON is not None:
        pytest.skip(f"three hosts need network namespaces: {REASON}")
    if not KAYOS.exists():
        pytest.skip(f"no kayos script beside {sys.executable} (install the project: make dev)")
    example = Topology.load(str(EXAMPLE))
    network = netns.Network(list(example.nodes))
    network.up()
    r: Rehearsal | None = None
    try:
        cluster_file = tmp_path / "cluster.toml"
        kayos_init(rendered_example(network, tmp_path), cluster_file)
        # The credentials table every host's node reads, and the front's and the operator's
        # credentials (docs/security.md, "Set-up for three hosts").
        table = tmp_path / "credentials.json"
        for name in ("ops", "kestrel"):
            add_offline(name, tmp_path / f"{name}.json", table)
        hosts = {}
        for name in example.nodes:
            root = tmp_path / f"host-{name}"
            (root / "etc/kayos").mkdir(parents=True)
            (root / "var/lib/kayos").mkdir(parents=True)  # the units' StateDirectory
            shutil.copy(cluster_file, root / "etc/kayos/cluster.toml")
            shutil.copy(table, root / "etc/kayos/credentials.json")
            shutil.copy(tmp_path / "kestrel.json", root / "etc/kayos/kestrel-credentials.json")
            hosts[name] = Host(name, network.hosts[name], root)
        by_address = {host.address: host.name for host in hosts.values()}
        members = {m.id: by_address[m.host] for m in config.members_from(str(cluster_file))}
        r = Rehearsal(network, hosts, Topology.load(str(cluster_file)), members)
        yield r
    finally:
        if r is not None:
            r.stop_all()
            r.print_logs()
        left = network.down()
        assert left == [], left


def status(r: Rehearsal, url: str) -> dict[str, Any] | None:
    """A GET's JSON body, None when there is none yet (a condition for ``wait_until``); asked as
    the cluster itself (the cluster holds credentials: the status routes need admin)."""
    assert r.topology.identity is not None
    try:
        code, body = http_json(url, timeout_s=2.0, cluster_secret=r.topology.identity.secret)
    except (OSError, ValueError):
        return None
    return body if code == 200 and isinstance(body, dict) else None


def leader(r: Rehearsal, members: list[str]) -> str | None:
    """The leader every member of ``members`` names, None while they do not agree."""
    named = set()
    for member in members:
        answer = status(r, r.member_url(member) + "/v1/manager/status")
        named.add(answer.get("leader") if answer else None)
    agreed = named.pop() if len(named) == 1 else None
    return agreed if agreed in members else None


def queues_on_every_shard(topology: Topology) -> list[str]:
    """Queue names whose home shards are every shard of the topology, one each."""
    found: dict[int, str] = {}
    for i in range(10_000):
        found.setdefault(topology.shard_for(f"deploy-{i}"), f"deploy-{i}")
        if len(found) == len(topology.shards):
            return [found[shard] for shard in sorted(found)]
    raise AssertionError("no queue names for every shard")


def produce(
    client: Client, queues: list[str], tag: str, count: int
) -> dict[str, dict[bytes, bytes]]:
    """``count`` messages to each queue with acks=all, ``BATCH`` at a time; a batch that fails
    (the chain changing under it) is sent again, the same keys (de-duplicated), within a bound."""
    acked: dict[str, dict[bytes, bytes]] = {queue: {} for queue in queues}
    for queue in queues:
        for start in range(0, count, BATCH):
            numbers = range(start, start + BATCH)
            items = [(f"{tag}-{queue}-{n}".encode(), f"v{n}".encode()) for n in numbers]

            def send(items: list[tuple[bytes, bytes]] = items, queue: str = queue) -> bool:
                try:
                    client.produce_batch(queue, items, acks="all")
                except KayosError as exc:
                    print(f"{queue}: {exc!r}; again")
                    return False
                return True

            wait_until(send, f"acks=all on {queue}", REPAIR_S)
            acked[queue].update(items)
    return acked


def consume_all(client: Client, queue: str) -> dict[bytes, bytes]:
    seen: dict[bytes, bytes] = {}
    for page in client.consume(queue, "rehearsal", page_size=500):
        for message in page.messages:
            assert message.value is not None
            seen[message.key] = message.value
    return seen


def test_three_hosts_run_the_units_survive_a_host_kill_and_serve_every_acked_message(
    rehearsal: Rehearsal,
) -> None:
    r = rehearsal
    for member, host in r.members.items():
        r.start(r.hosts[host], f"kayos-manager@{member}", exec_start(MANAGER_UNIT, member))
    for node in r.topology.nodes:
        r.start(r.hosts[node], f"kayos-node@{node}", exec_start(NODE_UNIT, node))
    for node in r.topology.nodes:
        url = r.node_url(node) + "/v1/status"

        def ready(url: str = url) -> Any:
            return (status(r, url) or {}).get("ready")

        wait_until(ready, f"{node} ready")
    first = wait_until(lambda: leader(r, list(r.members)), "a manager leader")
    victim = r.hosts[r.members[first]]
    front = next(host for host in r.hosts.values() if host is not victim)
    start_kestrel(r, front)
    print(f"manager leader {first} on host {victim.name}; Kestrel front on {front.name}")

    queues = queues_on_every_shard(r.topology)
    operator = str(r.hosts["a"].root.parent / "ops.json")
    nodes = [r.node_url(n) for n in r.topology.nodes]
    with Client(nodes, name="rehearsal", credentials=operator) as client:
        acked = produce(client, queues, "before", BEFORE)
        kestrel = memcache.Client([f"{front.address}:22133"], dead_retry=0, socket_timeout=30)
        items = [f"job-{n}" for n in range(2 * KESTREL_ITEMS)]
        for item in items[:KESTREL_ITEMS]:
            assert kestrel.set(KESTREL_QUEUE, item), item

        killed = time.monotonic()
        r.kill_host(victim)
        survivors = [m for m, host in r.members.items() if host != victim.name]
        second = wait_until(lambda: leader(r, survivors), "a leader among the survivors", REPAIR_S)
        gone = victim.name
        wait_until(lambda: spliced_out(r, second, gone), f"{gone} spliced out", REPAIR_S)
        print(f"{second} leads; {gone} spliced out {time.monotonic() - killed:.1f}s after the kill")

        for queue, more in produce(client, queues, "after", AFTER).items():
            acked[queue].update(more)
        for item in items[KESTREL_ITEMS:]:
            assert kestrel.set(KESTREL_QUEUE, item), item
        got = [kestrel.get(f"{KESTREL_QUEUE}/t=5000") for _ in items]
        kestrel.disconnect_all()
        assert [g.decode() if g is not None else None for g in got] == items

        for queue in queues:
            seen = consume_all(client, queue)
            missing = set(acked[queue]) - set(seen)
            assert not missing, f"{queue}: {len(missing)} acknowledged messages not consumed"
            assert {k: seen[k] for k in acked[queue]} == acked[queue]
            shard = r.topology.shard_for(queue)
            print(f"{queue} (shard {shard}): {len(acked[queue])} acked, every one consumed")


def start_kestrel(r: Rehearsal, host: Host) -> None:
    """The front's unit on ``host``, its /etc/kayos/kestrel.env the example's with the host's own
    node in place of the example's."""
    env_text = KESTREL_ENV.read_text()
    example = Topology.load(str(EXAMPLE))
    (named,) = [n for n in example.nodes.values() if f"http://{n.host}:" in env_text]
    env_file = host.root / "etc/kayos/kestrel.env"
    env_file.write_text(env_text.replace(named.host, host.address))
    argv = exec_start(KESTREL_UNIT, "", read_environment_file(env_file))
    r.start(host, "kayos-kestrel", argv)
    wait_until(
        lambda: "kestrel listening" in host.log_path("kayos-kestrel").read_text(), "the front"
    )


def spliced_out(r: Rehearsal, member: str, node: str) -> bool:
    answer = status(r, r.member_url(member) + "/v1/manager/status")
    if answer is None:
        return False
    view = answer["view"]
    states = {n: s for n, s, *_ in view["nodes"]}
    return states.get(node) == "down" and all(node not in s["chain"] for s in view["shards"])
