"""Plain JSON over HTTP (urllib) to a local cluster's members: what the launcher, the benchmarks
and the tests ask a node or a manager member, without the client's retries."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kayos import tlsconfig
from kayos.auth.proof import cluster_authorization


def http_json(
    url: str,
    *,
    method: str = "GET",
    body: Any = None,
    timeout_s: float = 10.0,
    cluster_secret: bytes | None = None,
) -> tuple[int, Any]:
    """One JSON request; returns (status, decoded body) for success and error replies alike.
    ``cluster_secret``: the request proves the cluster's own principal (docs/security.md), as the
    launcher does for its status polls of a cluster that holds credentials."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if cluster_secret is not None:
        path_qs = urllib.parse.urlsplit(url)
        target = path_qs.path + (f"?{path_qs.query}" if path_qs.query else "")
        now_ms = int(time.time() * 1000)
        headers["Authorization"] = cluster_authorization(
            cluster_secret, method, target, now_ms, os.urandom(16)
        )
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - http URLs we built
    try:
        context = tlsconfig.installed()
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:  # noqa: S310
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return int(error.code), json.loads(raw or b"null")
        except ValueError:
            return int(error.code), raw.decode(errors="replace")
