"""``kayos import-kestrel`` end to end, as docs/migrating-from-kestrel.md describes the move: a
3-node cluster as ``kayos up --kestrel-port 0`` starts it (LocalCluster, no front), the import as
a ``python -m kayos import-kestrel DIR --cluster <node a>`` process, then a ``kayos kestrel
--cluster <node a>`` process serving the imported queues to a memcache client (python-memcached).
The journals are built byte by byte from the documented format."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.kestrel import KestrelFront
from kestrel_compat.backends.kayos_backend import KayosBackend

pytestmark = pytest.mark.integration

memcache: Any = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")

IMPORT_TIMEOUT_S = 120.0


def addx(data: bytes, add_ms: int = 1_000, expiry_ms: int = 0) -> bytes:
    return b"\x02" + struct.pack("<iqq", 16 + len(data), add_ms, expiry_ms) + data


def add(data: bytes, expiry_s: int = 0) -> bytes:
    return b"\x00" + struct.pack("<ii", 4 + len(data), expiry_s) + data


def xid_op(opcode: int, xid: int) -> bytes:
    return bytes([opcode]) + struct.pack("<i", xid)


def continue_item(xid: int, data: bytes) -> bytes:
    return b"\x08" + struct.pack("<iiqq", xid, 16 + len(data), 1_000, 0) + data


# Kestrel 2.1 and later journal an /open as REMOVE_TENTATIVE_XID (9); Kestrel 1.x and 2.0 wrote
# REMOVE_TENTATIVE (3), the opcode alone, and numbered it from their xid counter on replay.
ABORT, CONFIRM, OPEN = 5, 6, 9
OPEN_2_0 = b"\x03"


def write_journals(directory: Path) -> dict[str, list[str]]:
    """A Kestrel queue directory; returns what each queue must hold after the import."""
    directory.mkdir()
    future_s = int(time.time()) + 3600
    files = {
        # Superseded by the pack file below: must not be replayed.
        "jobs.100": addx(b"dead-1") + addx(b"dead-2"),
        "jobs.150": addx(b"dead-3"),
        # A pack as Kestrel 2.1+ writes it: the read open at the checkpoint, then the queue.
        "jobs.150.pack": addx(b"j-open-at-pack") + xid_op(OPEN, 8) + addx(b"j1") + addx(b"j2"),
        "jobs.151": addx(b"j3") + xid_op(OPEN, 9) + xid_op(CONFIRM, 9) + xid_op(ABORT, 8),
        # The current file: one more item, a read left open at shutdown, a torn tail.
        "jobs": addx(b"j4") + xid_op(OPEN, 10) + addx(b"j5")[:-2],
        "jobs~~rewrite": b"\xff garbage of an interrupted rewrite",
        # Old-style ADDs with expiries in seconds: one long gone, one later, one never.
        "old": add(b"o1")
        + b"\x01"
        + add(b"gone", 1)
        + add(b"later", future_s)
        + add(b"never")
        + add(b"o3"),
        # A fanout: the master and its child each keep their own items.
        "feed": addx(b"f1") + addx(b"f2") + b"\x01",
        "feed+audit": addx(b"a1")
        + addx(b"a2")
        + addx(b"a3")
        + xid_op(OPEN, 1)
        + xid_op(CONFIRM, 1)
        + xid_op(OPEN, 2)
        + continue_item(2, b"a4"),
        # Written by Kestrel 2.0: l1 and l2 opened with the bare opcode (reads 1 and 2 of its
        # counter), l2 confirmed, l4 added, l3 removed by a plain get; l1, open at the end, comes
        # back at the head. (Read as 2.1 reads it, both would be read 0 and l2 would come back.)
        "legacy": addx(b"l1")
        + addx(b"l2")
        + addx(b"l3")
        + OPEN_2_0
        + OPEN_2_0
        + xid_op(CONFIRM, 2)
        + addx(b"l4")
        + b"\x01",
        # A corrupt record in the middle: the whole queue stays out.
        "broken": addx(b"b1") + b"\x63" + addx(b"b2"),
        "empty": addx(b"e1") + b"\x01",
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {
        # j-open-at-pack (xid 8) is aborted in jobs.151 back to the head, j1 confirmed there;
        # j-open-at-pack is opened again (xid 10) at shutdown and returns to the head.
        "jobs": ["j-open-at-pack", "j2", "j3", "j4"],
        "old": ["later", "never", "o3"],
        "feed": ["f2"],
        "feed+audit": ["a3", "a4"],
        "legacy": ["l1", "l4"],
        "empty": [],
    }


IMPORT = [sys.executable, "-m", "kayos", "import-kestrel"]


def run_import(directory: Path, seed: str, *extra: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*IMPORT, str(directory), "--cluster", seed, *extra],
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
        env={**os.environ, "COLUMNS": "200"},
    )
    print(result.stdout, result.stderr)
    return result


def drain(front: KestrelFront, queue: str) -> list[str]:
    """Every item left, each read with /open then confirmed with /close."""
    reader = memcache.Client([front.address], dead_retry=0, socket_timeout=10)
    found: list[str] = []
    try:
        for _ in range(1000):
            value = reader.get(f"{queue}/open")
            if value is None:
                break
            found.append(value.decode())
            assert reader.get(f"{queue}/close") is None
    finally:
        reader.disconnect_all()
    return found


def groups_on(seed: str) -> set[tuple[str, str]]:
    async def listing() -> set[tuple[str, str]]:
        backend = await KayosBackend.connect(seed)
        try:
            return await backend.all_groups()
        finally:
            await backend.close()

    return asyncio.run(listing())


def row(output: str, queue: str) -> list[str]:
    """The final table's row of ``queue`` as its cells."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
        if cells and cells[0] == queue:
            return cells
    raise AssertionError(f"no row for {queue!r} in:\n{output}")


def test_import_then_a_front_serves_exactly_the_replayed_items(
    tmp_path: Path, start_cluster: Callable[..., LocalCluster]
) -> None:
    expected = write_journals(tmp_path / "kestrel")
    cluster = start_cluster(nodes=3, replicas=3)
    seed = cluster.url(cluster.ids[0])

    dry = run_import(tmp_path / "kestrel", seed, "--dry-run")
    assert dry.returncode == 1, "the corrupt queue fails even a dry run"
    assert row(dry.stdout, "jobs")[1:3] == ["dry run", "4"]
    assert groups_on(seed) == set()

    first = run_import(tmp_path / "kestrel", seed)
    assert first.returncode == 1
    assert row(first.stdout, "jobs")[1:3] == ["imported", "4"]
    assert row(first.stdout, "old")[1:4] == ["imported", "3", "1"]
    assert row(first.stdout, "empty")[1:3] == ["imported", "0"]
    assert row(first.stdout, "broken")[1] == "corrupt"
    assert "broken at offset 23: queue 'broken': unknown opcode 99" in first.stdout
    assert "jobs at offset 28: torn tail (ADDX record cut off after 21 bytes)" in first.stdout
    assert groups_on(seed) == {
        ("jobs", "jobs"), ("old", "old"), ("feed", "feed"), ("feed", "feed+audit"),
        ("legacy", "legacy"), ("empty", "empty"),
    }  # fmt: skip

    again = run_import(tmp_path / "kestrel", seed, "--queue", "jobs", "--queue", "feed+audit")
    assert again.returncode == 0
    assert row(again.stdout, "jobs")[1:3] == ["already imported", "0"]
    assert row(again.stdout, "feed+audit")[1:3] == ["already imported", "0"]

    forced = run_import(tmp_path / "kestrel", seed, "--queue", "old", "--force")
    assert forced.returncode == 0
    assert row(forced.stdout, "old")[1:3] == ["imported", "3"]

    front = KestrelFront(tmp_path / "front.log", cluster=seed)
    front.start()
    try:
        served = {queue: drain(front, queue) for queue in expected}
        assert drain(front, "broken") == []
    finally:
        front.stop()
    assert served == expected
