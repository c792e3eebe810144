"""Signed admin messages (docs/node-api.md, "Signed admin messages"): golden bytes and refusals."""

from __future__ import annotations

import pytest

from kayos.errors import Unauthenticated
from kayos.identity import ClusterIdentity
from kayos.signing import check_signed, mac_input, sign

pytestmark = pytest.mark.unit

IDENTITY = ClusterIdentity("00000000-0000-4000-8000-000000000001", bytes(range(32)))
BODY = {"epoch": 2, "shards": [{"id": 0, "chain": ["b", "c"]}]}
GOLDEN_MAC = "56857ac912edbd7565fdf288aa434d58e87cf1ffea4a821822897fb0f44b8c74"


def test_golden_bytes_match_the_docs() -> None:
    assert mac_input(IDENTITY, "topology", BODY) == (
        b"kayos-admin-v1\x00topology\x00"
        + bytes.fromhex("00000000000040008000000000000001")
        + b'\x00{"epoch":2,"shards":[{"chain":["b","c"],"id":0}]}'
    )
    assert sign(IDENTITY, "topology", BODY) == GOLDEN_MAC
    check_signed(IDENTITY, "topology", BODY, GOLDEN_MAC)


@pytest.mark.parametrize(
    ("identity", "purpose", "body", "mac"),
    [
        (IDENTITY, "catch-up", BODY, GOLDEN_MAC),  # another purpose
        (IDENTITY, "topology", {**BODY, "epoch": 3}, GOLDEN_MAC),  # another body
        (
            ClusterIdentity("00000000-0000-4000-8000-000000000002", bytes(range(32))),
            "topology",
            BODY,
            GOLDEN_MAC,
        ),  # another cluster
        (
            ClusterIdentity(IDENTITY.cluster_id, bytes(32 * [7])),
            "topology",
            BODY,
            GOLDEN_MAC,
        ),  # another secret
        (IDENTITY, "topology", BODY, GOLDEN_MAC.upper()),
        (IDENTITY, "topology", BODY, GOLDEN_MAC[:-2]),
        (IDENTITY, "topology", BODY, None),
        (IDENTITY, "topology", BODY, 12),
        (None, "topology", BODY, GOLDEN_MAC),  # a node without a secret
    ],
)
def test_refusals(
    identity: ClusterIdentity | None, purpose: str, body: object, mac: object
) -> None:
    with pytest.raises(Unauthenticated):
        check_signed(identity, purpose, body, mac)


def test_unknown_purpose_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="purpose"):
        sign(IDENTITY, "anything", BODY)


OPERATOR_BODY = {"epoch": 5, "op": "drain", "node": "c"}
OPERATOR_MAC = "f902ef5f049af886ef0de0cb4825bfee38de47b4c485541dca212ab9aa891523"


def test_operator_golden_bytes_match_the_docs() -> None:
    """kayos ctl add-node / drain / move-shard / rebalance sign with purpose ``operator``."""
    assert mac_input(IDENTITY, "operator", OPERATOR_BODY) == (
        b"kayos-admin-v1\x00operator\x00"
        + bytes.fromhex("00000000000040008000000000000001")
        + b'\x00{"epoch":5,"node":"c","op":"drain"}'
    )
    assert sign(IDENTITY, "operator", OPERATOR_BODY) == OPERATOR_MAC
    with pytest.raises(Unauthenticated):
        check_signed(IDENTITY, "remove-node", OPERATOR_BODY, OPERATOR_MAC)
