"""``kayos ctl credentials ...``: the cluster's client credentials (docs/security.md, "The
credentials table"). Each edit reads the newest table any node holds, changes it with the pure
functions of ``kayos.auth.table``, writes a new secret to its ``--out`` file (mode 0600, never to
the terminal) before anything is sent, and pushes the table to every node of the live topology;
the result names each node's answer and exits 1 if any did not take it (``push`` again then).
An edit needs the ``admin`` role, except on an open cluster (the first credential)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import TYPE_CHECKING, Any

import click

from kayos import limits
from kayos.cli.address import ClusterAddress, cluster_option
from kayos.cli.ctl.common import CtlError, ask, emit, live_topology, with_transport

if TYPE_CHECKING:
    from kayos.auth.table import CredentialsTable
    from kayos.client.http import HttpTransport

_TIMEOUT_HELP = "Seconds to wait for each node's reply."


def _timeout_option(command: Any) -> Any:
    return click.option(
        "--timeout",
        "timeout_s",
        type=click.FloatRange(min=0.001),
        default=limits.ctl_status_timeout_ms_default / 1000,
        show_default=True,
        help=_TIMEOUT_HELP,
    )(command)


def _out_option(command: Any) -> Any:
    return click.option(
        "--out",
        "out_path",
        required=True,
        type=click.Path(dir_okay=False),
        help="The file to write the new credential (name and secret) to, mode 0600; it must "
        "not exist.",
    )(command)


async def _tables(
    transport: HttpTransport, urls: dict[str, str], timeout_s: float
) -> tuple[CredentialsTable, dict[str, str]]:
    """The newest table the nodes hold, and why each node that gave none gave none."""
    from kayos.auth.table import CredentialsTable, parse_table
    from kayos.errors import KayosError

    newest = CredentialsTable()
    failures: dict[str, str] = {}
    answers = await asyncio.gather(
        *(ask(transport, "GET", f"{url}/v1/admin/credentials", timeout_s) for url in urls.values())
    )
    for node, answer in zip(urls, answers, strict=True):
        if isinstance(answer, str):
            failures[node] = answer
            continue
        try:
            table = parse_table(answer)
        except KayosError as exc:
            failures[node] = f"{type(exc).__name__}: {exc}"
            continue
        if table.version > newest.version:
            newest = table
    return newest, failures


async def _push(
    transport: HttpTransport, urls: dict[str, str], table: CredentialsTable, timeout_s: float
) -> dict[str, Any]:
    body = {"table": table.to_json()}
    answers = await asyncio.gather(
        *(
            ask(transport, "POST", f"{url}/v1/admin/credentials", timeout_s, body)
            for url in urls.values()
        )
    )
    nodes = {}
    for node, answer in zip(urls, answers, strict=True):
        taken = isinstance(answer, dict) and answer.get("version") == table.version
        nodes[node] = {"ok": taken, "answer": answer if isinstance(answer, str) else None}
    missed = sorted(node for node, result in nodes.items() if not result["ok"])
    return {
        "version": table.version,
        "nodes": nodes,
        "credentials": table.summary()["credentials"],
        "exit_code": 1 if missed else 0,
        "missed": missed,
    }


def _table_option(command: Any) -> Any:
    return click.option(
        "--table",
        "table_path",
        default=None,
        type=click.Path(dir_okay=False),
        help="Edit this credentials table file instead of a running cluster (made if missing): "
        "what kayos node --credentials-table reads on a host before the cluster first starts.",
    )(command)


def _edit_file(path: str, change: Any, send: bool, sending: Any = None) -> dict[str, Any]:
    """The offline edit: the table in ``path`` (empty if there is none yet), changed and
    written back (mode 0600)."""
    from kayos.auth.table import CredentialsTable, decode_table
    from kayos.errors import KayosError
    from kayos.identity import write_private

    try:
        if os.path.exists(path):
            with open(path, "rb") as handle:
                table = decode_table(handle.read(limits.credentials_table_bytes_max + 1))
        else:
            table = CredentialsTable()
        changed = change(table)
    except (KayosError, OSError) as exc:
        raise CtlError(f"{path}: {exc}") from None
    if send:
        if sending is not None:
            sending()
        write_private(path, changed.encode().decode())
    return {
        "version": changed.version,
        "nodes": {},
        "credentials": changed.summary()["credentials"],
        "exit_code": 0,
        "missed": [],
        "table": path,
    }


def _edit(
    cluster: ClusterAddress,
    timeout_s: float,
    change: Any,
    send: bool = True,
    table_path: str | None = None,
    sending: Any = None,
) -> dict[str, Any]:
    """Reads, changes (``change(table) -> table``), pushes (``send``; else reports which nodes
    hold the newest table); with ``table_path``, edits that file instead. ``sending()`` is
    called just before the first byte of the changed table leaves."""
    if table_path is not None:
        return _edit_file(table_path, change, send, sending)

    async def work(transport: HttpTransport) -> dict[str, Any]:
        from kayos.errors import KayosError

        topology = await live_topology(transport, list(cluster.urls), timeout_s)
        urls = {node: address.http_url for node, address in sorted(topology.nodes.items())}
        table, failures = await _tables(transport, urls, timeout_s)
        if len(failures) == len(urls):
            raise CtlError("no node gave its credentials table: " + "; ".join(failures.values()))
        try:
            changed = change(table)
        except KayosError as exc:
            raise CtlError(str(exc)) from None
        if send:
            if sending is not None:
                sending()
            return await _push(transport, urls, changed, timeout_s)
        behind = sorted(failures)
        return {
            "version": table.version,
            "mode": table.summary()["mode"],
            "nodes": {
                node: {"ok": node not in failures, "answer": failures.get(node)} for node in urls
            },
            "credentials": table.summary()["credentials"],
            "exit_code": 1 if behind else 0,
            "missed": behind,
        }

    result: dict[str, Any] = asyncio.run(with_transport(work))
    return result


def _render(result: dict[str, Any]) -> str:
    lines = [f"credentials table version {result['version']}"]
    for node, answer in result["nodes"].items():
        lines.append(
            f"  {node}: {'taken' if answer['ok'] else 'NOT taken: ' + str(answer['answer'])}"
        )
    for credential in result["credentials"]:
        grants = ", ".join(f"{'+'.join(g['roles'])}={g['queues']}" for g in credential["grants"])
        rotating = " (rotating: two secrets)" if credential["rotating"] else ""
        lines.append(f"  {credential['name']}: {grants}{rotating}")
    if result["missed"]:
        lines.append(
            "some nodes did not take it: run `kayos ctl credentials push` when they are back"
        )
    return "\n".join(lines)


def _new_secret_file(out_path: str, name: str) -> Any:
    """A new secret, written to ``out_path`` (refused if it exists) before any node hears of it."""
    from kayos.auth.keys import new_secret
    from kayos.identity import write_private

    if os.path.exists(out_path):
        raise CtlError(f"{out_path} exists: a credentials file is never overwritten")
    secret = new_secret()
    write_private(out_path, json.dumps({"name": name, "secret": secret.text()}) + "\n")
    return secret


def _edit_with_secret(
    out_path: str, name: str, change: Any, where: tuple[ClusterAddress, float, str | None]
) -> dict[str, Any]:
    """``_edit`` with a new secret for ``name`` written to ``out_path`` first; the file is
    removed again when the edit is refused before any table left (no credential holds that
    secret), and kept once one may have (a node may hold it)."""
    cluster, timeout_s, table_path = where
    secret = _new_secret_file(out_path, name)
    sent: list[bool] = []
    try:
        return _edit(
            cluster,
            timeout_s,
            lambda table: change(table, secret),
            True,
            table_path,
            sending=lambda: sent.append(True),
        )
    except BaseException:
        if not sent:
            with contextlib.suppress(OSError):
                os.unlink(out_path)
        raise


def register(ctl: click.Group) -> None:
    """Adds ``kayos ctl credentials`` and its commands."""

    @ctl.group()
    def credentials() -> None:
        """Client credentials and their roles (docs/security.md)."""

    @credentials.command("list")
    @_table_option
    @cluster_option()
    @_timeout_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
    def list_(
        table_path: str | None, cluster: ClusterAddress, timeout_s: float, as_json: bool
    ) -> None:
        """Every credential's grants and whether it is rotating (no secret or key is shown)."""
        result = _edit(cluster, timeout_s, lambda table: table, False, table_path)
        emit(result, as_json, _render)

    @credentials.command()
    @click.argument("name")
    @click.option(
        "--grant",
        "grants",
        multiple=True,
        required=True,
        help="ROLE[+ROLE...]=PATTERN, e.g. produce=orders.* (repeatable); roles: produce, "
        "consume, admin.",
    )
    @click.option(
        "--certificate",
        default=None,
        help="A TLS client certificate's common name that stands in for it.",
    )
    @_out_option
    @_table_option
    @cluster_option()
    @_timeout_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
    def add(
        name: str,
        grants: tuple[str, ...],
        certificate: str | None,
        out_path: str,
        table_path: str | None,
        cluster: ClusterAddress,
        timeout_s: float,
        as_json: bool,
    ) -> None:
        """Adds credential NAME with its grants; its secret goes to --out only."""
        from kayos.auth.table import add_credential, check_credential_name, parse_grant_text
        from kayos.errors import KayosError

        try:
            check_credential_name(name)
            parsed = tuple(parse_grant_text(text) for text in grants)
        except KayosError as exc:
            raise click.BadParameter(str(exc)) from None
        result = _edit_with_secret(
            out_path,
            name,
            lambda table, secret: add_credential(table, name, parsed, secret, certificate),
            (cluster, timeout_s, table_path),
        )
        emit(result, as_json, _render)

    _register_edits(credentials)


def _register_edits(credentials: click.Group) -> None:
    """``rotate``, ``finish``, ``remove`` and ``push``."""

    @credentials.command()
    @click.argument("name")
    @_out_option
    @_table_option
    @cluster_option()
    @_timeout_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
    def rotate(
        name: str,
        out_path: str,
        table_path: str | None,
        cluster: ClusterAddress,
        timeout_s: float,
        as_json: bool,
    ) -> None:
        """Gives NAME a second secret (to --out): both are taken until `finish`."""
        from kayos.auth.table import rotate_credential

        result = _edit_with_secret(
            out_path,
            name,
            lambda table, secret: rotate_credential(table, name, secret),
            (cluster, timeout_s, table_path),
        )
        emit(result, as_json, _render)

    @credentials.command()
    @click.argument("name")
    @_table_option
    @cluster_option()
    @_timeout_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
    def finish(
        name: str,
        table_path: str | None,
        cluster: ClusterAddress,
        timeout_s: float,
        as_json: bool,
    ) -> None:
        """Ends NAME's rotation: only its newest secret is taken from now on."""
        from kayos.auth.table import finish_rotation

        emit(
            _edit(cluster, timeout_s, lambda t: finish_rotation(t, name), True, table_path),
            as_json,
            _render,
        )

    @credentials.command()
    @click.argument("name")
    @_table_option
    @cluster_option()
    @_timeout_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
    def remove(
        name: str,
        table_path: str | None,
        cluster: ClusterAddress,
        timeout_s: float,
        as_json: bool,
    ) -> None:
        """Removes NAME: its secrets are refused from now on."""
        from kayos.auth.table import remove_credential

        emit(
            _edit(cluster, timeout_s, lambda t: remove_credential(t, name), True, table_path),
            as_json,
            _render,
        )

    @credentials.command()
    @cluster_option()
    @_timeout_option
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
    def push(cluster: ClusterAddress, timeout_s: float, as_json: bool) -> None:
        """Sends the newest table any node holds to every node (after one was down)."""
        emit(_edit(cluster, timeout_s, lambda table: table), as_json, _render)
