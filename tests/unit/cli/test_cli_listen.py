"""``kayos node --listen-http/--listen-bin`` (docs/node-api.md): a bad HOST:PORT is refused
with a usage error naming the flag, before anything is opened."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("bad", ["7100", "127.0.0.1", ":7100", "127.0.0.1:0", "h:70000", "h:x"])
@pytest.mark.parametrize("flag", ["--listen-http", "--listen-bin"])
def test_a_bad_listen_address_is_refused(tmp_path: Path, flag: str, bad: str) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text("")
    data = tmp_path / "data"
    result = CliRunner().invoke(
        cli, ["node", "--config", str(config), "--id", "a", "--data", str(data), flag, bad]
    )
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "HOST:PORT" in result.output
    assert not data.exists()
