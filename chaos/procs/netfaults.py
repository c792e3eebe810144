"""The campaign's network faults (docs/testing.md, "Network faults"): toxics on the fault proxies
in front of a node's ports (``ProxiedCluster``), and partitions between network namespaces
(``chaos.procs.netns.NetnsCluster``). ``make_cluster`` picks the cluster the kinds need.

Each handler takes (cluster, node, hold_s, index) and ends with the network whole again (toxics
removed, rules flushed), whatever happened meanwhile. A fault's own parameters (a latency, a
rate) come from a ``random.Random`` seeded by the fault, so a seed replays them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from chaos.procs.netns import NetnsCluster
from chaos.procs.proxy import ProxyServer, api_url
from kayos.local.cluster import LocalCluster
from kayos.topology import NodeAddr, Topology

# Relative weights when a campaign draws these kinds (with the others of chaos.procs.faults).
PROXY_KIND_WEIGHTS = {"latency": 3, "bandwidth": 2, "reset_peer": 3, "timeout": 2}
NETNS_KIND_WEIGHTS = {"partition": 4, "partition_split": 3, "partition_bridge": 2}
KIND_WEIGHTS = {**PROXY_KIND_WEIGHTS, **NETNS_KIND_WEIGHTS}
# The two families a campaign cannot mix (make_cluster).
FAMILIES = (tuple(PROXY_KIND_WEIGHTS), tuple(NETNS_KIND_WEIGHTS))
# How long each kind holds (seconds, drawn by the schedule). Partitions and black holes reach
# past the campaign's 2 s detection window about half the time, so the manager splices.
HOLD_S: dict[str, tuple[float, float]] = {
    "latency": (0.5, 4.0),
    "bandwidth": (0.5, 4.0),
    "reset_peer": (0.1, 1.5),
    "timeout": (0.5, 4.0),
    "partition": (0.5, 5.0),
    "partition_split": (0.5, 5.0),
    "partition_bridge": (0.5, 5.0),
}
# How a partition stops traffic (chaos.procs.netns.Network.cut): silence, or TCP resets.
CUT_HOWS = ("drop", "reject")
# A latency toxic's delay (ms, each way) and a bandwidth toxic's rate (KB/s, each way).
latency_ms_range = (20, 400)
rate_kb_s_range = (8, 256)
# How long a reset_peer toxic lets a connection live (ms).
reset_after_ms_max = 500


def _hold(seconds: float) -> None:
    # The fault's own length (a toxic or partition held), not a wait for a condition.
    time.sleep(seconds)


def _toxiproxy_client() -> Any:
    """The toxiproxy API client, imported only by the proxy kinds: the process and network
    namespace kinds run without the ``dev`` extra."""
    try:
        from toxiproxy import Toxiproxy
    except ImportError as error:
        raise RuntimeError(
            "the proxy fault kinds (latency, bandwidth, reset_peer, timeout) need "
            "toxiproxy-python: pip install -e '.[dev]'"
        ) from error
    return Toxiproxy()


def _not_found() -> type[Exception]:
    from toxiproxy.exceptions import NotFound

    found: type[Exception] = NotFound
    return found


class ProxiedCluster(LocalCluster):
    """A ``LocalCluster`` whose topology names a fault proxy in front of each node's HTTP and
    binary ports; the node binds its own ports (``kayos node --listen-http/--listen-bin``).
    The proxies are a ``ProxyServer`` of this process, or the real toxiproxy at
    ``TOXIPROXY_URL``. ``close`` (after ``stop``) removes them."""

    def __init__(self, base_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        url = api_url()
        self.server: ProxyServer | None = None
        if url is None:
            self.server = ProxyServer(seed=int.from_bytes(secrets.token_bytes(4)))
            url = self.server.start()
        parts = urlsplit(url)
        self.api_url = url
        self.listen_host = parts.hostname or "127.0.0.1"
        self.api = _toxiproxy_client()
        self.api.update_api_consumer(self.listen_host, parts.port or 8474)
        self.run_id = f"kayos-{secrets.token_hex(3)}"
        self.backends: dict[str, NodeAddr] = {}
        self.proxies: dict[tuple[str, str], Any] = {}  # (node, "http" | "bin") -> toxiproxy.Proxy
        try:
            super().__init__(base_dir, **kwargs)
        except BaseException:
            self.close()
            raise

    def _make_topology(self) -> Topology:
        """The nodes' own addresses (free ports, as a plain cluster's), then a proxy in front of
        each port; the topology names the proxies."""
        self._destroy_proxies()  # a topology made again after a lost port race
        real = super()._make_topology()
        fronts = {}
        for node, address in real.nodes.items():
            self.backends[node] = address
            ports = {}
            for port_kind, port in (("http", address.http_port), ("bin", address.bin_port)):
                proxy = self.api.create(
                    upstream=f"{address.host}:{port}",
                    name=f"{self.run_id}-{node}-{port_kind}",
                    listen=f"{self.listen_host}:0",
                )
                self.proxies[(node, port_kind)] = proxy
                ports[port_kind] = int(proxy.listen.rpartition(":")[2])
            fronts[node] = NodeAddr(node, self.listen_host, ports["http"], ports["bin"])
        return dataclasses.replace(real, nodes=fronts)

    def spawn_command(self, member: str, command: list[str]) -> list[str]:
        backend = self.backends.get(member)
        if backend is None:
            return command
        return [
            *command,
            "--listen-http",
            f"{backend.host}:{backend.http_port}",
            "--listen-bin",
            f"{backend.host}:{backend.bin_port}",
        ]

    @contextlib.contextmanager
    def toxic(
        self, node: str, port_kinds: tuple[str, ...], kind: str, attributes: dict[str, int]
    ) -> Iterator[None]:
        """``kind`` on both streams of the node's proxies for ``port_kinds`` while in the
        block; removed after, whatever happened."""
        added: list[tuple[Any, str]] = []
        try:
            for port_kind in port_kinds:
                proxy = self.proxies[(node, port_kind)]
                for stream in ("upstream", "downstream"):
                    name = f"{kind}-{stream}"
                    proxy.add_toxic(name=name, type=kind, stream=stream, attributes=attributes)
                    added.append((proxy, name))
            yield
        finally:
            for proxy, name in added:
                with contextlib.suppress(_not_found()):
                    proxy.destroy_toxic(name)

    def _destroy_proxies(self) -> None:
        for proxy in self.proxies.values():
            with contextlib.suppress(_not_found(), OSError):
                proxy.destroy()
        self.proxies.clear()
        self.backends.clear()

    def close(self) -> None:
        try:
            self._destroy_proxies()
        finally:
            if self.server is not None:
                self.server.stop()


def make_cluster(
    kinds: tuple[str, ...], base_dir: str | os.PathLike[str], **kwargs: Any
) -> LocalCluster:
    """The cluster ``kinds`` need: proxied for toxics, in namespaces for partitions, a plain
    ``LocalCluster`` otherwise. Both families at once are refused (a proxy in the root namespace
    would hide, to the partition rules, who a packet is from)."""
    proxied = set(kinds) & set(PROXY_KIND_WEIGHTS)
    netns = set(kinds) & set(NETNS_KIND_WEIGHTS)
    if proxied and netns:
        raise ValueError(
            f"kinds {sorted(proxied)} (fault proxy) and {sorted(netns)} (network namespaces) "
            "cannot run in one campaign; run them in two"
        )
    if proxied:
        return ProxiedCluster(base_dir, **kwargs)
    if netns:
        return NetnsCluster(base_dir, **kwargs)
    return LocalCluster(base_dir, **kwargs)


def close(cluster: LocalCluster) -> None:
    """Removes what ``make_cluster`` set up beside the processes (proxies, namespaces)."""
    if isinstance(cluster, ProxiedCluster | NetnsCluster):
        cluster.close()


def _proxied(cluster: LocalCluster) -> ProxiedCluster:
    assert isinstance(cluster, ProxiedCluster), "this fault needs the fault proxies"
    return cluster


def _network(cluster: LocalCluster) -> NetnsCluster:
    assert isinstance(cluster, NetnsCluster), "this fault needs network namespaces"
    return cluster


def _rng(kind: str, node: str, index: int) -> random.Random:
    return random.Random(f"{kind}-{node}-{index}")


def latency(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    ms = _rng("latency", node, index).randint(*latency_ms_range)
    with _proxied(cluster).toxic(
        node, ("http", "bin"), "latency", {"latency": ms, "jitter": ms // 10}
    ):
        _hold(hold_s)
    return {"latency_ms": ms}


def bandwidth(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    rate = _rng("bandwidth", node, index).randint(*rate_kb_s_range)
    with _proxied(cluster).toxic(node, ("http", "bin"), "bandwidth", {"rate": rate}):
        _hold(hold_s)
    return {"rate_kb_s": rate}


def reset_peer(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    after = _rng("reset_peer", node, index).randint(0, reset_after_ms_max)
    with _proxied(cluster).toxic(node, ("bin",), "reset_peer", {"timeout": after}):
        _hold(hold_s)
    return {"reset_after_ms": after}


def timeout(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    with _proxied(cluster).toxic(node, ("http", "bin"), "timeout", {"timeout": 0}):
        _hold(hold_s)
    return {}


def _partition(
    cluster: LocalCluster, kind: str, node: str, hold_s: float, index: int,
    sides: tuple[list[str], list[str]],
) -> dict[str, Any]:  # fmt: skip
    how = _rng(kind, node, index).choice(CUT_HOWS)
    return held_cut(cluster, sides, how, hold_s)


def held_cut(
    cluster: LocalCluster, sides: tuple[list[str], list[str]], how: str, hold_s: float
) -> dict[str, Any]:
    """The two sides cut (``how``: one of ``CUT_HOWS``) for ``hold_s``, then every partition
    healed, whatever happened meanwhile; the sides and how, for the fault's detail."""
    network = _network(cluster).network
    try:
        network.cut(*sides, how=how)
        _hold(hold_s)
    finally:
        network.heal()
    return {"sides": [sorted(sides[0]), sorted(sides[1])], "how": how}


def _side_of(cluster: LocalCluster, members: list[str], position: int) -> list[str]:
    return [members[position % len(members)]] if members else []


def partition(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    """One node alone; every other node and manager member on the other side."""
    others = [member for member in cluster.members() if member != node]
    return _partition(cluster, "partition", node, hold_s, index, ([node], others))


def partition_split(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    """A minority (the node and one manager member) against the majority of both."""
    managers = cluster.manager_ids
    minority = [node, *_side_of(cluster, managers, cluster.ids.index(node))]
    majority = [member for member in cluster.members() if member not in minority]
    return _partition(cluster, "partition_split", node, hold_s, index, (minority, majority))


def partition_bridge(cluster: LocalCluster, node: str, hold_s: float, index: int) -> dict[str, Any]:
    """``node`` (with the first manager member) and the node two after it (with the last) do not
    see each other; the node between them and the other members see both."""
    ids, managers = cluster.ids, cluster.manager_ids
    far = ids[(ids.index(node) + 2) % len(ids)]
    left = [node, *_side_of(cluster, managers, 0)]
    right = [far, *_side_of(cluster, managers, -1)] if far != node else []
    right = [member for member in right if member not in left]
    return _partition(cluster, "partition_bridge", node, hold_s, index, (left, right))


HANDLERS: dict[str, Callable[[LocalCluster, str, float, int], dict[str, Any]]] = {
    "latency": latency,
    "bandwidth": bandwidth,
    "reset_peer": reset_peer,
    "timeout": timeout,
    "partition": partition,
    "partition_split": partition_split,
    "partition_bridge": partition_bridge,
}
assert set(HANDLERS) == set(KIND_WEIGHTS) == set(HOLD_S)
