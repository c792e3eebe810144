"""Binding listening ports early, and saying clearly which port is taken and how to move it.

A process binds every port it will serve before it contacts any peer (docs/node-api.md "Owners,
locks and ports"), so one that cannot serve dies before it can disturb anyone.
"""

from __future__ import annotations

import errno
import socket

from kayos.errors import AddressInUseError, KayosError

# Connections the kernel queues for a port before the server accepts them: peers and clients of a
# node that is still opening its stores wait here (asyncio's own default for start_server).
_BACKLOG = 100


def address_in_use(host: str, port: int, what: str, hint: str) -> AddressInUseError:
    """The one-line error for a taken port: the address, whose port it is, and how to move it.
    The words "address already in use" stay in it: launchers look for them in a log."""
    return AddressInUseError(
        f"{host}:{port} ({what}) is in use (address already in use): {hint}", host=host, port=port
    )


def bind_listener(host: str, port: int, *, what: str, hint: str) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening: the port is ours from here on (a socket
    that is only bound, with SO_REUSEADDR, does not keep another process from binding it too, and
    that one could then contact peers first). A peer that connects before the server runs waits
    in the backlog until it is served. SO_REUSEADDR as asyncio and aiohttp set it, so a port in
    TIME_WAIT after a restart is not "in use", while one another socket listens on is.
    ``AddressInUseError`` if taken; ``KayosError`` for other failures."""
    # IPPROTO_TCP said outright: a socket made with proto 0 hands 0 on to the sockets it
    # accepts, and asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP. Without
    # it Nagle's algorithm held every small reply for the peer's delayed ACK (about 40 ms).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(_BACKLOG)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise address_in_use(host, port, what, hint) from None
        raise KayosError(f"cannot listen on {host}:{port} ({what}): {exc.strerror}") from exc
    listener.setblocking(False)
    return listener


def check_free(host: str, port: int, *, what: str, hint: str) -> None:
    """Raises ``AddressInUseError`` if ``host:port`` cannot be bound right now (a probe: the port
    may still be taken between this check and the real bind, which checks again)."""
    bind_listener(host, port, what=what, hint=hint).close()
