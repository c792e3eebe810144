"""A node's door (kayos/node/access.py) in process: a table is kept in the data directory (mode
0600) and replaced only by a higher version; refusals are all counted but logged at most
``auth_refusal_log_lines_per_minute_max`` a minute, and no log line holds the header sent."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kayos import limits
from kayos.auth.keys import new_secret
from kayos.auth.rules import Rule
from kayos.auth.table import CredentialsTable, add_credential, parse_grant_text
from kayos.client.auth import ClientCredential
from kayos.clock import ManualClock
from kayos.node.access import TABLE_FILE, Access

pytestmark = pytest.mark.unit


def a_table() -> tuple[CredentialsTable, ClientCredential]:
    secret = new_secret()
    grants = (parse_grant_text("admin+consume+produce=*"),)
    table = add_credential(CredentialsTable(), "ops", grants, secret)
    return table, ClientCredential("ops", secret.client_key())


def test_a_table_is_kept_private_and_replaced_only_by_a_newer_one(tmp_path: Path) -> None:
    clock = ManualClock()
    access = Access(str(tmp_path), None, clock, CollectorRegistry())
    assert access.table.is_open
    table, _ = a_table()
    assert access.install(table)
    assert not access.install(table)  # the same version changes nothing
    mode = stat.S_IMODE(os.stat(tmp_path / TABLE_FILE).st_mode)
    assert mode == 0o600
    again = Access(str(tmp_path), None, clock, CollectorRegistry())
    assert again.table == table


def test_refusals_are_all_counted_and_logged_within_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    access = Access(str(tmp_path), None, clock, registry)
    table, good = a_table()
    access.install(table)
    stranger = ClientCredential("ops", new_secret().client_key(), clock)
    knocks = 3 * limits.auth_refusal_log_lines_per_minute_max
    sent = []
    with caplog.at_level(logging.WARNING, logger="kayos.node.access"):
        for _ in range(knocks):
            header = stranger.http_authorization("GET", "/v1/status")
            sent.append(header)
            verdict = access.check_http(Rule("admin"), None, "GET", "/v1/status", header, None, "p")
            assert verdict.status == 401
            assert verdict.reason == "bad_proof"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == limits.auth_refusal_log_lines_per_minute_max + 1
    counted = registry.get_sample_value("kayos_auth_refusals_total", {"reason": "bad_proof"})
    assert counted == knocks
    assert not any(header.split("proof=")[1] in line for header in sent for line in lines)
    assert not any("Kayos-Proof" in line for line in lines)
    clock.advance(60)  # a new minute logs again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kayos.node.access"):
        access.check_http(Rule("admin"), None, "GET", "/v1/status", None, None, "p")
    assert len(caplog.records) == 1
    header = ClientCredential("ops", good.client_key, clock).http_authorization("GET", "/v1/status")
    allowed = access.check_http(Rule("admin"), None, "GET", "/v1/status", header, None, "p")
    assert allowed.allowed


def test_a_client_certificates_common_name_names_its_credential() -> None:
    from kayos.node.access import certificate_subject

    peercert = {"subject": ((("countryName", "NL"),), (("commonName", "orders-app"),))}
    assert certificate_subject(peercert) == "orders-app"
    assert certificate_subject(None) is None
    assert certificate_subject({"subject": ()}) is None
