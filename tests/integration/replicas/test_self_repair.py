"""Self-repair from peers (issue 11, item 4), real ``kayos node`` processes: one replica's store
of a -> b -> c is damaged while its node is down (a byte flipped in a leaf in the middle of its
tree, or the file's tail cut off), for the head, the middle and the tail in turn. On restart the
node salvages what verifies, re-fetches the rest from a peer (the head from its downstream, before
it serves), and reports it; every message acknowledged with acks=all is still served (the chaos
checker's verdict over the recorded history), and ``kayos check`` passes on every store
afterwards."""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from chaos.checker import check
from chaos.history import Event
from kayos.local.http import http_json
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import find_last_header
from kayos.storage.disk.fileops import OS_FILEOPS
from kayos.storage.maintenance.check import check_store, data_file_of
from tests.support.checked import (
    BATCH,
    BATCHES,
    RECORDED_QUEUE,
    assert_nothing_lost,
    consume_recorded,
    produce_recorded,
    store_dir,
)
from tests.support.cluster import answered_status, wait_until

pytestmark = pytest.mark.integration


def live_leaf_at_middle(data_path: str) -> tuple[int, int]:
    """``(start, end)`` in the file of the leaf holding the middle seq of the newest committed
    tree: bytes every read of the whole log must read (a final leaf: commits never rewrite it).
    Half of a store's file is superseded copies of the tree's right edge, which no read of the
    newest tree touches, so a byte picked by its place in the file alone may be one nobody reads.
    A leaf, not an interior node: a node caches the interior nodes it decoded."""
    handle = OS_FILEOPS.open(data_path)
    try:
        _, header = find_last_header(handle)
        assert header.root is not None, f"{data_path} holds no entries"
        reader = btree.NodeReader(handle)
        pos, height = header.root.pos, header.root.height
        middle = header.last_seq // 2
        while height > 1:
            node = reader.read_node(pos)
            assert isinstance(node, fmt.Interior), (data_path, pos)
            firsts = [child.first_seq for child in node.children]
            pos = node.children[max(0, bisect.bisect_right(firsts, middle) - 1)].pos
            height -= 1
        extent = fmt.chunk_extent(handle.pread(64, pos), 0, pos, path=data_path)
        assert extent is not None, (data_path, pos)
        return pos, pos + extent[0]
    finally:
        handle.close()


def damage(path: str, how: str) -> None:
    """``flip``: one byte in the middle of a leaf of the newest tree (``live_leaf_at_middle``);
    ``truncate``: the last fifth of the file, its newest commits with it."""
    data_path = data_file_of(path)
    size = os.path.getsize(data_path)
    if how == "flip":
        start, end = live_leaf_at_middle(data_path)
        offset = (start + end) // 2
        with open(data_path, "r+b") as handle:
            handle.seek(offset)
            byte = handle.read(1)
            handle.seek(offset)
            handle.write(bytes([byte[0] ^ 0x5A]))
        print(f"flip at {offset}, in the leaf at {start}..{end}")
    else:
        os.truncate(data_path, size - size // 5)
    print(f"{how} on {data_path} ({size} bytes)")


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("victim", ["a", "b", "c"])
def test_damaged_replica_repairs_from_peers(start_cluster: Any, victim: str, how: str) -> None:
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    assert cluster.topology.shards[0].chain == ("a", "b", "c")
    events: list[Event] = []
    produce_recorded(cluster, events, "before", BATCHES)
    total = cluster.wait_replicated()[0]

    assert cluster.kill(victim, signal.SIGTERM) == 0
    damage(store_dir(cluster, victim), how)
    assert not check_store(store_dir(cluster, victim)).ok or how == "truncate"
    cluster.start(victim)
    assert cluster.wait_replicated(60)[0] >= total
    produce_recorded(cluster, events, "after", 2)
    cluster.wait_replicated(60)

    replica = answered_status(cluster, victim)["shards"]["0"]
    print(f"{victim} after {how}: {replica}")
    if how == "flip" or victim != "c":
        repair = replica["repair"]
        assert repair is not None, replica
        assert repair["state"] == "repaired", repair
        assert replica["refetched_entries"] > 0, replica
    if how == "flip":
        assert replica["repair"]["kept_seq"] < total, replica
    # Nobody rolled back anything acknowledged: the damaged head re-fetched before it served.
    assert_nothing_lost(cluster, events, (BATCHES + 2) * BATCH)

    cluster.stop()
    for node in cluster.ids:
        checked = subprocess.run(
            [sys.executable, "-m", "kayos", "check", store_dir(cluster, node)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert checked.returncode == 0, (node, checked.stdout, checked.stderr)


def test_damage_met_on_a_read_is_never_served_and_repaired(start_cluster: Any) -> None:
    """Bytes of the tail's store flip while it runs: a consume that meets them fails (never a
    wrong value), the node re-makes the replica (salvage, re-fetch from its upstream) by itself,
    and every acknowledged message is served again."""
    cluster = start_cluster(nodes=3, replicas=3, shards=1)
    events: list[Event] = []
    produce_recorded(cluster, events, "before", BATCHES)
    total = cluster.wait_replicated()[0]
    damage(store_dir(cluster, "c"), "flip")
    url = cluster.url("c")
    status, reply = http_json(f"{url}/v1/queues/{RECORDED_QUEUE}/consume?group=probe&limit=5000")
    assert status == 500, reply
    assert reply["error"]["code"] == "corruption", reply

    def repaired() -> bool:
        found = cluster.status("c")
        replica = found["shards"].get("0") if found else None
        return bool(
            replica
            and replica["repair"]
            and replica["repair"]["state"] == "repaired"
            and replica["last_seq"] == total
            and not replica["catching_up"]
        )

    wait_until(repaired, "the tail re-made its damaged replica")
    replica = answered_status(cluster, "c")["shards"]["0"]
    print(replica)
    assert replica["repair"]["kept_seq"] < total, replica
    assert replica["refetched_entries"] > 0, replica
    consume_recorded(cluster, events, "g")
    verdict = check(events)
    assert not verdict.violations, [v.to_json() for v in verdict.violations]
    assert verdict.acked_versions == BATCHES * BATCH
