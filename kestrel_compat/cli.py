"""``kayos kestrel``: run the Kestrel 2.x front (also ``python -m kestrel_compat``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import ssl
import sys

import click

from kayos.cli.address import ClusterAddress, cluster_option
from kayos.errors import AddressInUseError, KayosError
from kayos.tlsconfig import listener_context
from kestrel_compat.core.config import ConfigError, KestrelConfig, load_config
from kestrel_compat.core.persistence import Backend
from kestrel_compat.server import KestrelServer, check_ports


async def _serve(
    config: KestrelConfig,
    config_path: str | None,
    cluster: ClusterAddress | None,
    tls: ssl.SSLContext | None = None,
) -> None:
    check_ports(config)  # a taken port ends the front before it contacts the cluster
    backend: Backend | None = None
    if cluster is not None:
        from kestrel_compat.backends.kayos_backend import KayosBackend

        try:
            backend = await KayosBackend.connect(
                list(cluster.urls), credentials=config.server.kayos_credentials
            )
        except KayosError as exc:
            raise click.ClickException(f"{exc.code}: {exc}{cluster.hint()}") from exc
    server = KestrelServer(config, config_path=config_path, backend=backend, tls=tls)
    await server.start()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.request_stop, 0.0)
    # One line on stdout once the port is bound: scripts and tests wait for it.
    print(f"kestrel listening on {config.server.host}:{server.port}", flush=True)
    for front in server.fronts[1:]:
        port = server.port_of(front.name)
        print(f"kestrel {front.name} listening on {config.server.host}:{port}", flush=True)
    await server.serve_until_stopped()


@click.command(name="kestrel", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", default=None, type=click.IntRange(0, 65535), help="Memcache port (22133).")
@click.option("--text-port", default=None, type=click.IntRange(0, 65535), help="Text port (2222).")
@click.option(
    "--thrift-port", default=None, type=click.IntRange(0, 65535), help="Thrift port (2229)."
)
@click.option("--no-text", is_flag=True, help="Do not serve the text protocol.")
@click.option("--no-thrift", is_flag=True, help="Do not serve the thrift protocol.")
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="TOML file: [server], [default], [queues.<name>], [aliases.<name>].",
)
# Items on the named cluster's chains (durable on every replica before STORED): no default cluster.
@cluster_option(fallback=False, without="items are kept in this process's memory")
@click.option("--log-level", default="WARNING", show_default=True, help="Python logging level.")
@click.option(
    "--tls-cert",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Serve every front inside TLS with this PEM certificate chain (plain by default).",
)
@click.option(
    "--tls-key",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The PEM private key of --tls-cert.",
)
def kestrel(
    host: str | None,
    port: int | None,
    text_port: int | None,
    thrift_port: int | None,
    no_text: bool,
    no_thrift: bool,
    config_path: str | None,
    cluster: ClusterAddress | None,
    log_level: str,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Serve Kestrel 2.x clients on the memcache, text and thrift protocols. Items are kept on
    the Kayos cluster that --cluster (or $KAYOS_CLUSTER) names, durable on every replica before
    STORED; with neither, in this process's memory."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        config = load_config(config_path)
    except ConfigError as error:
        click.echo(f"kestrel: {error}", err=True)
        sys.exit(2)
    server = config.server
    if host is not None:
        server = dataclasses.replace(server, host=host)
    if port is not None:
        server = dataclasses.replace(server, port=port)
    if text_port is not None or no_text:
        server = dataclasses.replace(server, text_port=None if no_text else text_port)
    if thrift_port is not None or no_thrift:
        server = dataclasses.replace(server, thrift_port=None if no_thrift else thrift_port)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    try:
        tls = listener_context(tls_cert, tls_key) if tls_cert and tls_key else None
    except KayosError as exc:
        raise click.ClickException(f"{exc.code}: {exc}") from exc
    try:
        asyncio.run(_serve(dataclasses.replace(config, server=server), config_path, cluster, tls))
    except AddressInUseError as error:  # one line naming the port and its flag, exit code 1
        raise click.ClickException(f"{error.code}: {error}") from error
