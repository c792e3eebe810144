"""A short campaign against a cluster that holds client credentials (docs/security.md): the
workload proves its own credential through kills and hostile requests, and every stranger also
knocks with stolen-but-wrong credentials on each node's HTTP face and binary port. Zero let in,
zero violations, nothing lost; and the same with TLS on every port and link, the probes
speaking it too. The seed is printed (KAYOS_CHAOS_SEED replays it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos import checked_campaign

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(600)]

FAULTS = 12


def test_strangers_with_stolen_credentials_are_never_let_in(tmp_path: Path) -> None:
    report = checked_campaign(
        tmp_path,
        kinds=("stranger", "kill9", "hostile_http"),
        managers=0,
        faults_max=FAULTS,
        fault_phase_s=120.0,
        credentials=True,
    )
    strangers = report.faults.get("stranger", 0)
    assert strangers > 0, f"seed {report.seed}: no stranger drawn: {report.faults}"
    assert report.strangers_refused == strangers
    assert report.stolen_credential_tries >= 2 * strangers


def test_a_campaign_runs_against_a_cluster_with_tls_and_credentials(tmp_path: Path) -> None:
    report = checked_campaign(
        tmp_path,
        kinds=("stranger", "kill9", "hostile_http"),
        managers=0,
        faults_max=FAULTS // 2,
        fault_phase_s=120.0,
        credentials=True,
        tls=True,
    )
    assert report.faults, f"seed {report.seed}: no fault ran"
    assert report.strangers_refused == report.faults.get("stranger", 0)
    assert report.stolen_credential_tries >= 2 * report.faults.get("stranger", 0)
