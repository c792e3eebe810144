"""``POST /v1/admin/lease``: the manager leader's committed answer to a status poll, and ``POST
/v1/admin/write-hold``: its word on how long a new head's write hold must last, both signed
(docs/node-api.md, "Head leases"; the decisions are in kayos/replication/logic/lease.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kayos.checks import check_u64
from kayos.errors import InvalidRequest
from kayos.replication.logic.lease import NodeLease
from kayos.signing import open_signed

log = logging.getLogger(__name__)

LEASE_FIELDS = frozenset({"epoch", "nonce", "member"})
WRITE_HOLD_FIELDS = frozenset({"epoch", "shard", "hold_ms"})


def apply_lease(identity: Any, lease: NodeLease, node_epoch: int, message: Any) -> dict[str, Any]:
    """Checks the message (401 bad MAC, 400 bad fields), applies it and answers
    ``{"holds", "remaining_ms", "epoch"}``."""
    body = open_signed(identity, "lease", message, LEASE_FIELDS)
    member = body["member"]
    if type(member) is not bool:
        raise InvalidRequest("member must be true or false")
    epoch = check_u64(body["epoch"], "epoch")
    nonce = check_u64(body["nonce"], "nonce")
    held_before = lease.holds()
    lease.adopted(node_epoch)
    holds = lease.granted(nonce, epoch, member)
    if held_before and not holds:
        log.warning("lease lost at epoch %s: %s", node_epoch, "; ".join(lease.notes[-1:]))
    return {"holds": holds, "remaining_ms": lease.remaining_ms(), "epoch": node_epoch}


def apply_write_hold(
    identity: Any, release: Callable[[int, int, int], int | None], message: Any
) -> dict[str, Any]:
    """Checks the message (401 bad MAC, 400 bad fields), shortens the shard's write hold with
    ``release(shard, epoch, hold_ms)`` and answers ``{"shard", "held_ms"}`` (null: no hold)."""
    body = open_signed(identity, "write-hold", message, WRITE_HOLD_FIELDS)
    epoch = check_u64(body["epoch"], "epoch")
    shard = check_u64(body["shard"], "shard")
    hold_ms = check_u64(body["hold_ms"], "hold_ms")
    return {"shard": shard, "held_ms": release(shard, epoch, hold_ms)}
