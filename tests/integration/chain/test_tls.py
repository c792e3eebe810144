"""TLS on every port and link, against real node processes (docs/security.md, "TLS").

A three-node cluster whose topology file has a ``[tls]`` table: writes replicate over TLS links
and a client reaches it over https and the binary port; plain TCP, a certificate from another CA
and an expired certificate are each refused by the binary port and logged; SIGHUP loads a new
certificate for new connections; under ``client_auth`` a connection without a client certificate
is refused; a link's recorded handshake proof replayed on a new connection is refused.
"""

from __future__ import annotations

import datetime
import os
import random
import secrets
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

import kayos
from kayos import limits, tlsconfig
from kayos.local import certs
from kayos.local.cluster import LocalCluster
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from tests.support.cluster import wait_until
from tests.support.links import RawLink, link_hello

pytestmark = pytest.mark.integration

SEED = int.from_bytes(os.urandom(4))
print(f"seed {SEED}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    try:
        with LocalCluster(
            tmp_path_factory.mktemp("tls-cluster"), nodes=3, replicas=3, tls=True
        ) as started:
            yield started
    finally:
        tlsconfig.install(None)  # this process speaks plain again for the tests after


def tls_dir(cluster: LocalCluster) -> Path:
    assert cluster.tls_dir is not None
    return Path(cluster.tls_dir)


def context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    return tlsconfig.client_context(str(ca), str(cert) if cert else None, str(key) if key else None)


def handshake(ctx: ssl.SSLContext, port: int) -> ssl.SSLSocket:
    """A TLS connection to the binary port, past its handshake and one round trip (under TLS 1.3
    the server's refusal of a client certificate arrives on the first read); the caller closes
    it. Closed here when refused."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        wrapped = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise
    try:
        wrapped.sendall(fr.encode(fr.Hello(fr.PROTOCOL_VERSION, "tls-test", None, 0, "client")))
        if not wrapped.recv(1):
            raise ConnectionResetError("closed by the node")
    except BaseException:
        wrapped.close()
        raise
    return wrapped


def served_serial(ctx: ssl.SSLContext, port: int) -> int:
    """The serial number of the certificate a new connection is served."""
    with handshake(ctx, port) as connection:
        der = connection.getpeercert(binary_form=True) or b""
    return x509.load_der_x509_certificate(der).serial_number


def log_says(cluster: LocalCluster, node: str, text: str) -> bool:
    return text in cluster.log_path(node).read_text(errors="replace")


def test_writes_replicate_over_tls_links_and_clients_reach_both_faces(
    cluster: LocalCluster,
) -> None:
    assert all(url.startswith("https://") for url in cluster.urls.values())
    with kayos.Client(list(cluster.urls.values()), rng=random.Random(SEED)) as client:
        seqs = [client.produce("tlsq", f"k{i}", f"v{i}", acks="all") for i in range(20)]
        assert seqs == sorted(seqs)
        values = [
            m.value for page in client.consume("tlsq", "g", page_size=100) for m in page.messages
        ]
    assert values[:20] == [f"v{i}".encode() for i in range(20)]


def test_plain_tcp_to_the_tls_port_is_refused_and_logged(cluster: LocalCluster) -> None:
    node = cluster.ids[0]
    port = cluster.topology.nodes[node].bin_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(fr.encode(fr.Hello(fr.PROTOCOL_VERSION, "x", None, 0, "client")))
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:
            answer = b""
    assert answer == b"" or not answer.startswith(fr.encode(fr.HelloOk(1, node, 1))[:4])
    wait_until(lambda: log_says(cluster, node, "TLS handshake refused from 127.0.0.1"), "logged")


def test_plain_http_to_the_tls_http_face_is_refused_and_logged(cluster: LocalCluster) -> None:
    node = cluster.ids[1]
    port = cluster.topology.nodes[node].http_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"HTTP/"), answer
    wait_until(lambda: log_says(cluster, node, "refused from 127.0.0.1: HTTP_REQUEST"), "logged")
    # The face still serves https (the status call of the launcher's client).
    with kayos.Client([cluster.url(node)]) as client:
        assert client.refresh_topology().epoch >= 1


def test_a_certificate_from_another_ca_is_refused_both_ways(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    other = certs.make_authority("another CA")
    certs.write_pair(str(tmp_path), "ca", other.cert, other.key)
    certs.write_pair(str(tmp_path), "stranger", *certs.issue(other, "stranger"))
    port = cluster.topology.nodes[cluster.ids[1]].bin_port
    # Our client does not trust the node's certificate...
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        handshake(context(tmp_path / "ca.pem"), port)
    # ...and the node does not trust a client certificate from the other CA.
    foreign = context(
        tls_dir(cluster) / "ca.pem", tmp_path / "stranger.pem", tmp_path / "stranger.key"
    )
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(foreign, port)
    wait_until(lambda: log_says(cluster, cluster.ids[1], "certificate verify failed"), "logged")


def test_an_expired_certificate_is_refused_and_logged(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ca = tls_dir(cluster)
    authority = certs.Authority(
        x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes()),
        load_key(ca / "ca.key"),
    )
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    cert, key = certs.issue(authority, "old", not_before=long_ago, days=1)
    certs.write_pair(str(tmp_path), "old", cert, key)
    port = cluster.topology.nodes[cluster.ids[2]].bin_port
    with pytest.raises((ssl.SSLError, ConnectionError)):
        handshake(context(ca / "ca.pem", tmp_path / "old.pem", tmp_path / "old.key"), port)
    wait_until(lambda: log_says(cluster, cluster.ids[2], "certificate has expired"), "logged")


def load_key(path: Path) -> certs.ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(path.read_bytes(), None)
    assert isinstance(key, certs.ec.EllipticCurvePrivateKey)
    return key


def test_a_replayed_link_handshake_is_refused(cluster: LocalCluster) -> None:
    """A recorded AUTH_PROOF (made by a holder of the secret for one connection's challenge) sent
    again on a new connection answers a challenge it was not made for."""
    identity = cluster.identity
    upstream, connector = cluster.ids[0], cluster.ids[1]
    shard = next(
        s for s in cluster.topology.shards.values() if s.chain[:2] == (upstream, connector)
    )
    claim = auth.LinkClaim(connector, upstream, shard.id, cluster.topology.epoch, "middle")
    ctx = context(
        tls_dir(cluster) / "ca.pem",
        tls_dir(cluster) / f"{connector}.pem",
        tls_dir(cluster) / f"{connector}.key",
    )
    port = cluster.topology.nodes[upstream].bin_port
    first = tls_link(ctx, port)
    first.send(link_hello(connector, shard.id, cluster.topology.epoch, "middle"))
    challenge = first.next()
    assert isinstance(challenge, fr.AuthChallenge)
    nonce = secrets.token_bytes(limits.auth_nonce_bytes)
    recorded = fr.AuthProof(
        identity.cluster_uuid,
        nonce,
        auth.proof(identity, auth.CONNECTOR_PROVES, claim, challenge.nonce, nonce),
    )
    first.close()
    second = tls_link(ctx, port)
    second.send(link_hello(connector, shard.id, cluster.topology.epoch, "middle"))
    assert isinstance(second.next(), fr.AuthChallenge)
    second.send(recorded)
    refusal = second.next()
    second.close()
    assert isinstance(refusal, fr.ErrorFrame), refusal
    assert refusal.code == "unauthenticated", refusal


def tls_link(ctx: ssl.SSLContext, port: int) -> RawLink:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return RawLink(ctx.wrap_socket(raw, server_hostname="127.0.0.1"))


def test_sighup_loads_a_new_certificate_for_new_connections(cluster: LocalCluster) -> None:
    ca = tls_dir(cluster)
    node = cluster.ids[0]
    port = cluster.topology.nodes[node].bin_port
    ctx = context(ca / "ca.pem", ca / "client.pem", ca / "client.key")
    before = served_serial(ctx, port)
    with handshake(ctx, port) as held:
        authority = certs.Authority(
            x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes()), load_key(ca / "ca.key")
        )
        certs.write_pair(str(ca), node, *certs.issue(authority, node, ["127.0.0.1"]))
        cluster.processes[node].send_signal(signal.SIGHUP)
        wait_until(lambda: served_serial(ctx, port) != before, "the new certificate served")
        held_der = held.getpeercert(binary_form=True) or b""
        assert x509.load_der_x509_certificate(held_der).serial_number == before
    assert log_says(cluster, node, "TLS files reloaded")


def test_mutual_tls_refuses_a_connection_without_a_client_certificate(tmp_path: Path) -> None:
    try:
        with LocalCluster(tmp_path, nodes=1, replicas=1, tls=True, client_auth=True) as mutual:
            ca = tls_dir(mutual)
            port = mutual.topology.nodes[mutual.ids[0]].bin_port
            with pytest.raises((ssl.SSLError, ConnectionError)):
                handshake(context(ca / "ca.pem"), port)
            wait_until(
                lambda: log_says(mutual, mutual.ids[0], "peer did not return a certificate"),
                "logged",
            )
            # With the client certificate (installed by the launcher) the client is served.
            with kayos.Client(list(mutual.urls.values())) as client:
                assert client.produce("mq", "k", "v", acks="all") >= 1
            served_serial(context(ca / "ca.pem", ca / "client.pem", ca / "client.key"), port)
    finally:
        tlsconfig.install(None)
