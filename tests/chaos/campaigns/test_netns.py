"""The campaign's network namespaces (chaos/procs/netns.py, docs/testing.md "Network faults"):
members reach each other across the bridge, a partition stops exactly the traffic between its two
sides (silence with ``drop``, a TCP reset with ``reject``) while the root namespace still reaches
both, the heal ends it, and ``down`` leaves no namespace, bridge or rule behind. Real namespaces,
veths and iptables; root only (skipped elsewhere, saying why). The root namespace's own firewall
rules are compared before and after: they must not change."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from chaos.procs import netns
from tests.support.cluster import wait_until

pytestmark = pytest.mark.chaos

REASON = netns.unavailable_reason()
skip_without_netns = pytest.mark.skipif(REASON is not None, reason=f"no netns here: {REASON}")

PORT = 7500
# A connection attempt across a dropped partition waits this long before it counts as silence.
SILENCE_S = 1.0
# A connection that must succeed: far above what a bridge on one machine takes.
CONNECT_S = 10.0
# The listener's life bound: it outlives any test here, and the fixture kills it before that.
LISTENER_LIFE_S = 120

_LISTENER = f"""
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT}))
s.listen(16)
s.settimeout({LISTENER_LIFE_S})
end = time.monotonic() + {LISTENER_LIFE_S}
while time.monotonic() < end:
    try:
        c, _ = s.accept()
    except TimeoutError:
        break
    c.sendall(b"hi")
    c.close()
"""

_CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])) as s:
        s.settimeout(float(sys.argv[3]))
        print("ok" if s.recv(2) == b"hi" else "short")
except ConnectionRefusedError:
    print("refused")
except ConnectionResetError:
    print("reset")
except (TimeoutError, socket.timeout):
    print("silence")
except OSError as exc:
    print(f"error {exc}")
"""


def root_rules() -> str:
    return subprocess.run(
        ["iptables", "-w", "-S"], capture_output=True, text=True, timeout=10, check=True
    ).stdout


@pytest.fixture
def network() -> Iterator[netns.Network]:
    before = root_rules()
    net = netns.Network(["a", "b", "c"])
    net.up()
    listeners = []
    try:
        for member in net.members:
            listeners.append(
                subprocess.Popen([*net.exec_prefix(member), sys.executable, "-c", _LISTENER])
            )
        for member in net.members:
            wait_until(lambda m=member: from_root(net, m) == "ok", f"{member} listening")
        yield net
    finally:
        for listener in listeners:
            listener.kill()
            listener.wait(CONNECT_S)
        assert net.down() == []
        assert root_rules() == before, "the root namespace's firewall rules changed"


def from_root(net: netns.Network, member: str, timeout_s: float = CONNECT_S) -> str:
    try:
        with socket.create_connection((net.hosts[member], PORT), timeout_s) as sock:
            sock.settimeout(timeout_s)
            return "ok" if sock.recv(2) == b"hi" else "short"
    except OSError as exc:
        return f"error {exc}"


def between(net: netns.Network, source: str, target: str, timeout_s: float = CONNECT_S) -> str:
    """What a connection from ``source``'s namespace to ``target``'s listener saw."""
    done = subprocess.run(
        [
            *net.exec_prefix(source),
            *(sys.executable, "-c", _CONNECT),
            *(net.hosts[target], str(PORT), str(timeout_s)),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s + CONNECT_S,
        check=True,
    )
    return done.stdout.strip()


@skip_without_netns
def test_members_reach_each_other_and_the_root_namespace(network: netns.Network) -> None:
    assert len(set(network.hosts.values())) == 3
    assert all(host.startswith(f"{netns.SUBNET_BASE}.") for host in network.hosts.values())
    for source in network.members:
        for target in network.members:
            assert between(network, source, target) == "ok", (source, target)
    assert all(network.rules(member) == [] for member in network.members)


@skip_without_netns
# A reset on connect shows as "refused" (RST to the SYN), or "reset" once connected.
@pytest.mark.parametrize(("how", "seen"), [("drop", {"silence"}), ("reject", {"refused", "reset"})])
def test_a_partition_cuts_only_between_its_sides(
    network: netns.Network, how: str, seen: set[str]
) -> None:
    network.cut(["a"], ["b"], how=how)
    assert network.rules("a")
    assert network.rules("b")
    assert network.rules("c") == []
    cut = between(network, "a", "b", SILENCE_S)
    assert cut in seen, (how, cut)
    assert between(network, "b", "a", SILENCE_S) == cut
    assert between(network, "a", "c") == "ok"
    assert between(network, "c", "b") == "ok"
    for member in network.members:  # the clients' side sees everyone
        assert from_root(network, member) == "ok"
    network.heal()
    assert all(network.rules(member) == [] for member in network.members)
    assert between(network, "a", "b") == "ok"
    assert between(network, "b", "a") == "ok"


@skip_without_netns
def test_a_split_cuts_every_pair_across_it(network: netns.Network) -> None:
    network.cut(["a"], ["b", "c"], how="reject")
    for far in ("b", "c"):
        assert between(network, "a", far, SILENCE_S) in {"refused", "reset"}
        assert between(network, far, "a", SILENCE_S) in {"refused", "reset"}
    assert between(network, "b", "c") == "ok"
    network.heal()
    assert between(network, "a", "c") == "ok"


@skip_without_netns
def test_down_leaves_nothing_behind() -> None:
    net = netns.Network(["x", "y"])
    net.up()
    names = [net.namespace(member) for member in net.members]
    listed = netns.run("ip", "netns", "list")
    assert all(name in listed for name in names)
    net.cut(["x"], ["y"])
    assert net.down() == []
    listed = netns.run("ip", "netns", "list")
    assert not any(name in listed for name in names)
    assert net.bridge not in netns.run("ip", "-o", "link", "show")
    assert net.down() == []  # twice is harmless


@skip_without_netns
def test_a_member_added_after_up_is_on_the_bridge_cut_like_the_others_and_removed() -> None:
    net = netns.Network(["x", "y"])
    net.up()
    listeners = []
    try:
        host = net.add("z")
        assert host == f"{net.subnet}.4"
        assert net.members == ["x", "y", "z"]
        assert len(set(net.hosts.values())) == 3
        for member in net.members:
            listeners.append(
                subprocess.Popen([*net.exec_prefix(member), sys.executable, "-c", _LISTENER])
            )
        for member in net.members:
            wait_until(lambda m=member: from_root(net, m) == "ok", f"{member} listening")
        assert between(net, "z", "x") == "ok"
        assert between(net, "y", "z") == "ok"
        net.cut(["z"], ["x", "y"], how="reject")
        assert between(net, "z", "x", SILENCE_S) in {"refused", "reset"}
        assert between(net, "y", "z", SILENCE_S) in {"refused", "reset"}
        assert from_root(net, "z") == "ok"
        net.heal()
        assert net.rules("z") == []
        assert between(net, "x", "z") == "ok"
    finally:
        for listener in listeners:
            listener.kill()
            listener.wait(CONNECT_S)
        assert net.down() == []
    assert net.namespace("z") not in netns.run("ip", "netns", "list")
