"""A node's door: the credentials table it holds, the check every HTTP request and binary request
makes against ``kayos.auth.rules`` (docs/security.md), and the refusals it counts and logs.

The table lives in the data directory (``credentials.json``, mode 0600, stored keys only) and
is replaced only by a table of a higher version (``POST /v1/admin/credentials``, which ``kayos ctl
credentials`` sends to every node; ``kayos node --credentials-table FILE`` offers one at start).
A refusal is counted per reason (``kayos_auth_refusals_total``) and logged at most
``auth_refusal_log_lines_per_minute_max`` times a minute, naming the route or request kind, the
peer and the reason: never a header, a proof or a secret.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from prometheus_client import CollectorRegistry

from kayos import limits
from kayos.auth.keys import cluster_stored_keys
from kayos.auth.proof import NonceWindow, Who, verify_binary, verify_http
from kayos.auth.refusals import Refusals
from kayos.auth.rules import Rule, Verdict, decide
from kayos.auth.table import CredentialsTable, decode_table, parse_table
from kayos.clock import Clock
from kayos.errors import Forbidden, InvalidRequest, KayosError, Unauthenticated
from kayos.identity import ClusterIdentity, write_private

log = logging.getLogger("kayos.node.access")

TABLE_FILE = "credentials.json"


class Access:
    """The node's credentials table and its checks (``Node.access``)."""

    def __init__(
        self,
        data_dir: str,
        identity: ClusterIdentity | None,
        clock: Clock,
        registry: CollectorRegistry,
    ) -> None:
        self.path = os.path.join(data_dir, TABLE_FILE)
        self.clock = clock
        self.table = CredentialsTable()
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as handle:
            self.table = decode_table(handle.read(limits.credentials_table_bytes_max + 1))
        self.identity = identity
        self.window = NonceWindow()
        self.refusals = Refusals(registry, clock, log)

    @property
    def cluster_stored(self) -> tuple[bytes, ...] | None:
        """The cluster principal's stored keys under the secrets the node accepts now (they
        change when it reads its file again during a rotation of the cluster secret)."""
        if self.identity is None:
            return None
        return cluster_stored_keys(self.identity.accepted_secrets)

    def install(self, table: CredentialsTable) -> bool:
        """Takes ``table`` if its version is higher than the one held (written to the data
        directory first); False if not (an older or equal push changes nothing)."""
        if table.version <= self.table.version:
            return False
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        write_private(self.path, table.encode().decode())
        self.table = table
        log.info(
            "credentials table version %d: %d credentials", table.version, len(table.credentials)
        )
        return True

    def check_http(
        self,
        rule: Rule,
        queue: str | None,
        method: str,
        path_qs: str,
        header: str | None,
        certificate: str | None,
        peer: object,
    ) -> Verdict:
        """The verdict on one HTTP request (counted and logged when refused)."""
        if rule.role in ("open", "signed") or self.table.is_open:
            return decide(self.table, None, rule, queue)
        who: Who | None = None
        reason: str | None = None
        if header is not None:
            who, reason = verify_http(
                self.table,
                self.cluster_stored,
                header,
                method,
                path_qs,
                int(self.clock.now_s() * 1000),
                self.window,
            )
        elif certificate is not None:
            who = self.table.by_certificate(certificate)
            reason = None if who is not None else "unknown"
        verdict = decide(self.table, who, rule, queue, reason)
        if not verdict.allowed:
            self.refused(verdict, f"{method} {path_qs.split('?')[0]}", peer)
        return verdict

    def check_binary_proof(
        self,
        server_nonce: bytes,
        client_nonce: bytes,
        name: str,
        proof: bytes,
        cluster_uuid: bytes,
    ) -> tuple[Who | None, str | None]:
        return verify_binary(
            self.table, self.cluster_stored, cluster_uuid, server_nonce, client_nonce, name, proof
        )

    def check_binary(
        self, who: Who | None, rule: Rule, queue: str | None, what: str, peer: object
    ) -> Verdict:
        verdict = decide(self.table, who, rule, queue)
        if not verdict.allowed:
            self.refused(verdict, what, peer)
        return verdict

    def refused(self, verdict: Verdict, what: str, peer: object) -> None:
        """Counts a refusal; logs it unless this minute's lines are spent."""
        self.refusals.refused(what, peer, verdict.status, verdict.reason or "missing")


def certificate_subject(peercert: Any) -> str | None:
    """The common name of a TLS client certificate (``ssl``'s ``getpeercert()`` form), or None:
    a credential whose ``certificate`` is that name stands in for a proof."""
    if not isinstance(peercert, dict):
        return None
    for entry in peercert.get("subject", ()):
        for key, value in entry:
            if key == "commonName" and isinstance(value, str):
                return value
    return None


def refusal_error(verdict: Verdict) -> KayosError:
    """The error a refused request gets: it names the reason, never what was sent."""
    if verdict.status == 403:
        return Forbidden("this credential does not hold the role this request needs")
    messages = {
        "missing": "this cluster needs a credential (docs/security.md)",
        "malformed": "the Authorization header is not a Kayos-Proof",
        "unknown": "no such credential",
        "bad_proof": "the proof does not match the credential's secret",
        "stale": "the proof's time is outside the node's window (check the clocks)",
        "replayed": "the proof's nonce was already used",
    }
    return Unauthenticated(messages.get(verdict.reason or "missing", "not authenticated"))


def parse_pushed_table(body: object) -> CredentialsTable:
    """``POST /v1/admin/credentials``'s body: ``{"table": {...}}``."""
    if not isinstance(body, dict) or set(body) != {"table"}:
        raise InvalidRequest('a credentials push is {"table": {...}}')
    return parse_table(body["table"])
