"""A cluster with a manager member and client credentials, worked through the command line as an
operator would (docs/security.md): every ``kayos ctl`` command that asks the nodes, and ``kayos
produce`` and ``kayos consume``, work with ``--credentials`` (and with ``KAYOS_CREDENTIALS``) and
are refused without; then every log file, every reply and ``kayos ctl status --json`` is searched
for each secret, client key, proof and the cluster secret: none appears anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kayos.auth.keys import parse_secret
from kayos.client.auth import load_credential
from kayos.local.cluster import LocalCluster
from tests.support.cluster import WAIT_S, ctl, wait_until
from tests.support.security.credentials import add_credentials, request, stolen_but_wrong

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUEUE = "orders.cli"


def kayos(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "kayos", *args],
        capture_output=True,
        text=True,
        timeout=4 * WAIT_S,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, done.stdout, done.stderr


def forbidden_strings(files: list[Path], cluster_secret: bytes) -> dict[str, str]:
    """Every string that must never be shown: each secret's text and raw key, each client key,
    and the cluster secret."""
    found = {"cluster secret": cluster_secret.hex(), "an Authorization header": "Kayos-Proof"}
    for path in files:
        data = json.loads(path.read_text())
        secret = parse_secret(data["secret"])
        found[f"{path.name} secret"] = data["secret"]
        found[f"{path.name} key"] = secret.key.hex()
        found[f"{path.name} client key"] = secret.client_key().hex()
    return found


def test_every_ctl_command_works_with_credentials_and_no_secret_is_ever_shown(
    tmp_path: Path,
) -> None:
    replies: list[str] = []
    with LocalCluster(tmp_path / "cluster", nodes=3, replicas=3, managers=1) as cluster:
        url = cluster.url(cluster.ids[0])
        files = add_credentials(cluster, tmp_path)
        ops = str(files["ops"])
        topology = str(cluster.topology_path)
        base = ["--cluster", url]
        # Refused without a credential, taken with one (the option and the variable).
        code, out, err = kayos("produce", QUEUE, "k", "v", *base)
        replies += [out, err]
        assert code != 0
        assert "unauthenticated" in (out + err)
        code, out, err = kayos("produce", QUEUE, "k", "v", *base, "--credentials", ops)
        replies += [out, err]
        assert code == 0, err
        code, out, err = kayos("produce", QUEUE, "k2", "v2", *base, env={"KAYOS_CREDENTIALS": ops})
        replies += [out, err]
        assert code == 0, err
        code, out, err = kayos("consume", QUEUE, "--group", "g", *base, "--credentials", ops)
        replies += [out, err]
        assert code == 0, err
        assert "v2" in out
        commands: list[list[str]] = [
            ["status", "--json"],
            ["retention", QUEUE, "--max-age-ms", "86400000"],
            ["retention", QUEUE],
            ["check", "--json"],
            ["compact", "--topology", topology, "--json"],
            ["queue", "describe", QUEUE, "--json"],
            ["queue", "create", "orders.new", "--shards", "1", "--topology", topology, "--json"],
            ["credentials", "list", "--json"],
            ["credentials", "push", "--json"],
            ["credentials", "add", "extra", "--grant", "consume=x.*", "--out",
             str(tmp_path / "extra.json"), "--json"],
            ["credentials", "rotate", "extra", "--out", str(tmp_path / "extra2.json"), "--json"],
            ["credentials", "finish", "extra", "--json"],
            ["credentials", "remove", "extra", "--json"],
        ]  # fmt: skip
        for command in commands:
            code, out, err = ctl(*command, *base, "--credentials", ops)
            replies += [json.dumps(out), err]
            assert code in (0, 1), (command, out, err)  # 1: degraded, a fact of the cluster
            assert "unauthenticated" not in json.dumps(out) + err, (command, out, err)
            assert "forbidden" not in json.dumps(out) + err, (command, out, err)
        code, status, err = ctl("status", "--json", *base)  # no credential: refused by the nodes
        replies += [json.dumps(status), err]
        code, status, err = ctl("status", "--json", *base, "--credentials", ops)
        replies += [json.dumps(status), err]
        assert status["auth"]["mode"] == "credentials", status["auth"]
        # A manager member's face: admin only, as the nodes' table says.
        manager = cluster.manager_url(cluster.manager_members[0].id)
        for who, expected in (("nobody", 401), ("consumer", 403), ("ops", 200)):
            sent = None if who == "nobody" else load_credential(str(files[who]))
            status_code, reply = request(manager, "GET", "/v1/manager/status", None, sent)
            replies.append(json.dumps(reply))
            assert status_code == expected, (who, reply)
        code, status, err = ctl(
            "status", "--json", "--topology", topology, *base, "--credentials", ops
        )
        replies += [json.dumps(status), err]
        assert status["manager"]["reachable"], status["manager"]
        # Strangers knock: wrong secrets for every name, and replays of a real proof.
        for name in ("ops", "producer", "nobody"):
            wrong = str(stolen_but_wrong(tmp_path, name))
            code, out, err = kayos("produce", QUEUE, "x", "y", *base, "--credentials", wrong)
            replies += [out, err]
            assert code != 0
        for path in ("/v1/status", f"/v1/queues/{QUEUE}/consume?group=g"):
            replies.append(json.dumps(request(url, "GET", path)))
        wait_until(lambda: cluster.status(cluster.ids[0]) is not None, "the node answering")
        secrets = forbidden_strings(
            [*files.values(), tmp_path / "extra.json", tmp_path / "extra2.json"],
            cluster.identity.secret,
        )
        logs = sorted((tmp_path / "cluster").rglob("*.log"))
    assert logs, "no log files to search"
    texts: dict[str, Any] = {str(path): path.read_text(errors="replace") for path in logs}
    texts |= {f"reply {i}": text for i, text in enumerate(replies)}
    assert any("refused" in text for name, text in texts.items() if name.endswith(".log"))
    leaks = [
        f"{what} in {where}"
        for what, value in secrets.items()
        for where, text in texts.items()
        if value in text
    ]
    assert not leaks
