"""A store copy that resumes and verifies (docs/replication-protocol.md, "Store snapshots"):
the learner's side of the copy (``fetch_snapshot``, what a learner node runs) copies shard 0 from
a real ``kayos node`` process through a small TCP proxy in this process that cuts the link at
random offsets or changes one byte on its way. Each broken attempt keeps its verified prefix and
the next resumes from it; a changed byte is caught before the copy is installed; a copy made while
the upstream compacts and drops entries by retention is a store ``kayos check`` accepts with every
acknowledged message."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kayos.clock import SystemClock
from kayos.local.cluster import LocalCluster
from kayos.replication.link.copied import copied_bytes
from kayos.replication.link.snapshot_link import SnapshotProgress, fetch_snapshot
from kayos.storage.engine import Put, ShardStore
from tests.support.cluster import (
    WAIT_S,
    answered_replica,
    catch_up,
    ctl,
    learned_through,
    produce_ok,
    served_metric,
    wait_until,
)

pytestmark = pytest.mark.integration


@dataclass
class Faults:
    """What the proxy does to the upstream's bytes, per connection (in order): cut after this
    many bytes (None: never), and change the byte at this offset (None: none)."""

    cuts: list[int | None] = field(default_factory=list)
    flips: list[int | None] = field(default_factory=list)
    connections: int = 0
    # Seconds the proxy waits before passing on each read (a slow link: the copy lasts longer).
    pause_s: float = 0.0
    cut_done: list[int] = field(default_factory=list)
    flipped: list[int] = field(default_factory=list)


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    faults: Faults | None = None,
    cut: int | None = None,
    flip: int | None = None,
) -> None:
    sent = 0
    try:
        while data := await reader.read(64 * 1024):
            if faults is not None and faults.pause_s:
                await asyncio.sleep(faults.pause_s)  # a slow link, not a synchronisation
            if flip is not None and faults is not None and sent <= flip < sent + len(data):
                changed = bytearray(data)
                changed[flip - sent] ^= 0x10
                data = bytes(changed)
                faults.flipped.append(flip)
            if cut is not None and faults is not None and sent + len(data) >= cut:
                writer.write(data[: cut - sent])
                await writer.drain()
                faults.cut_done.append(cut)
                return
            writer.write(data)
            await writer.drain()
            sent += len(data)
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _opener(upstream_port: int, faults: Faults) -> Any:
    """A ``connect`` for ``fetch_snapshot``: each connection goes through a proxy of its own to
    the upstream's binary port, with the next faults applied to what the upstream sends."""

    async def open_via_proxy(host: str, port: int) -> Any:
        index = faults.connections
        faults.connections += 1
        cut = faults.cuts[index] if index < len(faults.cuts) else None
        flip = faults.flips[index] if index < len(faults.flips) else None

        async def serve(
            client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
        ) -> None:
            up_reader, up_writer = await asyncio.open_connection(host, upstream_port)
            await asyncio.gather(
                _pipe(client_reader, up_writer),
                _pipe(up_reader, client_writer, faults, cut, flip),
            )

        server = await asyncio.start_server(serve, host, 0)
        proxy_port = server.sockets[0].getsockname()[1]
        connected = await asyncio.open_connection(host, proxy_port)
        server.close()  # no new connections; the one made runs on
        return connected

    return open_via_proxy


def _fill(url: str, batches: int, size: int, value_bytes: int) -> dict[str, int]:
    acked: dict[str, int] = {}
    for batch in range(batches):
        keys = [f"q-{batch}-{i}" for i in range(size)]
        first, _ = produce_ok(url, "q", [(key, "x" * value_bytes) for key in keys])
        acked.update({key: first + i for i, key in enumerate(keys)})
    return acked


def _copy(cluster: LocalCluster, directory: Path, faults: Faults) -> SnapshotProgress:
    address = cluster.topology.nodes["c"]
    progress = SnapshotProgress("c")

    async def run() -> bool:
        return await fetch_snapshot(
            node_id="d",
            topology=cluster.topology,
            shard_id=0,
            peer="c",
            directory=str(directory),
            clock=SystemClock(),
            rng=random.Random(0),
            progress=progress,
            connect=_opener(address.bin_port, faults),
        )

    assert asyncio.run(run()), progress
    return progress


def _assert_store_holds(directory: Path, acked: dict[str, int]) -> int:
    """The copy passes ``kayos check`` and holds every acknowledged seq; returns its last seq."""
    checked = subprocess.run(
        [sys.executable, "-m", "kayos", "check", str(directory)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    store = ShardStore.open(str(directory), clock=SystemClock())
    try:
        seqs = {entry.seq for entry in store.scan()}
        last = store.last_seq
    finally:
        store.close()
    missing = {key: seq for key, seq in acked.items() if seq not in seqs}
    assert not missing, f"{len(missing)} acknowledged entries missing, e.g. {list(missing)[:3]}"
    assert not list(directory.glob("*.snapshot"))
    return last


def test_a_copy_cut_at_random_offsets_resumes_from_its_verified_offset(
    start_cluster: Any, seed: int, tmp_path: Path
) -> None:
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    acked = _fill(cluster.url("a"), 60, 40, 2000)  # about 5 MB in small commits
    cluster.wait_replicated()
    size = next((cluster.data_dir("c") / "shards" / "0").glob("data.*.kys")).stat().st_size
    rng = random.Random(seed)
    cuts: list[int | None] = sorted(rng.randrange(1000, size) for _ in range(3))
    # Each attempt resumes past the cut before it: cut each one that far into its own bytes.
    faults = Faults(cuts=[cuts[0], cuts[1] - cuts[0] + 1000, cuts[2] - cuts[1] + 1000])
    print(f"store file {size} bytes; cuts {faults.cuts}")
    before = copied_bytes["file"]
    progress = _copy(cluster, tmp_path / "copy", faults)
    assert len(faults.cut_done) == 3, faults
    assert progress.attempts == 4, progress
    assert progress.start_offset > 0, progress  # the last attempt resumed
    # Resumed, not restarted: what came again is at most what followed each cut's last header.
    assert progress.received_bytes < progress.total_bytes + 3 * 1024 * 1024, progress
    assert copied_bytes["file"] - before == progress.received_bytes
    assert _assert_store_holds(tmp_path / "copy", acked) == progress.last_seq


def test_a_byte_changed_in_transit_is_caught_before_the_copy_is_installed(
    start_cluster: Any, seed: int, tmp_path: Path
) -> None:
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    acked = _fill(cluster.url("a"), 30, 40, 2000)
    cluster.wait_replicated()
    size = next((cluster.data_dir("c") / "shards" / "0").glob("data.*.kys")).stat().st_size
    flip = random.Random(seed).randrange(4096, size - 4096)
    print(f"store file {size} bytes; the byte at link offset {flip} changed")
    faults = Faults(flips=[flip])
    progress = _copy(cluster, tmp_path / "copy", faults)
    assert faults.flipped == [flip], faults
    assert progress.attempts >= 2, progress  # the first attempt was refused
    assert progress.problem, progress
    assert _assert_store_holds(tmp_path / "copy", acked) == progress.last_seq


def test_a_copy_during_compaction_and_retention_is_a_whole_store(
    start_cluster: Any, seed: int, tmp_path: Path
) -> None:
    """c compacts (an operator's compaction, and a retention policy dropping a queue's old
    entries) again and again while d's copy runs over a slow link, cut twice: each attempt pins
    whichever file is current, and a resumed attempt meeting a new generation starts from 0."""
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    head = cluster.url("a")
    produce_ok(head, "old", [(f"o{i}", "y" * 100) for i in range(200)])
    acked = _fill(head, 60, 40, 2000)
    cluster.wait_replicated()
    topology = str(cluster.topology_path)
    rng = random.Random(seed)
    faults = Faults(cuts=[rng.randrange(100_000, 2_000_000) for _ in range(2)], pause_s=0.01)
    print(f"cuts {faults.cuts}")
    code, reply, err = ctl("retention", "old", "--max-age-ms", "1", "--cluster", head)
    assert code == 0, (reply, err)
    stop = threading.Event()
    compactions: list[int] = []

    def churn() -> None:
        while not stop.is_set():
            code, _, _ = ctl("compact", "--topology", topology, "--node", "c", "--json")
            compactions.append(code)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    try:
        progress = _copy(cluster, tmp_path / "copy", faults)
    finally:
        stop.set()
        worker.join(4 * WAIT_S)
    print(f"compactions during the copy: {compactions}; {progress}")
    assert compactions.count(0) >= 1, compactions
    assert progress.attempts == 3, progress
    assert _assert_store_holds(tmp_path / "copy", acked) == progress.last_seq


def test_a_learner_sharing_no_history_wipes_its_store_and_copies_the_file(
    start_cluster: Any,
) -> None:
    """d holds a store of shard 0 from another history (no master in common with the chain's
    takeover table): instead of replaying the log from seq 1 it wipes the store and copies c's
    store file, counted as bytes copied by file."""
    cluster = start_cluster(nodes=4, replicas=3, shards=1)
    acked = _fill(cluster.url("a"), 20, 40, 2000)
    last = max(acked.values())
    cluster.wait_replicated()
    foreign = cluster.data_dir("d") / "shards" / "0"
    foreign.mkdir(parents=True)
    store = ShardStore.open(str(foreign), clock=SystemClock())
    try:
        for n in range(20):
            store.commit([Put(b"q\x00other-%d-%d" % (n, i), b"z" * 500) for i in range(20)])
    finally:
        store.close()
    body = {"epoch": cluster.topology.epoch, "shard": 0, "upstream": "c"}
    assert catch_up(cluster, "d", body)[0] == 200
    wait_until(lambda: learned_through(cluster, "d", last), "d copied the shard")
    learner = answered_replica(cluster, "d")
    assert learner is not None
    print(learner)
    assert learner["snapshot"] is not None, learner
    assert learner["snapshot"]["done"], learner
    assert learner["refetched_entries"] == 0, learner  # nothing replayed entry by entry
    copied = served_metric(cluster, "d", "kayos_copy_bytes_total", mode="file")
    assert copied == learner["snapshot"]["total_bytes"], (copied, learner)
    cluster.kill("d", signal.SIGTERM)
    _assert_store_holds(foreign, acked)
