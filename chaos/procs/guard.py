"""Client credentials in a campaign (docs/security.md): a campaign run with ``credentials`` gives
its cluster one credential for its own workload before the faults begin, and every stranger
fault then also knocks with stolen-but-wrong credentials (a real name, a secret the cluster never
issued) on the node's HTTP face and binary port. None may be let in.

And how every probe of the campaign reaches a node as a client does: inside TLS with the
cluster's client context when the cluster has TLS (``probe_urlopen``, ``probe_connection``), and
proving the workload's credential when asked (``workload_authorization``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kayos import tlsconfig
from kayos.auth.keys import new_secret
from kayos.auth.table import CredentialsTable, add_credential, parse_grant_text, parse_table
from kayos.client.auth import ClientCredential, credential_from
from kayos.local.cluster import LocalCluster
from kayos.local.credentials import push_table
from kayos.local.http import http_json
from kayos.replication.wire import frames as fr

# The campaign's own credential: everything its producers, consumers and checks do.
WORKLOAD_NAME = "chaos-workload"
CREDENTIALS_ENV = "KAYOS_CREDENTIALS"
# How long one knock waits for the node's answer (as the other strangers' probes).
knock_timeout_s = 10.0


def enable_credentials(cluster: LocalCluster, base: Path) -> Path:
    """Pushes a table holding the workload's credential to every node (an open cluster takes the
    first table); returns the credentials file (mode 0600)."""
    secret = new_secret()
    grants = (parse_grant_text("admin+consume+produce=*"),)
    push_table(cluster, add_credential(CredentialsTable(), WORKLOAD_NAME, grants, secret))
    path = base / "chaos-credentials.json"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"name": WORKLOAD_NAME, "secret": secret.text()}, handle)
    return path


@contextlib.contextmanager
def credentials_in_env(path: Path | None) -> Iterator[None]:
    """Every client the campaign makes (its workers, ``kayos ctl`` subprocesses) proves the
    credential in ``path`` while the campaign runs; the variable is restored after."""
    if path is None:
        yield
        return
    before = os.environ.get(CREDENTIALS_ENV)
    os.environ[CREDENTIALS_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CREDENTIALS_ENV, None)
        else:
            os.environ[CREDENTIALS_ENV] = before


def probe_context(cluster: LocalCluster) -> ssl.SSLContext | None:
    """The TLS client context a probe connects with: the one a ``LocalCluster`` made with TLS
    installs for this process (``kayos.tlsconfig``, as the workload's client and ``http_json``
    use), None for a plain cluster."""
    return tlsconfig.installed() if cluster.tls_dir is not None else None


def probe_urlopen(cluster: LocalCluster, request: urllib.request.Request, timeout_s: float) -> Any:
    """``urllib.request.urlopen`` of ``request`` (a node's URL), inside TLS when the cluster has
    it; the caller reads and closes the response."""
    context = probe_context(cluster)
    return urllib.request.urlopen(request, timeout=timeout_s, context=context)  # noqa: S310


def probe_connection(cluster: LocalCluster, node: str, timeout_s: float) -> socket.socket:
    """A connection to ``node``'s binary port, its TLS handshake done when the cluster has TLS
    (the node's name checked against its certificate, as the client does)."""
    address = cluster.topology.nodes[node]
    sock = socket.create_connection((address.host, address.bin_port), timeout_s)
    context = probe_context(cluster)
    if context is None:
        return sock
    try:
        return context.wrap_socket(sock, server_hostname=address.host)
    except BaseException:
        sock.close()
        raise


def workload_authorization(method: str, path_qs: str) -> dict[str, str]:
    """The header proving the workload's credential (the file ``KAYOS_CREDENTIALS`` names while
    the campaign runs, ``credentials_in_env``) for one request; none when the cluster is open."""
    credential = credential_from(None)
    if credential is None:
        return {}
    return {"Authorization": credential.http_authorization(method, path_qs)}


def knock_with_stolen_names(cluster: LocalCluster, node: str) -> dict[str, Any]:
    """Requests naming each credential the node holds, proved with a wrong secret, on HTTP and
    on the binary port: ``{"tries", "let_in"}`` (empty when the node runs open: nothing to
    steal)."""
    code, reply = http_json(
        cluster.url(node) + "/v1/admin/credentials", cluster_secret=cluster.identity.secret
    )
    if code != 200:
        return {"tries": 0, "let_in": [], "skipped": f"no table from {node}: {code}"}
    table = parse_table(reply)
    let_in: list[str] = []
    tries = 0
    for name in sorted(table.credentials):
        wrong = ClientCredential(name, new_secret().client_key())
        path = "/v1/status"
        authorization = wrong.http_authorization("GET", path)
        status, _ = _http_with(cluster, cluster.url(node) + path, authorization)
        tries += 1
        if status not in (0, 401):  # 0: the node is down (a fault): it let nobody in
            let_in.append(f"node {node}: GET {path} as stolen {name} answered {status}")
        tries += 1
        if _binary_taken(cluster, node, wrong):
            let_in.append(f"node {node}: binary port took stolen {name}")
    return {"tries": tries, "let_in": let_in}


def _http_with(cluster: LocalCluster, url: str, authorization: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": authorization})  # noqa: S310
    try:
        with probe_urlopen(cluster, request, knock_timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except OSError as error:
        return 0, str(error)


def _binary_taken(cluster: LocalCluster, node: str, wrong: ClientCredential) -> bool:
    """A client HELLO, then CLIENT_PROOF under ``wrong``: whether HELLO_OK came back."""
    decoder = fr.FrameDecoder()
    try:
        with probe_connection(cluster, node, knock_timeout_s) as sock:
            sock.settimeout(knock_timeout_s)
            sock.sendall(fr.encode(fr.Hello(fr.PROTOCOL_VERSION, "stranger", None, 0, "client")))
            deadline = time.monotonic() + knock_timeout_s
            while time.monotonic() < deadline:
                data = sock.recv(65536)
                if not data:
                    return False
                for frame in decoder.feed(data):
                    if isinstance(frame, fr.AuthChallenge):
                        proof = wrong.binary_proof(frame.cluster_id, frame.nonce)
                        sock.sendall(fr.encode(proof))
                    elif isinstance(frame, fr.HelloOk):
                        return True
                    elif isinstance(frame, fr.ErrorFrame):
                        return False
    except (OSError, TimeoutError):
        return False
    return False
