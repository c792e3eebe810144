"""The one table of who may do what: every HTTP route of a node and of a manager member and every
binary request kind, with the role it needs (docs/security.md, "Roles"), and the pure decision
``decide(table, who, rule, queue) -> Verdict``.

A rule's role is ``produce``, ``consume`` or ``admin`` (a credential's grants), ``cluster`` (only
the cluster's own requests: the manager's watch), ``signed`` (the body carries an HMAC under the
cluster secret, which the handler checks: kayos/signing.py) or ``open`` (no credential: the
topology, which clients need to find the nodes and which holds no secret, and the metrics). Its
scope says which queues the role must cover: the path's ``queue``, ``any`` queue (a shard's
routes: shards are shared by queues), or ``all`` queues (the grant's pattern is ``*``).

A route missing from the table needs ``admin`` on every queue: a route added without a row is
closed, never open (the table test walks every route the app registers).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from kayos.auth.keys import CLUSTER_PRINCIPAL
from kayos.auth.table import Credential, CredentialsTable

OPEN: Final = "open"
SIGNED: Final = "signed"
CLUSTER: Final = "cluster"


@dataclass(frozen=True, slots=True)
class Rule:
    role: str  # produce, consume, admin, cluster, signed, open
    scope: str = "all"  # queue, any, all


@dataclass(frozen=True, slots=True)
class Verdict:
    status: int  # 200 allowed, 401 not authenticated, 403 not allowed
    reason: str | None = None  # kayos.auth.proof.REASONS

    @property
    def allowed(self) -> bool:
        return self.status == 200


ALLOW: Final = Verdict(200)

# (method, route as aiohttp spells it) -> rule. A node's routes, then a manager member's.
HTTP_RULES: Final[dict[tuple[str, str], Rule]] = {
    ("GET", "/metrics"): Rule(OPEN),
    ("GET", "/v1/topology"): Rule(OPEN),
    ("POST", "/v1/admin/topology"): Rule(SIGNED),
    ("GET", "/v1/status"): Rule("admin"),
    ("POST", "/v1/queues/{queue}/messages"): Rule("produce", "queue"),
    ("GET", "/v1/queues/{queue}/consume"): Rule("consume", "queue"),
    ("POST", "/v1/queues/{queue}/groups/{group}/commit"): Rule("consume", "queue"),
    ("GET", "/v1/queues/{queue}/groups/{group}"): Rule("consume", "queue"),
    ("DELETE", "/v1/queues/{queue}/groups/{group}"): Rule("admin", "queue"),
    ("PUT", "/v1/queues/{queue}/retention"): Rule("admin", "queue"),
    ("GET", "/v1/queues/{queue}/retention"): Rule("admin", "queue"),
    ("GET", "/v1/shards/{shard}/groups"): Rule("admin"),
    ("GET", "/v1/shards/{shard}/committed"): Rule("produce", "any"),
    ("POST", "/v1/admin/catch-up"): Rule(SIGNED),
    ("POST", "/v1/admin/lease"): Rule(SIGNED),
    ("POST", "/v1/admin/write-hold"): Rule(SIGNED),
    ("POST", "/v1/admin/followers"): Rule(SIGNED),
    ("POST", "/v1/admin/compact"): Rule(SIGNED),
    ("POST", "/v1/admin/secrets"): Rule(SIGNED),  # read the cluster secrets again (a rotation)
    ("GET", "/v1/admin/watch"): Rule(CLUSTER),
    ("GET", "/v1/admin/compact"): Rule("admin"),
    ("GET", "/v1/shards/{shard}/digest"): Rule("admin"),
    ("GET", "/v1/shards/{shard}/check"): Rule("admin"),
    ("GET", "/v1/admin/credentials"): Rule("admin"),
    ("POST", "/v1/admin/credentials"): Rule("admin"),
    # A manager member's HTTP face (kayos/manager/member/http.py).
    ("GET", "/v1/manager/status"): Rule("admin"),
    ("GET", "/v1/manager/changes"): Rule("admin"),
    ("POST", "/v1/manager/remove-node"): Rule(SIGNED),
    ("POST", "/v1/manager/operator"): Rule(SIGNED),
    ("POST", "/v1/manager/exited"): Rule(SIGNED),
    ("POST", "/v1/manager/secrets"): Rule(SIGNED),
    ("POST", "/v1/manager/suspect"): Rule(OPEN),  # only makes the leader probe the node
}
# A binary request's frame name -> rule (HELLO and the handshake come before any credential).
BINARY_RULES: Final[dict[str, Rule]] = {
    "PRODUCE": Rule("produce", "queue"),
    "WAIT_COMMITTED": Rule("produce", "any"),
    "PING": Rule(OPEN),
    "PONG": Rule(OPEN),
}
UNLISTED: Final = Rule("admin")


def http_rule(method: str, route: str) -> Rule:
    """The rule of a route (``HEAD`` is ``GET``'s); ``UNLISTED`` for one the table lacks."""
    method = "GET" if method.upper() == "HEAD" else method.upper()
    return HTTP_RULES.get((method, route), UNLISTED)


def binary_rule(frame_name: str) -> Rule:
    return BINARY_RULES.get(frame_name, UNLISTED)


def decide(
    table: CredentialsTable,
    who: Credential | str | None,
    rule: Rule,
    queue: str | None,
    refusal: str | None = None,
) -> Verdict:
    """Whether ``who`` (None: no good proof; ``refusal`` then says why) may do what ``rule``
    guards on ``queue``. An open table allows everything: today's behaviour without
    credentials."""
    if rule.role in (OPEN, SIGNED) or table.is_open:
        return ALLOW
    if who is None:
        return Verdict(401, refusal or "missing")
    if who == CLUSTER_PRINCIPAL:
        return ALLOW
    if rule.role == CLUSTER or not isinstance(who, Credential):
        return Verdict(403, "forbidden")
    if rule.scope == "any":
        allowed = who.allows(rule.role, None, any_queue=True)
    else:
        allowed = who.allows(rule.role, queue if rule.scope == "queue" else None)
    return ALLOW if allowed else Verdict(403, "forbidden")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_bind_problem(hosts: list[str], table: CredentialsTable, insecure: bool) -> str | None:
    """The auth half of the safe default (docs/security.md, "Safe defaults"): why a process that
    binds ``hosts`` must not start, or None. A listener off loopback with no credentials lets
    anyone who reaches the host produce, consume and delete; ``--insecure`` says that is meant."""
    exposed = [host for host in hosts if not is_loopback(host)]
    if not exposed or not table.is_open or insecure:
        return None
    return (
        f"refusing to listen on {', '.join(sorted(set(exposed)))} with no client credentials: "
        "anyone who reaches it could produce, consume and delete. Add a credential "
        "(kayos ctl credentials add, docs/security.md) or pass --insecure to run open"
    )
