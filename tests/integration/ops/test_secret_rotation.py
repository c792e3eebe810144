"""Rotating the cluster secret under acks=all producers, against real nodes and manager members
(docs/security.md, "Rotating the cluster secret").

Producers write without pause while ``kayos ctl secret rotate start`` and ``finish`` run: no
producer sees an error and every acknowledged message is read back. Between the steps a new link
proving the new secret is accepted, and after ``finish`` one proving the old secret is refused.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import kayos
from kayos.identity import ClusterIdentity
from kayos.local.cluster import LocalCluster
from kayos.replication.wire import auth
from kayos.replication.wire import frames as fr
from tests.support.cluster import WAIT_S, wait_until
from tests.support.links import RawLink, answer_challenge, link_hello

pytestmark = pytest.mark.integration

SEED = int.from_bytes(os.urandom(4))
print(f"seed {SEED}")
PRODUCERS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, nodes=3, replicas=3, managers=3) as started:
        yield started


class Producers:
    """``PRODUCERS`` threads writing acks=all until stopped; what was acknowledged and every
    error seen."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.urls = list(cluster.urls.values())
        self.stop = threading.Event()
        self.acked: list[str] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(PRODUCERS)]

    def run(self, index: int) -> None:
        with kayos.Client(self.urls, rng=random.Random(SEED + index)) as client:
            count = 0
            while not self.stop.is_set():
                value = f"p{index}-{count}"
                try:
                    client.produce(f"rot{index}", value, value, acks="all")
                except Exception as exc:
                    with self.lock:
                        self.errors.append(f"{value}: {exc!r}")
                else:
                    with self.lock:
                        self.acked.append(value)
                count += 1

    def __enter__(self) -> Producers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(WAIT_S)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def ctl(cluster: LocalCluster, *args: str) -> str:
    command = [sys.executable, "-m", "kayos", "ctl", "secret", "rotate", *args]
    command += ["--topology", str(cluster.topology_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def file_secrets(cluster: LocalCluster) -> dict[str, bytes]:
    data = tomllib.loads(cluster.topology_path.read_text())
    keys = ("secret", "next_secret", "previous_secret")
    return {key: bytes.fromhex(data[key]) for key in keys if key in data}


def link_with(cluster: LocalCluster, secret: bytes) -> fr.Frame | None:
    """A new replication link's handshake to the head of a shard, proving ``secret``."""
    identity = ClusterIdentity(cluster.identity.cluster_id, secret)
    shard = cluster.topology.shards[0]
    upstream, connector = shard.chain[0], shard.chain[1]
    epoch = cluster_epoch(cluster, upstream)
    address = cluster.topology.nodes[upstream]
    link = RawLink.open(address.host, address.bin_port)
    try:
        link.send(link_hello(connector, shard.id, epoch, "middle"))
        claim = auth.LinkClaim(connector, upstream, shard.id, epoch, "middle")
        return answer_challenge(link, identity, claim)
    finally:
        link.close()


def cluster_epoch(cluster: LocalCluster, node: str) -> int:
    from kayos.local.http import http_json

    _, body = http_json(cluster.url(node) + "/v1/topology")
    return int(body["epoch"])


def test_rotation_under_acks_all_producers_loses_nothing_and_errs_nowhere(
    cluster: LocalCluster,
) -> None:
    old = file_secrets(cluster)["secret"]
    with Producers(cluster) as producers:
        wait_until(lambda: producers.count() >= 50, "producers under way")
        out = ctl(cluster, "start")
        assert "step 2" in out
        new = file_secrets(cluster)["secret"]
        assert new != old
        assert file_secrets(cluster)["previous_secret"] == old
        # Both secrets open a link while the rotation is under way.
        assert isinstance(link_with(cluster, new), fr.AuthOk)
        assert isinstance(link_with(cluster, old), fr.AuthOk)
        during = producers.count()
        wait_until(lambda: producers.count() >= during + 50, "writes go on after start")
        ctl(cluster, "finish")
        assert file_secrets(cluster) == {"secret": new}
        after = producers.count()
        wait_until(lambda: producers.count() >= after + 50, "writes go on after finish")
    assert producers.errors == []
    refused = link_with(cluster, old)
    assert isinstance(refused, fr.ErrorFrame), refused
    assert refused.code == "unauthenticated"
    assert isinstance(link_with(cluster, new), fr.AuthOk)
    read: set[str] = set()
    with kayos.Client(list(cluster.urls.values())) as client:
        for index in range(PRODUCERS):
            for page in client.consume(f"rot{index}", "check", page_size=1000):
                read.update(m.value.decode() for m in page.messages if m.value is not None)
    lost = set(producers.acked) - read
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    print(f"rotation: {len(producers.acked)} acknowledged, 0 errors, 0 lost")
