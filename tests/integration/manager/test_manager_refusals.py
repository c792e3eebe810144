"""A real manager member's HTTP face refusing strangers once the nodes hold credentials
(docs/security.md, "Refusals"): each refusal is counted by reason on the member's ``GET /metrics``
and logged with its reason and the peer, never with the proof it carried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kayos.client.auth import load_credential
from kayos.local.cluster import LocalCluster
from tests.support.cluster import ctl, wait_until
from tests.support.security.credentials import request, stolen_but_wrong

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def refusals(url: str) -> dict[str, float]:
    """The member's ``kayos_auth_refusals_total`` by reason, read from its ``GET /metrics``."""
    status, text = request(url, "GET", "/metrics")
    assert status == 200, text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kayos_auth_refusals_total":
                found[sample.labels["reason"]] = sample.value
    return found


def test_a_manager_member_counts_and_logs_each_refusal_by_reason(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=1, replicas=1, managers=1) as cluster:
        ops = tmp_path / "ops.json"
        code, out, err = ctl(
            "credentials", "add", "ops", "--grant", "admin+consume+produce=*",
            "--out", str(ops), "--cluster", cluster.url(cluster.ids[0]), "--json",
        )  # fmt: skip
        assert code == 0, (out, err)
        member = cluster.manager_members[0].id
        url = cluster.manager_url(member)
        before = refusals(url)
        assert before["missing"] == 0, before
        assert before["bad_proof"] == 0, before

        # The member reads the table the nodes hold; until it has, it answers 503 (not counted).
        def status_without_credential() -> Any:
            code, reply = request(url, "GET", "/v1/manager/status")
            return (code, reply) if code != 503 else None

        code, reply = wait_until(status_without_credential, "the member judging a request")
        assert code == 401, reply
        wrong = load_credential(str(stolen_but_wrong(tmp_path, "ops")))
        code, reply = request(url, "GET", "/v1/manager/status", None, wrong)
        assert code == 401, reply
        code, reply = request(url, "GET", "/v1/manager/status", None, load_credential(str(ops)))
        assert code == 200, reply

        after = refusals(url)
        assert after["missing"] == 1, after
        assert after["bad_proof"] == 1, after
        assert sum(after.values()) == 2, after
        log = cluster.log_path(member).read_text()
    lines = [line for line in log.splitlines() if "refused GET /v1/manager/status" in line]
    assert len(lines) == 2, lines
    assert "401 missing" in lines[0], lines
    assert "401 bad_proof" in lines[1], lines
    assert all("127.0.0.1" in line for line in lines), lines
    assert "Kayos-Proof" not in log
    assert "proof=" not in log
