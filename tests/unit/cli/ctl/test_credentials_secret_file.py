"""``kayos ctl credentials add`` and ``rotate`` write the new secret to ``--out`` before any node
hears of it; an edit refused before the table left (a name taken, a credential unknown) removes
that file again, since no credential holds its secret, and a file that exists is never
overwritten. Offline edits (``--table``), no cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli

pytestmark = pytest.mark.unit


def ctl(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["ctl", "credentials", *args])
    return result.exit_code, result.output


def test_a_refused_add_leaves_no_secret_file_and_an_accepted_one_keeps_it(tmp_path: Path) -> None:
    lonely = tmp_path / "p.json"  # the first credential of a table must hold admin on *
    code, out = ctl(
        "add", "p", "--grant", "produce=*", "--out", str(lonely), "--table", str(tmp_path / "x")
    )
    assert code != 0, out
    assert "admin" in out
    assert not lonely.exists()
    table, first, second = tmp_path / "t.bin", tmp_path / "a1.json", tmp_path / "a2.json"
    code, out = ctl("add", "app", "--grant", "admin=*", "--out", str(first), "--table", str(table))
    assert code == 0, out
    assert json.loads(first.read_text())["name"] == "app"
    code, out = ctl(
        "add", "app", "--grant", "produce=*", "--out", str(second), "--table", str(table)
    )
    assert code != 0, out
    assert "exists" in out
    assert not second.exists()  # refused: no credential holds that secret
    assert json.loads(first.read_text())["name"] == "app"  # the first one untouched


def test_a_refused_rotate_leaves_no_secret_file(tmp_path: Path) -> None:
    table, out_path = tmp_path / "t.bin", tmp_path / "ghost.json"
    code, out = ctl("rotate", "ghost", "--out", str(out_path), "--table", str(table))
    assert code != 0, out
    assert "no credential ghost" in out
    assert not out_path.exists()


def test_an_existing_secret_file_is_never_overwritten_nor_removed(tmp_path: Path) -> None:
    table, out_path = tmp_path / "t.bin", tmp_path / "mine.json"
    out_path.write_text("keep me\n")
    code, out = ctl(
        "add", "app", "--grant", "produce=*", "--out", str(out_path), "--table", str(table)
    )
    assert code != 0, out
    assert "never overwritten" in out
    assert out_path.read_text() == "keep me\n"
