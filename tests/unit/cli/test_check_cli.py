"""`kayos check PATH`: a sound store passes; damage is reported with the offset of the first
problem and a non-zero exit (the storage issue's offline verifier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.storage import Delete, Put, ShardStore
from kayos.storage.disk import format as fmt
from kayos.storage.maintenance.compact import compact

pytestmark = pytest.mark.unit


def _make_store(path: Path) -> None:
    with ShardStore.open(str(path)) as store:
        for batch in range(20):
            store.commit(
                [Put(f"k{i % 150}".encode(), bytes(100) + bytes([batch])) for i in range(100)]
            )
        store.commit([Delete(b"k1")], meta={"hwm/g": 5})
        store.commit([Put(b"big", b"x" * 10_000)])


def _check(path: Path) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(cli, ["check", "--json", str(path)])
    return result.exit_code, json.loads(result.output)


def test_sound_store_passes(tmp_path: Path) -> None:
    _make_store(tmp_path / "s")
    code, report = _check(tmp_path / "s")
    assert code == 0, report
    assert report["ok"] is True
    assert report["entries"] == 2002
    assert report["last_seq"] == 2002


def test_sound_store_passes_after_compaction_and_rollback(tmp_path: Path) -> None:
    _make_store(tmp_path / "s")
    with ShardStore.open(str(tmp_path / "s")) as store:
        compact(store)
        store.rollback_to(store.last_seq - 1)
    code, report = _check(tmp_path / "s")
    assert code == 0, report


def test_bit_flip_in_a_leaf_is_reported_with_its_offset(tmp_path: Path) -> None:
    _make_store(tmp_path / "s")
    data = tmp_path / "s" / "data.1.kys"
    with ShardStore.open(str(tmp_path / "s")) as store:
        root = store.header.root
        assert root is not None
        reader = store.current_file().reader
        node = reader.read_node(root.pos)
        assert isinstance(node, fmt.Interior)
        victim = node.children[0].pos  # a leaf of the first commit, far from the tail
    raw = bytearray(data.read_bytes())
    raw[victim + 40] ^= 0x10
    data.write_bytes(bytes(raw))
    code, report = _check(tmp_path / "s")
    assert code == 1
    assert report["ok"] is False
    assert report["offset"] == victim
    assert "CRC" in str(report["problem"])


def test_bad_block_type_byte_is_reported(tmp_path: Path) -> None:
    _make_store(tmp_path / "s")
    data = tmp_path / "s" / "data.1.kys"
    raw = bytearray(data.read_bytes())
    raw[fmt.BLOCK * 3] = 0x7F
    data.write_bytes(bytes(raw))
    code, report = _check(tmp_path / "s")
    assert code == 1
    assert report["offset"] == fmt.BLOCK * 3


def test_plain_output_names_the_offset(tmp_path: Path) -> None:
    _make_store(tmp_path / "s")
    data = tmp_path / "s" / "data.1.kys"
    raw = bytearray(data.read_bytes())
    raw[fmt.BLOCK * 2] = 0x55
    data.write_bytes(bytes(raw))
    result = CliRunner().invoke(cli, ["check", str(tmp_path / "s")])
    assert result.exit_code == 1
    assert f"offset {fmt.BLOCK * 2}" in result.output
