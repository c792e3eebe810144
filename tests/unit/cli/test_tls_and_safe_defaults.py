"""`kayos init --tls` (docs/security.md, "Certificates for a local cluster"): a private CA, a
certificate per node and manager member naming its host, a client certificate, and the file's
``[tls]`` table; the contexts built from them accept each other and nothing else. The safe
default: a member bound beyond loopback needs TLS or ``--insecure``, which a node's status and
its ``kayos_insecure`` metric then report."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from prometheus_client import generate_latest

from kayos import tlsconfig
from kayos.auth.keys import new_secret
from kayos.auth.table import CredentialsTable, add_credential, parse_grant_text
from kayos.cli.main import cli
from kayos.errors import InvalidRequest
from kayos.node.runtime import Node
from kayos.node.server import Listen, check_node_exposure, secure_node
from kayos.node.status import node_status
from kayos.topology import NodeAddr, rotated

pytestmark = pytest.mark.unit

ADMIN = (parse_grant_text("admin+consume+produce=*"),)


def test_init_with_tls_writes_a_ca_a_certificate_per_member_and_the_table(tmp_path: Path) -> None:
    out, certs = tmp_path / "cluster.toml", tmp_path / "tls"
    result = CliRunner().invoke(
        cli,
        [
            "init", "--out", str(out), "--tls",
            "--node", "a=10.9.0.1:7101:7201", "--node", "b=node-b.example:7101:7201",
            "--manager", "m1=10.9.0.1:7301:7401",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("ca", "a", "b", "m1", "client"):
        assert (certs / f"{name}.pem").exists(), name
        assert stat.S_IMODE((certs / f"{name}.key").stat().st_mode) == 0o600, name
    cert = x509.load_pem_x509_certificate((certs / "b.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "node-b.example" in names.get_values_for_type(x509.DNSName)
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert 'cert = "tls/{node}.pem"' in out.read_text()  # beside the file: copied with it
    files = tlsconfig.files_of(str(out), "a")
    assert files is not None
    assert files.cert == str(certs / "a.pem")
    assert files.client_auth is False
    server = tlsconfig.server_context(files)
    assert server.verify_mode == ssl.CERT_OPTIONAL


def test_init_with_tls_refuses_a_file_that_has_a_tls_table(tmp_path: Path) -> None:
    first = tmp_path / "first.toml"
    runner = CliRunner()
    made = runner.invoke(cli, ["init", "--out", str(first), "--tls", "--node", "a=h:1:2"])
    assert made.exit_code == 0, made.output
    again = runner.invoke(
        cli,
        ["init", "--out", str(tmp_path / "x.toml"), "--from", str(first), "--tls"],
    )
    assert again.exit_code != 0
    assert "has a [tls] table already" in again.output


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"ca": "c", "cert": "x"}, "key must name a file"),
        ({"ca": "c", "cert": "x", "key": "k", "client_auth": "yes"}, "true or false"),
        ({"ca": "c", "cert": "x", "key": "k", "cafile": "c"}, "unknown keys"),
        ("ca.pem", "not a table"),
    ],
)
def test_a_bad_tls_table_is_refused(table: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        tlsconfig.TlsFiles.from_table(table, "a", "/etc/kayos")


def test_paths_name_the_member_and_are_read_from_the_files_directory() -> None:
    table = {"ca": "ca.pem", "cert": "{node}.pem", "key": "/keys/{node}.key", "client_auth": True}
    files = tlsconfig.TlsFiles.from_table(table, "b", "/etc/kayos")
    assert files == tlsconfig.TlsFiles(
        "/etc/kayos/ca.pem", "/etc/kayos/b.pem", "/keys/b.key", client_auth=True
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "::1", "localhost"])
def test_loopback_may_run_open(host: str) -> None:
    assert tlsconfig.check_exposure("node a", [host], tls=False, insecure=False) is False


def test_beyond_loopback_needs_tls_or_insecure(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(InvalidRequest, match=r"refusing to serve on 10\.0\.0\.5 without TLS"):
        tlsconfig.check_exposure("node a", ["127.0.0.1", "10.0.0.5"], tls=False, insecure=False)
    assert tlsconfig.check_exposure("node a", ["10.0.0.5"], tls=True, insecure=False) is False
    assert tlsconfig.check_exposure("node a", ["10.0.0.5"], tls=False, insecure=True) is True
    assert "without TLS (--insecure)" in caplog.text


def test_a_reload_of_a_missing_file_keeps_the_previous_certificate(tmp_path: Path) -> None:
    out, certs = tmp_path / "cluster.toml", tmp_path / "tls"
    made = CliRunner().invoke(
        cli,
        ["init", "--out", str(out), "--tls", "--tls-dir", str(certs), "--node", "a=127.0.0.1:1:2"],
    )
    assert made.exit_code == 0, made.output
    files = tlsconfig.files_of(str(out), "a")
    assert files is not None
    member = tlsconfig.MemberTls.load(files)
    assert member.reload() is True
    (certs / "a.pem").unlink()
    assert member.reload() is False


def node_at(host: str, tmp_path: Path) -> Node:
    topology = rotated([NodeAddr("a", host, 7101, 7201)], replicas=1)
    return Node(topology, "a", str(tmp_path / "a"))


def test_a_node_beyond_loopback_without_tls_refuses_to_start(tmp_path: Path) -> None:
    node = node_at("10.0.0.5", tmp_path)
    with pytest.raises(
        InvalidRequest, match=r"node a: refusing to serve on 10\.0\.0\.5 without TLS"
    ):
        secure_node(node, None, None, insecure=False)


def test_an_insecure_node_says_so_in_status_and_metrics(tmp_path: Path) -> None:
    node = node_at("10.0.0.5", tmp_path)
    secure_node(node, None, None, insecure=True)
    assert node_status(node)["insecure"] is True
    assert b"kayos_insecure 1.0" in generate_latest(node.registry)


def test_a_loopback_node_runs_open_and_reports_0(tmp_path: Path) -> None:
    node = node_at("127.0.0.1", tmp_path)
    secure_node(node, None, None, insecure=False)
    assert node_status(node)["insecure"] is False
    assert b"kayos_insecure 0.0" in generate_latest(node.registry)


def test_a_listen_address_beyond_loopback_counts_too(tmp_path: Path) -> None:
    node = node_at("127.0.0.1", tmp_path)
    listen = Listen(http=("10.0.0.6", 7101))
    with pytest.raises(InvalidRequest, match=r"10\.0\.0\.6"):
        check_node_exposure(node, listen, tls=False, insecure=False)


@pytest.mark.parametrize(
    ("tls", "credentials", "missing"),
    [
        (False, False, "without TLS or client credentials"),
        (True, False, "without client credentials"),
        (False, True, "without TLS:"),
    ],
)
def test_one_message_names_every_missing_half_of_the_safe_default(
    tls: bool, credentials: bool, missing: str, tmp_path: Path
) -> None:
    node = node_at("10.0.0.5", tmp_path)
    if credentials:
        node.access.install(add_credential(CredentialsTable(), "ops", ADMIN, new_secret()))
    with pytest.raises(InvalidRequest, match=r"node a: refusing to serve on 10\.0\.0\.5") as caught:
        check_node_exposure(node, None, tls=tls, insecure=False)
    assert missing in str(caught.value)
    assert "--insecure" in str(caught.value)
    assert check_node_exposure(node, None, tls=tls, insecure=True) is True


def test_tls_and_client_credentials_together_run_beyond_loopback(tmp_path: Path) -> None:
    node = node_at("10.0.0.5", tmp_path)
    node.access.install(add_credential(CredentialsTable(), "ops", ADMIN, new_secret()))
    assert check_node_exposure(node, None, tls=True, insecure=False) is False
