"""What the ``kayos ctl`` commands that reach a cluster's nodes share: their one error, where
the cluster secret comes from, the live topology, one HTTP transport, one question to a node, and
how a result is printed. The nodes to ask come from ``--cluster`` (kayos/cli/address.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from kayos.client.http import HttpTransport
    from kayos.identity import ClusterIdentity
    from kayos.topology import Topology


class CtlError(click.ClickException):
    """A refusal or an unreachable cluster: one line, exit code 1 (docs/operations.md)."""


def file_topology(path: str) -> Topology | None:
    """The topology file at ``path``, None if there is none (``CtlError`` if it is unreadable)."""
    import os

    from kayos.errors import KayosError
    from kayos.topology import Topology

    if not os.path.exists(path):
        return None
    try:
        return Topology.load(path)
    except (KayosError, OSError) as exc:
        raise CtlError(f"{path}: {exc}") from exc


def identity_of(topology_path: str) -> ClusterIdentity:
    """The cluster id and secret of the ``--topology`` file, which sign the requests."""
    found = file_topology(topology_path)
    if found is None or found.identity is None:
        raise CtlError(
            f"{topology_path}: no cluster secret to sign the request with (pass the cluster's "
            "topology file with --topology)"
        )
    return found.identity


async def live_topology(transport: HttpTransport, urls: list[str], timeout_s: float) -> Topology:
    """The topology the first of ``urls`` that answers runs (``CtlError`` naming every failure)."""
    from kayos.errors import KayosError
    from kayos.topology import Topology

    errors = []
    for url in urls:
        try:
            reply = await transport.request("GET", f"{url}/v1/topology", timeout_s=timeout_s)
            return Topology.from_json(reply)
        except KayosError as exc:
            errors.append(f"{url}: {type(exc).__name__}: {exc}")
    raise CtlError("no node answered GET /v1/topology: " + "; ".join(errors))


async def with_transport(work: Callable[[HttpTransport], Awaitable[Any]]) -> Any:
    """``work`` with one HTTP transport, opened before and closed after."""
    from kayos.client.http import HttpTransport

    transport = HttpTransport()
    await transport.open()
    try:
        return await work(transport)
    finally:
        await transport.close()


async def ask(
    transport: HttpTransport,
    method: str,
    url: str,
    timeout_s: float,
    body: Any = None,
) -> dict[str, Any] | str:
    """A node's JSON object reply, or why there is none (``"<ErrorClass>: message"``)."""
    from kayos.errors import KayosError

    try:
        reply = await transport.request(method, url, timeout_s=timeout_s, body=body)
    except KayosError as exc:
        return f"{type(exc).__name__}: {exc}"
    return reply if isinstance(reply, dict) else f"not a JSON object: {reply!r:.80}"


def emit(result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    """Prints ``result`` (as JSON or as ``render`` has it) and exits with its ``exit_code``."""
    click.echo(json.dumps(result, indent=2) if as_json else render(result))
    sys.exit(result["exit_code"])
