"""One way to name a cluster on the command line (docs/operations.md, "Naming the cluster").

Every command that talks to a running cluster's nodes takes ``--cluster URL``: a node's HTTP base
URL (``host:port`` means ``http://host:port``), repeatable or comma-separated; the first that
answers gives the topology. Without it the command reads ``KAYOS_CLUSTER`` (comma-separated URLs);
without either, the nodes of the topology file (the command's ``--topology``, else
``./kayos-data/cluster.toml``, the file ``kayos up`` writes) when it can be read, else
``http://127.0.0.1:7101`` (``kayos up``'s first node). ``kayos kestrel`` alone has no default: with
neither it keeps its items in memory.

The names commands used before (``--seed`` of ``produce``, ``consume`` and ``import-kestrel``,
``--url`` of ``ctl``, and a few more) keep working for one release: each is a
``DeprecatedOption``, hidden from ``--help``, and every use prints a note on stderr naming its
replacement.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

# The environment variable read when a command is given no --cluster.
CLUSTER_ENV = "KAYOS_CLUSTER"
# `kayos up`'s first node: the address of last resort.
LOCAL_URL = "http://127.0.0.1:7101"
# Where `kayos up` writes the cluster's topology file (and its secret).
TOPOLOGY_DEFAULT = "./kayos-data/cluster.toml"

CLUSTER_HELP = (
    "A node's HTTP base URL (repeatable, or comma-separated; the first that answers gives the "
    f"topology). Default: ${CLUSTER_ENV} (comma-separated URLs)"
)
FALLBACK_HELP = f", else the nodes of {{file}} if it exists, else {LOCAL_URL}."

Command = TypeVar("Command", bound=Callable[..., Any])


@dataclass(frozen=True)
class ClusterAddress:
    """The node URLs a command asks, and where they came from (for its messages)."""

    urls: tuple[str, ...]
    source: str  # "--cluster", an old option's name, CLUSTER_ENV, "file" or "default"
    path: str | None = None  # the topology file, when source is "file"

    def describe(self) -> str:
        """The URLs, and where they came from when the user did not name them on the line."""
        return ", ".join(self.urls) + self.hint()

    def hint(self) -> str:
        """`` (where the URLs came from)`` when that was not the command line, else nothing."""
        how = f"name the cluster with --cluster URL or {CLUSTER_ENV}"
        if self.source == "file":
            return f" (the nodes of {self.path}; {how})"
        if self.source == "default":
            return f" (kayos up's first node, the default; {how})"
        if self.source == CLUSTER_ENV:
            return f" (from {CLUSTER_ENV})"
        return ""


class DeprecatedOption(click.Option):
    """An option name kept for one release after its replacement came: hidden from ``--help``;
    each use prints a note on stderr naming ``replacement``."""

    def __init__(self, decls: Sequence[str], *, replacement: str, **kwargs: Any) -> None:
        super().__init__(decls, hidden=True, **kwargs)
        self.replacement = replacement

    def handle_parse_result(
        self, ctx: click.Context, opts: Mapping[str, Any], args: list[str]
    ) -> tuple[Any, list[str]]:
        value, args = super().handle_parse_result(ctx, opts, args)
        if self.name is not None and ctx.get_parameter_source(self.name) is (
            ParameterSource.COMMANDLINE
        ):
            click.echo(
                f"{ctx.command_path}: {self.opts[0]} is deprecated and goes in the next release: "
                f"use {self.replacement}",
                err=True,
            )
        return value, args


def deprecated_option(*decls: str, replacement: str, **kwargs: Any) -> Callable[[Command], Command]:
    """``click.option`` for a ``DeprecatedOption``."""
    return click.option(*decls, cls=DeprecatedOption, replacement=replacement, **kwargs)


def node_urls(texts: Sequence[str], where: str) -> tuple[str, ...]:
    """Node URLs from option values or the variable's text: split on commas, blanks dropped,
    ``host:port`` taken as ``http://host:port``, trailing slashes cut; ``click.BadParameter``
    naming ``where`` for anything that is not an http(s) URL with a host."""
    urls: list[str] = []
    for text in texts:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            url = (part if "://" in part else f"http://{part}").rstrip("/")
            try:
                parsed = urlsplit(url)
                parsed.port  # noqa: B018 - raises ValueError for a port that is not a number
            except ValueError:
                parsed = None
            if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise click.BadParameter(
                    f"{part!r} is not a node's HTTP URL (http://HOST:PORT)", param_hint=where
                )
            urls.append(url)
    return tuple(dict.fromkeys(urls))


def file_nodes(path: str) -> tuple[str, ...]:
    """The HTTP URLs of the nodes of the topology file at ``path``; none if it cannot be read."""
    from kayos.errors import KayosError
    from kayos.topology import Topology

    try:
        topology = Topology.load(path)
    except (KayosError, OSError, UnicodeDecodeError):
        return ()
    return tuple(node.http_url for node in topology.nodes.values())


def resolve(
    given: Sequence[str],
    old: Mapping[str, Sequence[str]],
    env: Mapping[str, str],
    *,
    topology_path: str | None,
    fallback: bool,
) -> ClusterAddress | None:
    """The cluster a command names: ``--cluster`` (with any old names given beside it), else the
    old names, else ``env[CLUSTER_ENV]``, else (``fallback``) the topology file's nodes or
    ``LOCAL_URL``; None when nothing names one and there is no fallback."""
    urls = node_urls(given, "--cluster")
    used = [flag for flag, values in old.items() if values]
    urls += node_urls([v for flag in used for v in old[flag]], used[0] if used else "--cluster")
    if urls:
        return ClusterAddress(tuple(dict.fromkeys(urls)), "--cluster" if given else used[0])
    from_env = node_urls([env.get(CLUSTER_ENV, "")], CLUSTER_ENV)
    if from_env:
        return ClusterAddress(from_env, CLUSTER_ENV)
    if not fallback:
        return None
    path = topology_path or TOPOLOGY_DEFAULT
    in_file = file_nodes(path)
    if in_file:
        return ClusterAddress(in_file, "file", path)
    return ClusterAddress((LOCAL_URL,), "default")


# The client's TLS files, when a command is to speak TLS to a cluster whose topology file it does
# not read (docs/security.md, "Certificates for a local cluster").
TLS_ENV = ("KAYOS_TLS_CA", "KAYOS_TLS_CERT", "KAYOS_TLS_KEY")


def use_tls(env: Mapping[str, str], topology_path: str) -> None:
    """Sets this process to connect with TLS when ``KAYOS_TLS_CA`` names a CA (with
    ``KAYOS_TLS_CERT`` and ``KAYOS_TLS_KEY`` under mutual TLS), else when the topology file has a
    ``[tls]`` table: its CA, and the ``client`` certificate beside the members' when there is one
    (``kayos init --tls`` and ``kayos up --tls`` write it)."""
    from kayos import tlsconfig
    from kayos.errors import KayosError

    ca, cert, key = (env.get(name) or None for name in TLS_ENV)
    try:
        if ca is None and os.path.exists(topology_path):
            files = tlsconfig.files_of(topology_path, "client")
            if files is not None:
                ca = files.ca
                if os.path.exists(files.cert) and os.path.exists(files.key):
                    cert, key = files.cert, files.key
        if ca is not None:
            tlsconfig.install(tlsconfig.client_context(ca, cert, key))
    except KayosError as exc:
        raise click.ClickException(f"TLS: {exc}") from exc


def cluster_option(
    *old: str, fallback: bool = True, without: str = "", topology: bool = False
) -> Callable[[Command], Command]:
    """``--cluster URL`` (repeatable) for a command, and its old names ``old`` (each a hidden
    ``DeprecatedOption``). The command is called with ``cluster``: the ``ClusterAddress`` that
    ``resolve`` finds (with the command's own ``topology_path`` for the fallback, if it has one),
    or None when ``fallback`` is False and nothing names a cluster (``without`` then says, in the
    help, what the command does). ``topology``: the command has a ``--topology`` option."""
    file = "the --topology file" if topology else TOPOLOGY_DEFAULT
    tail = FALLBACK_HELP.format(file=file) if fallback else f"; with neither, {without}."
    help_text = CLUSTER_HELP + tail

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            use_tls(os.environ, kwargs.get("topology_path") or TOPOLOGY_DEFAULT)
            given = kwargs.pop("cluster")
            older = {flag: kwargs.pop(_dest(flag)) for flag in old}
            kwargs["cluster"] = resolve(
                given,
                older,
                os.environ,
                topology_path=kwargs.get("topology_path"),
                fallback=fallback,
            )
            return command(*args, **kwargs)

        wrapped: Any = run
        for flag in old:
            wrapped = deprecated_option(
                flag,
                _dest(flag),
                replacement=f"--cluster URL (or {CLUSTER_ENV})",
                multiple=True,
                metavar="URL",
            )(wrapped)
        decorated: Command = click.option(
            "--cluster", "cluster", multiple=True, metavar="URL", help=help_text
        )(wrapped)
        return credentials_option(decorated)

    return decorate


# The environment variable that names a client's credentials file (kayos/client/auth/).
CREDENTIALS_ENV = "KAYOS_CREDENTIALS"


def _use_credentials(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Checks the file now (a clear error before any request) and names it for every client
    this process makes (they read ``KAYOS_CREDENTIALS`` when given none)."""
    if value is None:
        return
    from kayos.client.auth import load_credential
    from kayos.errors import KayosError

    try:
        load_credential(value)
    except KayosError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    os.environ[CREDENTIALS_ENV] = value


def credentials_option(command: Command) -> Command:
    """``--credentials FILE``: the client credential every request proves (docs/security.md)."""
    decorated: Command = click.option(
        "--credentials",
        type=click.Path(dir_okay=False),
        expose_value=False,
        callback=_use_credentials,
        help=(
            "The credentials file (name and secret) every request proves, for a cluster that "
            f"holds credentials. Default: ${CREDENTIALS_ENV}, else none (docs/security.md)."
        ),
    )(command)
    return decorated


def _dest(flag: str) -> str:
    return "old_" + flag.lstrip("-").replace("-", "_")


def note_unused_cluster_env(ctx: click.Context, path: str) -> None:
    """For a command that asks the managers named in a topology file: a note on stderr when
    ``KAYOS_CLUSTER`` names nodes none of which is in the file and the file was not named on the
    command line (the default file may be another cluster's)."""
    named = os.environ.get(CLUSTER_ENV, "")
    if not named.strip() or ctx.get_parameter_source("topology_path") is (
        ParameterSource.COMMANDLINE
    ):
        return
    try:
        urls = set(node_urls([named], CLUSTER_ENV))
    except click.BadParameter:
        urls = set()
    if urls & set(file_nodes(path)):
        return
    click.echo(
        f"{ctx.command_path}: note: {CLUSTER_ENV} ({named}) names no node of {path}, whose "
        "cluster manager members this command asks: --topology FILE names another cluster's file",
        err=True,
    )
