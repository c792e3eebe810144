"""Free TCP ports for a local cluster's members, drawn below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

from kayos.local.processes import ClusterError

# Probed ports come from [max(_FREE_PORT_LOW, ephemeral low - _FREE_PORT_SPAN), ephemeral low):
# above the well-known and common service ports, below what the kernel gives outgoing
# connections. Linux's default ephemeral range starts at 32768, leaving ~17k ports to draw from.
_FREE_PORT_LOW = 15_000
_FREE_PORT_SPAN = 17_000
_EPHEMERAL_PORT_LOW_DEFAULT = 32_768
# Draws per port wanted before giving up (a taken port is drawn again elsewhere).
_FREE_PORT_TRIES_PER_PORT = 20


def _ephemeral_port_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_PORT_LOW_DEFAULT


def free_ports(
    count: int, host: str = "127.0.0.1", *, rng: random.Random | None = None
) -> list[int]:
    """``count`` distinct ports free now, drawn below the kernel's ephemeral range: a port the
    kernel picked (bind to 0) is one it may also give an outgoing connection before the node
    listens on it, which happened often enough on a busy box to fail tests. All are probed at
    once, so they are distinct; a port taken meanwhile is the launcher's lost port race."""
    rng = rng or random.Random()  # noqa: S311 - spreading test ports, not security
    high = _ephemeral_port_low()
    low = max(_FREE_PORT_LOW, high - _FREE_PORT_SPAN)
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count * _FREE_PORT_TRIES_PER_PORT):
            if len(ports) == count:
                return ports
            port = rng.randrange(low, high)
            if port in ports:
                continue
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind((host, port))
            except OSError:
                probe.close()
                continue
            sockets.append(probe)
            ports.append(port)
        if len(ports) == count:
            return ports
        raise ClusterError(f"found only {len(ports)} of {count} free ports in {low}-{high - 1}")
    finally:
        for probe in sockets:
            probe.close()
