"""A cluster that holds client credentials, for the tests of docs/security.md: credentials added
with ``kayos ctl credentials add`` (as an operator does), requests that carry a proof, and the
cluster's own reads (``@cluster``) for reading state back."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kayos.client.auth import ClientCredential, load_credential
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from tests.support.cluster import WAIT_S, ctl

# The credentials the tests add, with their grants (ROLE[+ROLE]=PATTERN).
GRANTS: dict[str, str] = {
    "ops": "admin+consume+produce=*",
    "producer": "produce=orders.*",
    "consumer": "consume=orders.*",
    "admin": "admin=*",
    "elsewhere": "consume+produce=billing.*",
}


def add_credentials(cluster: LocalCluster, directory: Path) -> dict[str, Path]:
    """Adds every credential of ``GRANTS`` (``ops`` first, on the open cluster, then as ``ops``);
    returns each one's credentials file."""
    files: dict[str, Path] = {}
    url = cluster.url(cluster.ids[0])
    for name, grant in GRANTS.items():
        path = directory / f"{name}.json"
        extra = ["--credentials", str(files["ops"])] if files else []
        code, out, err = ctl(
            "credentials", "add", name, "--grant", grant, "--out", str(path),
            "--cluster", url, "--json", *extra,
        )  # fmt: skip
        assert code == 0, (out, err)
        files[name] = path
    return files


def stolen_but_wrong(directory: Path, name: str) -> Path:
    """A credentials file naming ``name`` with a secret the cluster never issued."""
    from kayos.auth.keys import new_secret

    path = directory / f"{name}-wrong.json"
    path.write_text(json.dumps({"name": name, "secret": new_secret().text()}))
    return path


def request(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    credential: ClientCredential | None = None,
    timeout_s: float = WAIT_S,
) -> tuple[int, Any]:
    """One HTTP request with JSON bodies, proving ``credential`` if given: (status, reply)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if credential is not None:
        headers["Authorization"] = credential.http_authorization(method, path)
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            raw = response.read()
            status = int(response.status)
    except urllib.error.HTTPError as error:
        raw, status = error.read(), int(error.code)
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def as_cluster(cluster: LocalCluster, node: str, path: str) -> Any:
    """``GET path`` at ``node`` as the cluster itself (every role); the reply, or a failure."""
    code, body = http_json(cluster.url(node) + path, cluster_secret=cluster.identity.secret)
    assert code == 200, (path, code, body)
    return body


def credential(files: dict[str, Path], name: str) -> ClientCredential:
    return load_credential(str(files[name]))
