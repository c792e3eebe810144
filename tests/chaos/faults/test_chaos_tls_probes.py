"""The campaign's probes against a real cluster with TLS on every port (docs/security.md): the
stranger's HELLO reaches the node inside TLS and is refused by the node itself (its challenge
seen, not a failed handshake), the hostile HTTP requests are refused by its input checks, and,
once the cluster holds credentials, every stolen-but-wrong knock reaches the node's door (each
counted there as a bad proof) while the hostile requests, proving the workload's credential,
still get past the door to be refused by the checks."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaos.procs import faults, guard
from kayos import tlsconfig
from kayos.local.cluster import LocalCluster

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    try:
        with LocalCluster(tmp_path / "cluster", nodes=2, replicas=2, tls=True) as started:
            yield started
    finally:
        tlsconfig.install(None)  # this process speaks plain again for the tests after


def bad_proofs(cluster: LocalCluster, node: str) -> float:
    """The node's ``kayos_auth_refusals_total{reason="bad_proof"}`` (its ``/metrics``)."""
    request = urllib.request.Request(cluster.url(node) + "/metrics")
    with guard.probe_urlopen(cluster, request, faults.probe_timeout_s) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "kayos_auth_refusals_total"
                and sample.labels["reason"] == "bad_proof"
            ):
                return float(sample.value)
    raise AssertionError("no kayos_auth_refusals_total on /metrics")


def test_the_probes_speak_tls_to_a_tls_cluster(cluster: LocalCluster, tmp_path: Path) -> None:
    assert cluster.url("a").startswith("https://")
    node = cluster.ids[0]
    stranger = faults.inject(cluster, faults.Fault(0, "stranger", node, 0.0))
    assert stranger["refused"], stranger
    assert "AuthChallenge" in stranger["frames"], stranger  # the node spoke to it, inside TLS
    assert "unexpected" not in stranger, stranger
    hostile = faults.inject(cluster, faults.Fault(1, "hostile_http", node, 0.0))
    assert "unexpected" not in hostile, hostile
    assert all(isinstance(answer, int) for answer in hostile["answers"]), hostile

    credentials = guard.enable_credentials(cluster, tmp_path)
    with guard.credentials_in_env(credentials):
        before = bad_proofs(cluster, node)
        stranger = faults.inject(cluster, faults.Fault(2, "stranger", node, 0.0))
        assert stranger["refused"], stranger
        assert stranger["stolen_tries"] > 0, stranger
        # Each stolen knock (HTTP and binary) reached the node's door and was refused there.
        assert bad_proofs(cluster, node) - before == stranger["stolen_tries"], stranger
        hostile = faults.inject(cluster, faults.Fault(3, "hostile_http", node, 0.0))
        assert "unexpected" not in hostile, hostile
        assert 401 not in hostile["answers"], hostile  # past the door: the input checks refused
