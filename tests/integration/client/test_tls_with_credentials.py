"""TLS and client credentials on at once (docs/security.md, "TLS" and "Roles"), against real node
and manager processes.

A cluster with a ``[tls]`` table and a credentials table takes produce and consume at acks=all
from credentialed clients over https and the binary port, and ``kayos ctl status`` reports it
healthy with credentials, also after the cluster secret was rotated (the manager members prove the
cluster's own principal under the new secret). Under mutual TLS a client certificate whose common
name a credential names is that credential: its grants let it in, and nothing more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kayos import tlsconfig
from kayos.client.sync import Client
from kayos.errors import Forbidden
from kayos.local import certs
from kayos.local.cluster import LocalCluster
from tests.support.cluster import WAIT_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SEED = int.from_bytes(os.urandom(4))
print(f"seed {SEED}")


@pytest.fixture(autouse=True)
def plain_afterwards() -> Iterator[None]:
    yield
    tlsconfig.install(None)  # this process speaks plain again for the tests after


def ctl(cluster: LocalCluster, *args: str) -> tuple[int, str]:
    """``kayos ctl ARGS``: TLS from ``KAYOS_TLS_CA`` and friends (the local CA and its client
    certificate), never a credential from the environment."""
    assert cluster.tls_dir is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAYOS_")}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    for name, file in (("CA", "ca.pem"), ("CERT", "client.pem"), ("KEY", "client.key")):
        env[f"KAYOS_TLS_{name}"] = os.path.join(cluster.tls_dir, file)
    command = [sys.executable, "-m", "kayos", "ctl", *args]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=4 * WAIT_S, check=False, env=env
    )
    return done.returncode, done.stdout + done.stderr


def add(cluster: LocalCluster, directory: Path, name: str, grant: str, *extra: str) -> Path:
    path = directory / f"{name}.json"
    url = cluster.url(cluster.ids[0])
    code, out = ctl(
        cluster, "credentials", "add", name, "--grant", grant, "--out", str(path), "--cluster", url,
        *extra,
    )  # fmt: skip
    assert code == 0, out
    return path


def produce_and_consume(url: str, credentials: Path, queue: str, count: int) -> None:
    """``count`` messages at acks=all, then read back in full by a group and committed."""
    sent = {f"k{SEED}-{i}".encode() for i in range(count)}
    with Client([url], credentials=str(credentials)) as client:
        for key in sorted(sent):
            client.produce(queue, key, b"v", acks="all")
        seen: set[bytes] = set()
        for page in client.consume(queue, "readers", wait_s=1.0):
            seen.update(message.key for message in page.messages)
            if page.end:
                client.commit(queue, "readers", page.boundary)
                break
    assert seen == sent


def status(cluster: LocalCluster, ops: Path) -> tuple[int, Any]:
    import json

    topology = str(cluster.topology_path)
    code, out = ctl(cluster, "status", "--topology", topology, "--credentials", str(ops), "--json")
    return code, json.loads(out[: out.rindex("}") + 1])


def wait_healthy(cluster: LocalCluster, ops: Path) -> Any:
    """``kayos ctl status``'s summary once it exits 0 (healthy), within the bound."""
    last: list[Any] = []

    def healthy() -> bool:
        code, summary = status(cluster, ops)
        print("status:", code, summary.get("alerts"))  # the last one shows why, on a failure
        last[:] = [summary]
        return code == 0

    wait_until(healthy, "kayos ctl status healthy")
    return last[0]


def test_a_cluster_with_tls_and_credentials_serves_acks_all_and_reports_healthy(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=3, replicas=3, managers=3, tls=True) as cluster:
        url = cluster.url(cluster.ids[0])
        assert url.startswith("https://")
        ops = add(cluster, tmp_path, "ops", "admin+consume+produce=*")
        app = add(cluster, tmp_path, "app", "consume+produce=orders.*", "--credentials", str(ops))
        produce_and_consume(url, app, "orders.tls", 50)
        assert wait_healthy(cluster, ops)["auth"]["mode"] == "credentials"

        for step in ("start", "finish"):
            done, out = ctl(
                cluster, "secret", "rotate", step, "--topology", str(cluster.topology_path)
            )
            assert done == 0, out
        # A node restarted now knows the new secret only: the managers must prove it.
        cluster.kill("c", signal.SIGTERM)
        cluster.start("c")
        produce_and_consume(url, app, "orders.rotated", 20)

        # The managers' watches and polls prove the new secret: c is back in every chain.
        wait_healthy(cluster, ops)


def test_a_client_certificate_is_the_credential_that_names_it(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path / "cluster", nodes=1, replicas=1, tls=True, client_auth=True
    ) as cluster:
        url = cluster.url(cluster.ids[0])
        ops = add(cluster, tmp_path, "ops", "admin+consume+produce=*")
        # This process connects with the local CA's client certificate (kayos.local.certs).
        add(
            cluster, tmp_path, "by-cert", "produce=orders.*",
            "--certificate", certs.CLIENT_NAME, "--credentials", str(ops),
        )  # fmt: skip
        with Client([url]) as client:  # no credentials file: the certificate is the identity
            assert client.produce("orders.cert", b"k", b"v", acks="all") >= 0
            assert client.produce_http("orders.cert", [(b"k2", b"v")]) is not None
            with pytest.raises(Forbidden):
                client.produce("billing.cert", b"k", b"v", acks="all")
            with pytest.raises(Forbidden):
                next(iter(client.consume("orders.cert", "g")))
