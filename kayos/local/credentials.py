"""Client credentials for a local cluster (docs/security.md): a credentials table pushed to every
node as the cluster itself (an open cluster takes the first table), and the table that holds the
credential of a client's credentials file, for a cluster of a tool's own (``kayos bench produce
--credentials FILE``, a chaos campaign run with credentials) that its client must prove."""

from __future__ import annotations

import json

from kayos.auth.keys import parse_secret
from kayos.auth.table import CredentialsTable, add_credential, parse_grant_text
from kayos.client.auth import load_credential
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json

# What a tool's own credential may do on the tool's own cluster: everything.
OWN_GRANT = "admin+consume+produce=*"


def push_table(cluster: LocalCluster, table: CredentialsTable) -> None:
    """``table`` to every node (``POST /v1/admin/credentials``, proved by the cluster secret);
    ``RuntimeError`` naming a node that refused it."""
    for node in cluster.ids:
        code, reply = http_json(
            cluster.url(node) + "/v1/admin/credentials",
            method="POST",
            body={"table": table.to_json()},
            cluster_secret=cluster.identity.secret,
        )
        if code != 200:
            raise RuntimeError(f"node {node} refused the credentials table: {code} {reply}")


def table_holding(path: str, grant: str = OWN_GRANT) -> CredentialsTable:
    """A table holding the credential of the credentials file ``path`` (its name and secret),
    granted ``grant``; ``InvalidRequest`` naming the file, never its secret."""
    name = load_credential(path).name  # the file's form, checked as every client checks it
    with open(path, "rb") as handle:
        secret = parse_secret(json.loads(handle.read())["secret"])
    return add_credential(CredentialsTable(), name, (parse_grant_text(grant),), secret)


def hold_credential(cluster: LocalCluster, path: str) -> None:
    """The cluster's nodes hold the credential of the file ``path`` (every role on every queue),
    so a client proving it is let in."""
    push_table(cluster, table_holding(path))
