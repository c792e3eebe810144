"""Peer authentication without sockets: the MAC input and both proofs against the golden bytes of
docs/replication-protocol.md ("Peer authentication"), every accept/refuse decision, and the
cluster identity in topology files and data directories."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.errors import (
    InvalidRequest,
    ProtocolError,
    Unauthenticated,
    WrongClusterError,
    WrongPeerError,
    error_from_code,
)
from kayos.identity import ClusterIdentity, check_data_dir, write_private
from kayos.local.cluster import LocalCluster
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from kayos.topology import NodeAddr, Topology, rotated

pytestmark = pytest.mark.unit

SECRET = bytes(range(32))
IDENTITY = ClusterIdentity("10111213-1415-1617-1819-1a1b1c1d1e1f", SECRET)
OTHER = ClusterIdentity("20111213-1415-1617-1819-1a1b1c1d1e1f", SECRET)
CLAIM = auth.LinkClaim("b", "a", 0, 1, "middle")
NONCE_A = b"\xaa" * 32
NONCE_C = b"\xcc" * 32

# The connector's MAC input of the golden example, spelled as the document spells it.
GOLDEN_INPUT = (
    "6b61796f732d6c696e6b2d617574682d31"
    "01"
    "101112131415161718191a1b1c1d1e1f"
    "0001 62"
    "0001 61"
    "00000000"
    "0000000000000001"
    "06 6d6964646c65" + "aa" * 32 + "cc" * 32
)
GOLDEN_MAC_C = "65e3c56306ffdd58bfe0ef74909dad8d4e10ae57bc196714405ec5c05b7fcc16"
GOLDEN_MAC_A = "8dedd9169a31cbe5d6519f391a214adad04a7e0eb0d83e5c9930f4aaf87045bf"


def topology(hosts: dict[str, str] | None = None) -> Topology:
    hosts = hosts or {"a": "127.0.0.1", "b": "127.0.0.1", "c": "127.0.0.1"}
    nodes = [
        NodeAddr(node, host, 7101 + i, 7201 + i) for i, (node, host) in enumerate(hosts.items())
    ]
    return rotated(nodes, replicas=len(nodes)).with_identity(IDENTITY)


# --- golden bytes --------------------------------------------------------------------------------


def test_mac_input_is_the_documented_bytes() -> None:
    data = auth.mac_input(auth.CONNECTOR_PROVES, IDENTITY.cluster_uuid, CLAIM, NONCE_A, NONCE_C)
    assert data == bytes.fromhex(GOLDEN_INPUT)


def test_proofs_are_the_documented_hmacs() -> None:
    # Recomputed from the documented input with the standard library, not with auth.proof.
    connector = hmac.new(SECRET, bytes.fromhex(GOLDEN_INPUT), hashlib.sha256).hexdigest()
    acceptor_input = bytearray(bytes.fromhex(GOLDEN_INPUT))
    acceptor_input[len(auth.CONTEXT)] = auth.ACCEPTOR_PROVES
    acceptor = hmac.new(SECRET, bytes(acceptor_input), hashlib.sha256).hexdigest()
    assert connector == GOLDEN_MAC_C
    assert acceptor == GOLDEN_MAC_A
    assert auth.proof(IDENTITY, auth.CONNECTOR_PROVES, CLAIM, NONCE_A, NONCE_C).hex() == connector
    assert auth.proof(IDENTITY, auth.ACCEPTOR_PROVES, CLAIM, NONCE_A, NONCE_C).hex() == acceptor


@pytest.mark.parametrize(
    "other",
    [
        auth.LinkClaim("c", "a", 0, 1, "middle"),  # another connector
        auth.LinkClaim("b", "c", 0, 1, "middle"),  # another acceptor
        auth.LinkClaim("b", "a", 1, 1, "middle"),  # another shard
        auth.LinkClaim("b", "a", 0, 2, "middle"),  # another epoch
        auth.LinkClaim("b", "a", 0, 1, "tail"),  # another role
        auth.LinkClaim("ba", "", 0, 1, "middle"),  # the same characters, cut elsewhere
    ],
)
def test_every_part_of_the_claim_changes_the_proof(other: auth.LinkClaim) -> None:
    mine = auth.proof(IDENTITY, auth.CONNECTOR_PROVES, CLAIM, NONCE_A, NONCE_C)
    assert auth.proof(IDENTITY, auth.CONNECTOR_PROVES, other, NONCE_A, NONCE_C) != mine


# --- the acceptor's decisions --------------------------------------------------------------------


def proof_frame(
    identity: ClusterIdentity = IDENTITY,
    *,
    claim: auth.LinkClaim = CLAIM,
    cluster: bytes | None = None,
    nonce_a: bytes = NONCE_A,
) -> fr.AuthProof:
    mac = auth.proof(identity, auth.CONNECTOR_PROVES, claim, nonce_a, NONCE_C)
    return fr.AuthProof(cluster or identity.cluster_uuid, NONCE_C, mac)


def test_acceptor_takes_a_right_proof() -> None:
    assert auth.check_proof(IDENTITY, CLAIM, NONCE_A, proof_frame()) is None


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (None, Unauthenticated),  # hung up instead of proving
        (fr.Subscribe(0, 1, ()), ProtocolError),  # skipped the proof
        (fr.AuthProof(IDENTITY.cluster_uuid, NONCE_C, b"\x00" * 32), Unauthenticated),  # no secret
        (proof_frame(ClusterIdentity(IDENTITY.cluster_id, b"\x01" * 32)), Unauthenticated),
        (proof_frame(OTHER), WrongClusterError),  # the right secret, another cluster
        (proof_frame(cluster=OTHER.cluster_uuid), WrongClusterError),
        (proof_frame(claim=auth.LinkClaim("c", "a", 0, 1, "middle")), Unauthenticated),
        (proof_frame(nonce_a=b"\xab" * 32), Unauthenticated),  # a replay from another connection
    ],
)
def test_acceptor_refuses(reply: fr.Frame | None, error: type[Exception]) -> None:
    refusal = auth.check_proof(IDENTITY, CLAIM, NONCE_A, reply)
    assert type(refusal) is error


def test_refusal_codes_are_defined_and_map_back() -> None:
    for cls, code in (
        (Unauthenticated, "unauthenticated"),
        (WrongClusterError, "wrong_cluster"),
        (WrongPeerError, "wrong_peer"),
    ):
        assert cls.code == code
        assert type(error_from_code(code, "x")) is cls
        assert issubclass(cls, Unauthenticated)


def test_address_check() -> None:
    hosts = topology({"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"})
    assert auth.check_claimed_address(hosts, "b", "10.0.0.2", {"10.0.0.2"}) is None
    assert auth.check_claimed_address(hosts, "b", "::ffff:10.0.0.2", {"10.0.0.2"}) is None
    lie = auth.check_claimed_address(hosts, "b", "10.0.0.3", {"10.0.0.2"})
    assert isinstance(lie, WrongPeerError)
    assert "10.0.0.3" in str(lie)
    assert isinstance(auth.check_claimed_address(hosts, "x", "10.0.0.2", set()), WrongPeerError)
    assert isinstance(auth.check_claimed_address(hosts, "b", "nonsense", set()), WrongPeerError)


# --- the connector's decisions -------------------------------------------------------------------


def test_connector_checks_the_challenge_and_the_acceptors_proof() -> None:
    assert auth.check_challenge(IDENTITY, fr.AuthChallenge(IDENTITY.cluster_uuid, NONCE_A)) is None
    foreign = auth.check_challenge(IDENTITY, fr.AuthChallenge(OTHER.cluster_uuid, NONCE_A))
    assert isinstance(foreign, WrongClusterError)
    skipped = auth.check_challenge(IDENTITY, fr.HelloOk(3, "a", 1))
    assert type(skipped) is Unauthenticated  # an upstream that does not authenticate
    assert isinstance(auth.check_challenge(IDENTITY, None), ProtocolError)
    good = fr.AuthOk(auth.proof(IDENTITY, auth.ACCEPTOR_PROVES, CLAIM, NONCE_A, NONCE_C))
    assert auth.check_acceptor_proof(IDENTITY, CLAIM, NONCE_A, NONCE_C, good) is None
    # The connector's own proof reflected back is not the acceptor's (the direction byte).
    mirror = fr.AuthOk(auth.proof(IDENTITY, auth.CONNECTOR_PROVES, CLAIM, NONCE_A, NONCE_C))
    refused = auth.check_acceptor_proof(IDENTITY, CLAIM, NONCE_A, NONCE_C, mirror)
    assert type(refused) is Unauthenticated


# --- identity in files ---------------------------------------------------------------------------


def test_topology_file_round_trips_the_identity_and_json_leaves_the_secret_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(topology().dumps_toml())
    loaded = Topology.load(str(path))
    assert loaded.identity == IDENTITY
    assert SECRET.hex() not in str(loaded.to_json())
    assert SECRET.hex() not in repr(loaded)


@pytest.mark.parametrize(
    "head",
    [
        'cluster_id = "10111213-1415-1617-1819-1a1b1c1d1e1f"',  # no secret
        'secret = "' + "00" * 32 + '"',  # no id
        'cluster_id = "nope"\nsecret = "' + "11" * 32 + '"',
        'cluster_id = "10111213-1415-1617-1819-1a1b1c1d1e1f"\nsecret = "zz"',
        'cluster_id = "10111213-1415-1617-1819-1a1b1c1d1e1f"\nsecret = "1111"',  # too short
    ],
)
def test_bad_identity_in_a_topology_file_is_refused(tmp_path: Path, head: str) -> None:
    body = topology().with_identity(None).dumps_toml().replace("epoch = 1\n", "")
    path = tmp_path / "cluster.toml"
    path.write_text(f"epoch = 1\n{head}\n{body}")
    with pytest.raises(InvalidRequest):
        Topology.load(str(path))


def test_a_data_directory_keeps_its_cluster(tmp_path: Path) -> None:
    check_data_dir(str(tmp_path), IDENTITY)
    check_data_dir(str(tmp_path), IDENTITY)  # the same cluster again: fine
    with pytest.raises(WrongClusterError, match="belongs to cluster"):
        check_data_dir(str(tmp_path), OTHER)


def test_kayos_init_writes_a_private_file_with_a_fresh_identity(tmp_path: Path) -> None:
    out = tmp_path / "cluster.toml"
    nodes = ["--node", "a=10.0.0.1:7101:7201", "--node", "b=10.0.0.2:7101:7201"]
    result = CliRunner().invoke(cli, ["init", "--out", str(out), *nodes])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    first = Topology.load(str(out))
    assert first.identity is not None
    assert not first.identity.is_placeholder
    assert [shard.chain for shard in first.shards.values()] == [("a", "b"), ("b", "a")]
    again = CliRunner().invoke(cli, ["init", "--out", str(out), *nodes])
    assert again.exit_code != 0
    assert "exists" in again.output
    forced = CliRunner().invoke(cli, ["init", "--out", str(out), "--force", *nodes])
    assert forced.exit_code == 0, forced.output
    second = Topology.load(str(out))
    assert second.identity is not None
    assert second.identity.cluster_id != first.identity.cluster_id
    bad = CliRunner().invoke(cli, ["init", "--out", str(tmp_path / "x"), "--node", "a=host"])
    assert bad.exit_code != 0
    assert "ID=HOST:HTTP_PORT:BIN_PORT" in bad.output


def test_kayos_init_from_an_old_file_keeps_its_chains(tmp_path: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text(topology().with_identity(None).dumps_toml())
    out = tmp_path / "new.toml"
    result = CliRunner().invoke(cli, ["init", "--out", str(out), "--from", str(old)])
    assert result.exit_code == 0, result.output
    new = Topology.load(str(out))
    assert new.identity is not None
    assert new.shards == Topology.load(str(old)).shards


def test_kayos_up_keeps_the_identity_of_its_data_root(tmp_path: Path) -> None:
    """A second `kayos up` on the same data root is the same cluster (its data directories
    recorded that cluster's id), so the launcher keeps the id and secret of the file it finds."""
    first = LocalCluster(tmp_path)
    write_private(str(first.topology_path), first.topology.dumps_toml())
    assert stat.S_IMODE(os.stat(first.topology_path).st_mode) == 0o600
    again = LocalCluster(tmp_path)
    assert again.identity == first.identity
    assert LocalCluster(tmp_path / "elsewhere").identity != first.identity
