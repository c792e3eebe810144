"""``kayos bench produce --credentials FILE`` (docs/benchmarks.md, "TLS against plain"): the
option (or ``KAYOS_CREDENTIALS``) reaches the bench's parameters, the bench's client is built to
prove that credential, and the table its cluster is given holds it. No cluster is started: the
bench's own run is replaced where it would start one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import kayos.bench.produce as produce
import kayos.client.aio as aio
from kayos.auth.keys import new_secret
from kayos.auth.proof import NonceWindow, verify_http
from kayos.auth.rules import Rule, decide
from kayos.cli.address import CREDENTIALS_ENV
from kayos.cli.main import cli
from kayos.client.auth import load_credential
from kayos.local.credentials import table_holding

pytestmark = pytest.mark.unit


class Started(Exception):
    """Raised where the bench would start its cluster or its client."""


def credentials_file(directory: Path, name: str = "bench") -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"name": name, "secret": new_secret().text()}))
    return path


def parameters_given(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> Any:
    """The parameters ``kayos bench produce ARGS`` hands the bench."""
    seen: list[Any] = []

    def fake_bench(parameters: Any, base: Any, phase: Any) -> dict[str, Any]:
        seen.append(parameters)
        raise Started

    monkeypatch.setattr(produce, "bench_produce", fake_bench)
    result = CliRunner().invoke(cli, ["bench", "produce", *args])
    assert isinstance(result.exception, Started), result.output
    return seen[0]


def test_the_option_gives_the_bench_its_credentials_file_beside_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CREDENTIALS_ENV, raising=False)
    path = credentials_file(tmp_path)
    parameters = parameters_given(monkeypatch, ["--tls", "--credentials", str(path), "--json"])
    assert parameters.credentials == str(path)
    assert parameters.tls is True


def test_the_variable_names_the_file_when_the_option_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = credentials_file(tmp_path)
    monkeypatch.setenv(CREDENTIALS_ENV, str(path))
    assert parameters_given(monkeypatch, ["--json"]).credentials == str(path)
    monkeypatch.delenv(CREDENTIALS_ENV)
    assert parameters_given(monkeypatch, ["--json"]).credentials is None


def test_a_file_that_is_no_credential_is_refused_before_the_bench_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CREDENTIALS_ENV, raising=False)
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "bench"}')
    monkeypatch.setattr(produce, "bench_produce", lambda *_args: pytest.fail("bench started"))
    result = CliRunner().invoke(cli, ["bench", "produce", "--credentials", str(bad)])
    assert result.exit_code == 2
    assert "--credentials" in result.output
    assert "secret" in result.output


def test_the_benchs_client_is_built_to_prove_the_credentials_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(credentials_file(tmp_path))
    built: list[dict[str, Any]] = []

    class FakeClient:
        def __init__(self, urls: list[str], **options: Any) -> None:
            built.append({"urls": urls, **options})

        async def __aenter__(self) -> None:
            raise Started

        async def __aexit__(self, *_exc: object) -> None:
            return None

    monkeypatch.setattr(aio, "AsyncClient", FakeClient)
    parameters = produce.ProduceBenchParameters(messages=10, tls=True, credentials=path)
    with pytest.raises(Started):
        asyncio.run(produce.run_workload(["https://127.0.0.1:1"], parameters))
    assert built[0]["credentials"] == path
    assert built[0]["urls"] == ["https://127.0.0.1:1"]


def test_the_table_given_to_the_benchs_cluster_takes_the_files_proofs(tmp_path: Path) -> None:
    path = str(credentials_file(tmp_path, "bench-client"))
    table = table_holding(path)
    assert set(table.credentials) == {"bench-client"}
    header = load_credential(path).http_authorization("POST", "/v1/queues/bench/produce")
    who, reason = verify_http(
        table, None, header, "POST", "/v1/queues/bench/produce",
        int(load_credential(path).clock.now_s() * 1000), NonceWindow(),
    )  # fmt: skip
    assert reason is None
    assert decide(table, who, Rule("produce", "queue"), "bench").allowed
    assert decide(table, who, Rule("admin", "any"), None).allowed
    (tmp_path / "other").mkdir()
    stranger = str(credentials_file(tmp_path / "other", "bench-client"))  # another secret
    header = load_credential(stranger).http_authorization("GET", "/v1/status")
    who, reason = verify_http(
        table, None, header, "GET", "/v1/status", int(load_credential(path).clock.now_s() * 1000),
        NonceWindow(),
    )  # fmt: skip
    assert who is None
    assert reason == "bad_proof"
