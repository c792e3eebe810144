"""A private certificate authority and a certificate per member, for ``kayos init --tls DIR`` and
``kayos up --tls`` (docs/security.md, "Certificates for a local cluster").

Written with the ``cryptography`` package: EC P-256 keys, SHA-256 signatures; every member's
certificate names ``127.0.0.1``, ``localhost`` and the hosts it is given, and serves both as a
server and as a client certificate (a node is both on a link). Keys are written mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kayos import tlsconfig
from kayos.identity import write_private

CA_DAYS = 3650
MEMBER_DAYS = 825
CLIENT_NAME = "client"


@dataclass(frozen=True, slots=True)
class Authority:
    """A CA's certificate and key, in memory."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_authority(common: str = "kayos private CA") -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def _alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["127.0.0.1", "localhost", *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    authority: Authority,
    common: str,
    hosts: Iterable[str] = (),
    *,
    not_before: datetime.datetime | None = None,
    days: float = MEMBER_DAYS,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for ``common`` (a member id, or ``client``) valid for ``hosts`` besides
    loopback, signed by ``authority``; ``not_before``/``days`` make an expired one for tests."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _now() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_alt_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(authority.key, hashes.SHA256())
    )
    return cert, key


def write_pair(
    directory: str, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[str, str]:
    """Writes ``DIR/name.pem`` and ``DIR/name.key`` (the key mode 0600); returns both paths."""
    cert_path = os.path.join(directory, f"{name}.pem")
    key_path = os.path.join(directory, f"{name}.key")
    with open(cert_path, "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private(key_path, pem.decode("ascii"))
    return cert_path, key_path


def write_cluster_certs(directory: str, members: dict[str, str]) -> Authority:
    """A new CA in ``directory`` (``ca.pem``, ``ca.key``) and a certificate per member id
    (``members``: id -> host), plus ``client.pem``/``client.key`` for the command line."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    authority = make_authority()
    write_pair(directory, "ca", authority.cert, authority.key)
    for member, host in members.items():
        write_pair(directory, member, *issue(authority, member, [host]))
    write_pair(directory, CLIENT_NAME, *issue(authority, CLIENT_NAME))
    return authority


def tls_table(directory: str, client_auth: bool = False) -> str:
    """The topology file's ``[tls]`` table for certificates written by ``write_cluster_certs``."""
    return "\n".join(
        [
            "[tls]",
            f'ca = "{os.path.join(directory, "ca.pem")}"',
            f'cert = "{os.path.join(directory, "{node}.pem")}"',
            f'key = "{os.path.join(directory, "{node}.key")}"',
            f"client_auth = {'true' if client_auth else 'false'}",
            "",
        ]
    )


def local_tls(base_dir: str, members: dict[str, str]) -> str:
    """A local cluster's TLS directory (``base_dir/tls``): certificates written unless an earlier
    run left them (``ca.pem`` there), and this process set to connect with the CA and the client
    certificate. Returns the directory."""
    directory = os.path.abspath(os.path.join(base_dir, "tls"))
    if not os.path.exists(os.path.join(directory, "ca.pem")):
        write_cluster_certs(directory, members)
    use_local_tls(directory)
    return directory


def use_local_tls(directory: str) -> None:
    """This process connects to members with ``directory``'s CA and client certificate."""
    tlsconfig.install(
        tlsconfig.client_context(
            os.path.join(directory, "ca.pem"),
            os.path.join(directory, f"{CLIENT_NAME}.pem"),
            os.path.join(directory, f"{CLIENT_NAME}.key"),
        )
    )
