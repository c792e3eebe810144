"""Impostors on a replication link, against real node processes (docs/replication-protocol.md,
"Peer authentication").

The real middle of a shard is paused (SIGSTOP), so only an impostor could acknowledge a write; it
speaks the right frames over a raw socket: without the secret, with the secret but another
cluster's id, and with everything right but from an address the topology does not give its node.
Each is refused with its code and one log line, and the acks=all write stays unanswered until the
real middle is back.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kayos.errors import ProtocolError, Unauthenticated, WrongClusterError, WrongPeerError
from kayos.identity import ClusterIdentity
from kayos.local.cluster import LocalCluster
from kayos.local.processes import ClusterError
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from tests.support.cluster import (
    WAIT_S,
    answered_seqs,
    produce,
    produce_ok,
    shard_seqs,
    wait_until,
)
from tests.support.links import RawLink, answer_challenge, link_hello

pytestmark = pytest.mark.integration

SHARD = 0


def queue_of_shard(cluster: LocalCluster, shard: int) -> str:
    return next(q for q in (f"q{i}" for i in range(1000)) if cluster.topology.shard_for(q) == shard)


@contextlib.contextmanager
def paused(cluster: LocalCluster, node: str) -> Iterator[None]:
    process = cluster.processes[node]
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def refused_with(link: RawLink, code: str) -> fr.ErrorFrame:
    """The acceptor's ERROR, then its close; an impostor's reports sent meanwhile change nothing."""
    try:
        frame = link.next()
        assert isinstance(frame, fr.ErrorFrame), frame
        assert frame.code == code, frame
        assert frame.request_id is None
        link.wait_closed()
        return frame
    finally:
        link.close()


def impostor_reports(link: RawLink, seq: int) -> None:
    """What an impostor middle would say to get a write acknowledged: it is durable, and
    committed below, far past anything."""
    with contextlib.suppress(OSError):  # the acceptor may have closed already
        link.send(
            fr.Subscribe(SHARD, 1, ()),
            fr.Ack(SHARD, seq),
            fr.Committed(SHARD, seq),
        )


def test_impostors_are_refused_and_acknowledge_nothing(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    identity = cluster.topology.identity
    assert identity is not None
    chain = cluster.topology.shards[SHARD]
    head, middle = chain.chain[0], chain.chain[1]
    queue = queue_of_shard(cluster, SHARD)
    host = cluster.topology.nodes[head].host
    port = cluster.topology.nodes[head].bin_port
    epoch = cluster.topology.epoch
    claim = auth.LinkClaim(middle, head, SHARD, epoch, "middle")
    _, before = produce_ok(cluster.url(head), queue, [("k0", "v0")])
    wait_until(lambda: shard_seqs(cluster, head, SHARD) == (before, before), "k0 committed")

    result: dict[str, Any] = {}

    def pending_produce() -> None:
        result["reply"] = produce(cluster.url(head), queue, [("k1", "v1")])

    with paused(cluster, middle):
        writer = threading.Thread(target=pending_produce, daemon=True)
        writer.start()
        wait_until(
            lambda: (shard_seqs(cluster, head, SHARD) or (0, 0))[0] > before,
            "the acks=all write durable on the head",
        )
        written = answered_seqs(cluster, head, SHARD)
        far = written[0] + 1_000

        # 1. The right frames, no secret: a MAC made up.
        link = RawLink.open(host, port)
        link.send(link_hello(middle, SHARD, epoch, "middle"))
        challenge = link.next()
        assert isinstance(challenge, fr.AuthChallenge), challenge
        assert challenge.cluster_id == identity.cluster_uuid
        link.send(fr.AuthProof(identity.cluster_uuid, secrets.token_bytes(32), bytes(32)))
        impostor_reports(link, far)
        refused_with(link, Unauthenticated.code)

        # 2. The right secret, another cluster's id.
        other = ClusterIdentity(str(uuid.uuid4()), identity.secret)
        link = RawLink.open(host, port)
        link.send(link_hello(middle, SHARD, epoch, "middle"))
        challenge = link.next()
        assert isinstance(challenge, fr.AuthChallenge), challenge
        mac = auth.proof(other, auth.CONNECTOR_PROVES, claim, challenge.nonce, bytes(32))
        link.send(fr.AuthProof(other.cluster_uuid, bytes(32), mac))
        impostor_reports(link, far)
        refused_with(link, WrongClusterError.code)

        # 3. Secret and cluster right, but the claimed node id is not at this address: the
        # topology puts every node at 127.0.0.1, the impostor comes from 127.0.0.2.
        link = RawLink.open(host, port, source="127.0.0.2")
        link.send(link_hello(middle, SHARD, epoch, "middle"))
        impostor_reports(link, far)
        refused_with(link, WrongPeerError.code)

        # 3b. A node id the topology does not know at all.
        link = RawLink.open(host, port)
        link.send(link_hello("mallory", SHARD, epoch, "middle"))
        refused_with(link, WrongPeerError.code)

        # 4. A client connection (no secret needed) cannot act as a chain member.
        link = RawLink.open(host, port)
        link.send(fr.Hello(fr.PROTOCOL_VERSION, "client", None, 0, "client"))
        assert isinstance(link.next(), fr.HelloOk)
        link.send(fr.Ack(SHARD, far), fr.Committed(SHARD, far))
        refused_with(link, ProtocolError.code)

        # Every impostor is gone, and the write is still not committed nor answered.
        assert answered_seqs(cluster, head, SHARD) == (written[0], before)
        assert "reply" not in result or result["reply"][0] != 200, result

        # The control: the same handshake with the cluster's real identity is taken, so the
        # refusals above are about what each impostor got wrong.
        link = RawLink.open(host, port)
        link.send(link_hello(middle, SHARD, epoch, "middle"))
        assert isinstance(answer_challenge(link, identity, claim), fr.AuthOk)
        assert isinstance(link.next(), fr.HelloOk)
        link.close()

    writer.join(WAIT_S * 2)
    assert not writer.is_alive()
    status, reply = result["reply"]
    # Answered once the real middle was back (a 504 only if the pause outlasted the node's
    # acks=all bound, which the impostors did not shorten).
    assert status in (200, 504), reply
    if status == 200:
        assert reply["last_seq"] == written[0]
    log = cluster.log_path(head).read_text()
    refusals = [line for line in log.splitlines() if "refused link" in line]
    assert len(refusals) == 4, refusals
    for code in ("unauthenticated", "wrong_cluster", "wrong_peer"):
        assert any(f": {code}:" in line for line in refusals), (code, refusals)


def test_a_node_never_joins_another_clusters_chain_with_its_data(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    """A data directory records its cluster: the same node started with another cluster's
    topology file refuses to start, with the reason in its log."""
    cluster = start_cluster(nodes=1, replicas=1)
    node = cluster.ids[0]
    stranger = cluster.topology.with_identity(ClusterIdentity.generate())
    cluster.kill(node, signal.SIGTERM)
    cluster.topology = stranger
    cluster.topology_path.write_text(stranger.dumps_toml())
    with pytest.raises(ClusterError, match="belongs to cluster"):
        cluster.start(node)
