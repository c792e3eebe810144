"""Nodes and manager members in network namespaces, and true partitions between them
(docs/testing.md, "Network faults"): a namespace per member with a veth pair to a bridge in the
root namespace, addresses from a private /24 nothing else on the machine uses, and partitions as
iptables rules inside the namespaces (never in the root namespace's own tables).

Linux, root, ``ip`` and ``iptables`` only; ``unavailable_reason`` says what is missing. Every name
carries a per-run prefix (``kc`` and 5 hex digits), and ``Network.down`` removes what ``up``
made, whatever happened in between.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
from typing import Any

from kayos.local.cluster import LocalCluster, build_topology, node_ids
from kayos.local.managers import manager_ids
from kayos.manager.member.config import MemberAddr
from kayos.topology import NodeAddr, Topology

# Each member has an address of its own, so every one binds the same fixed ports.
NODE_HTTP_PORT = 7100
NODE_BIN_PORT = 7200
MANAGER_RAFT_PORT = 7300
MANAGER_HTTP_PORT = 7400
# Namespaces, veths and the bridge are named PREFIX + 5 hex digits (the run) + what they are.
PREFIX = "kc"
# The private range a run's /24 comes from: 10.201.X.0/24, X free on this machine.
SUBNET_BASE = "10.201"
# The chain a partition's rules go in, inside each namespace.
CHAIN = "KAYOS-PART"
# One ip or iptables command; they answer in milliseconds.
command_timeout_s = 10.0
# Linux's limit on an interface name (IFNAMSIZ less the NUL).
_IFNAME_MAX = 15


class NetnsError(RuntimeError):
    """An ip or iptables command failed; the message has its output."""


def run(*args: str) -> str:
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=command_timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def unavailable_reason() -> str | None:
    """Why namespaces and partitions cannot be used here, or None when they can (a namespace is
    made and removed to be sure)."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return (
                f"{tool} is not installed (apt-get install {package}; deploy/ensure-netns-tools.sh)"
            )
    probe = f"{PREFIX}{secrets.token_hex(3)[:5]}-probe"
    try:
        run("ip", "netns", "add", probe)
        try:
            run("ip", "netns", "exec", probe, "iptables", "-S")
        finally:
            run("ip", "netns", "del", probe)
    except NetnsError as exc:
        return f"cannot make a network namespace with iptables here: {exc}"
    return None


def _subnets_in_use() -> set[int]:
    text = run("ip", "-4", "-o", "addr", "show") + run("ip", "-4", "route", "show")
    return {int(x) for x in re.findall(rf"\b{re.escape(SUBNET_BASE)}\.(\d+)\.", text)}


def remove_leftovers() -> list[str]:
    """Removes every namespace and bridge a run left (killed before its clean-up); returns
    their names."""
    removed = []
    for line in run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        if re.fullmatch(rf"{PREFIX}[0-9a-f]{{5}}-.+", name):
            with contextlib.suppress(NetnsError):
                run("ip", "netns", "del", name)
                removed.append(name)
    for line in run("ip", "-o", "link", "show", "type", "bridge").splitlines():
        match = re.search(rf"\d+: ({PREFIX}[0-9a-f]{{5}}-br)[:@]", line)
        if match:
            with contextlib.suppress(NetnsError):
                run("ip", "link", "del", match.group(1))
                removed.append(match.group(1))
    return removed


class Network:
    """A bridge in the root namespace (``.1``, where the campaign's clients are) and one
    namespace per member on it (``.2`` on, in the order given)."""

    def __init__(self, members: list[str], rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        self.run_id = f"{PREFIX}{secrets.token_hex(3)[:5]}"
        free = sorted(set(range(256)) - _subnets_in_use())
        if not free:
            raise NetnsError(f"no free {SUBNET_BASE}.X.0/24 on this machine")
        self.subnet = f"{SUBNET_BASE}.{rng.choice(free)}"
        self.members = list(members)
        self.hosts = {member: f"{self.subnet}.{i + 2}" for i, member in enumerate(members)}
        self.bridge = f"{self.run_id}-br"
        self.bridge_host = f"{self.subnet}.1"
        self.cuts: list[tuple[tuple[str, ...], tuple[str, ...], str]] = []
        self._made: list[tuple[str, str]] = []  # ("netns" | "link", name), to remove in reverse
        for member in members:
            assert len(self._veth(member, "h")) <= _IFNAME_MAX, member

    def namespace(self, member: str) -> str:
        return f"{self.run_id}-{member}"

    def _veth(self, member: str, end: str) -> str:
        return f"{self.run_id}-{member}-{end}"

    def exec_prefix(self, member: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(member)]

    def up(self) -> None:
        """Makes the bridge and every namespace; on any failure removes what it made."""
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            run("ip", "addr", "add", f"{self.bridge_host}/24", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
            for member in self.members:
                self._add(member)
        except BaseException:
            self.down()
            raise

    def add(self, member: str) -> str:
        """One more member after ``up`` (the campaign's spare node): its namespace, veth and the
        next address of the run's /24; removed by ``down`` with the others. Returns its address."""
        assert member not in self.hosts, member
        assert len(self._veth(member, "h")) <= _IFNAME_MAX, member
        self.hosts[member] = f"{self.subnet}.{len(self.members) + 2}"
        self.members.append(member)
        self._add(member)
        return self.hosts[member]

    def _add(self, member: str) -> None:
        ns, host_end, ns_end = (
            self.namespace(member),
            self._veth(member, "h"),
            self._veth(member, "n"),
        )
        run("ip", "netns", "add", ns)
        self._made.append(("netns", ns))
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", ns)
        run("ip", "link", "set", host_end, "master", self.bridge)
        run("ip", "link", "set", host_end, "up")
        run("ip", "-n", ns, "addr", "add", f"{self.hosts[member]}/24", "dev", ns_end)
        run("ip", "-n", ns, "link", "set", ns_end, "up")
        iptables = [*self.exec_prefix(member), "iptables", "-w"]
        run(*iptables, "-N", CHAIN)
        run(*iptables, "-A", "INPUT", "-j", CHAIN)
        run(*iptables, "-A", "OUTPUT", "-j", CHAIN)

    def down(self) -> list[str]:
        """Removes the namespaces (their veth pairs and rules go with them) and the bridge;
        returns what it could not remove."""
        left = []
        while self._made:
            kind, name = self._made.pop()
            try:
                run("ip", kind, "del", name)
            except NetnsError as exc:
                left.append(str(exc))
        self.cuts.clear()
        return left

    def cut(self, side_a: list[str], side_b: list[str], how: str = "drop") -> None:
        """Traffic between the two sides stops: dropped (``drop``: silence) or refused with a TCP
        reset (``reject``), by rules in each side's namespaces."""
        assert how in ("drop", "reject"), how
        assert not set(side_a) & set(side_b), (side_a, side_b)
        for near, far in ((side_a, side_b), (side_b, side_a)):
            for member in near:
                iptables = [*self.exec_prefix(member), "iptables", "-w", "-A", CHAIN]
                for other in far:
                    if how == "reject":
                        # The reset a REJECT in OUTPUT makes carries the far side's address and
                        # is delivered here through OUTPUT and INPUT: let it pass, or the rules
                        # below drop it and a reject is silence. A real packet from the far side
                        # never gets here: its own namespace stops it.
                        run(*iptables, "-s", self.hosts[other], "-p", "tcp",
                            "--tcp-flags", "RST", "RST", "-j", "ACCEPT")  # fmt: skip
                    for match in (["-s", self.hosts[other]], ["-d", self.hosts[other]]):
                        if how == "reject":
                            run(*iptables, *match, "-p", "tcp", "-j", "REJECT",
                                "--reject-with", "tcp-reset")  # fmt: skip
                        run(*iptables, *match, "-j", "DROP")
        self.cuts.append((tuple(side_a), tuple(side_b), how))

    def heal(self) -> None:
        """Every partition ends (each namespace's chain emptied)."""
        for member in self.members:
            run(*self.exec_prefix(member), "iptables", "-w", "-F", CHAIN)
        self.cuts.clear()

    def rules(self, member: str) -> list[str]:
        """The partition rules in ``member``'s namespace (``iptables -S``), for tests."""
        text = run(*self.exec_prefix(member), "iptables", "-w", "-S", CHAIN)
        return [line for line in text.splitlines() if line.startswith("-A")]


class NetnsCluster(LocalCluster):
    """A ``LocalCluster`` whose nodes and manager members each run in a namespace of their
    own (``network.hosts`` their addresses, fixed ports). ``close`` removes the namespaces: call
    it after ``stop``, in a ``finally``."""

    def __init__(self, base_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        members = [*node_ids(kwargs.get("nodes", 3)), *manager_ids(kwargs.get("managers", 0))]
        self.network = Network(members)
        self.network.up()
        try:
            super().__init__(base_dir, base_port=NODE_HTTP_PORT, **kwargs)
        except BaseException:
            self.network.down()
            raise

    def _make_topology(self) -> Topology:
        hosts = self.network.hosts
        self.manager_members = [
            MemberAddr(m, hosts[m], MANAGER_RAFT_PORT, MANAGER_HTTP_PORT) for m in self.manager_ids
        ]
        addresses = [NodeAddr(n, hosts[n], NODE_HTTP_PORT, NODE_BIN_PORT) for n in self.ids]
        built = build_topology(
            addresses, replicas=self.replicas, shard_count=self.shard_count, fanout=self.fanout
        )
        return dataclasses.replace(built, queues=self.queue_shards).with_identity(self.identity)

    def _outside_address(self, node: str) -> NodeAddr:
        """A namespace of its own for a node added later (the campaign's spare), on the bridge
        like every member, so partitions can cut it too."""
        return NodeAddr(node, self.network.add(node), NODE_HTTP_PORT, NODE_BIN_PORT)

    def check_ports(self) -> None:
        """Nothing to check: each member's namespace is new, its ports its own."""

    def spawn_command(self, member: str, command: list[str]) -> list[str]:
        # Each process binds its namespace's private address, beyond loopback, so it would refuse
        # to start open (docs/security.md, "Safe defaults"): these namespaces exist only on this
        # machine for the campaign, so nodes and members run open on purpose.
        return [*self.network.exec_prefix(member), *command, "--insecure"]

    def close(self) -> None:
        left = self.network.down()
        if left:
            raise NetnsError(f"could not remove: {left}")
