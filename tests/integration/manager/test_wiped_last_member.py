"""A chain's last member whose disk is lost gives way to the member that holds the shard's
history (docs/manager.md rule 3), on real processes: three nodes, one shard, three manager
members. Messages are acknowledged by all three; two members are killed and spliced out one
after the other, then the last one is killed, its data directory deleted, and started again. It
must not go on as the shard (its next write would be seq 1 of a new history): the manager makes
the member spliced out last the chain, the shard refuses writes while that member is down, and
once it is back every acknowledged message is read at the tail and writes flow again."""

from __future__ import annotations

import shutil
import signal
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.manager import Config
from tests.support.checked import chain_of, node_states
from tests.support.cluster import produce, produce_ok, read_snapshot, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Short bounds so the test runs in seconds; no restore copies (rule 10 off): only rule 3 acts.
CONFIG = Config(detection_window_ms=2_000, suspect_after_ms=1_000, replace_after_ms=0)
QUEUE = "orders"
PREFILL = 300


@pytest.fixture
def cluster(tmp_path: Any) -> Any:
    with LocalCluster(
        tmp_path, nodes=3, replicas=3, shards=1, managers=3, manager_config=CONFIG
    ) as c:
        print("\n".join(c.describe()))
        yield c


def test_a_last_member_back_with_an_empty_disk_gives_way_to_the_member_holding_the_history(
    cluster: LocalCluster,
) -> None:
    head, middle, tail = cluster.topology.shards[0].chain
    for start in range(0, PREFILL, 100):
        batch = [(f"k{i}", f"v{i}") for i in range(start, start + 100)]
        produce_ok(cluster.url(head), QUEUE, batch)
    # The middle goes first, then the tail (spliced out last: it holds every acknowledged
    # message); the head is left alone.
    cluster.kill(middle, signal.SIGKILL)
    wait_until(lambda: chain_of(cluster, 0) == [head, tail], f"{middle} spliced out")
    cluster.kill(tail, signal.SIGKILL)
    wait_until(lambda: chain_of(cluster, 0) == [head], f"{tail} spliced out")
    cluster.kill(head, signal.SIGKILL)
    wait_until(lambda: node_states(cluster).get(head) == "down", f"{head} down")
    shutil.rmtree(cluster.data_dir(head) / "shards")  # every store lost, as wipe_down does
    cluster.start(head)

    wait_until(lambda: chain_of(cluster, 0) == [tail], f"{tail}, holding the history, is the chain")
    status, reply = produce(cluster.url(head), QUEUE, [("new", "refused")])
    assert status != 200, f"{head} took a write on a lost disk: {reply}"

    cluster.start(tail)
    wait_until(lambda: (chain_of(cluster, 0) or [None])[0] == tail, f"{tail} heads the shard")
    wait_until(
        lambda: produce(cluster.url(tail), QUEUE, [("after", "ok")])[0] == 200,
        "writes flow again at the shard's head",
    )
    wait_until(
        lambda: chain_of(cluster, 0) == [tail, head],
        f"{head} copied the shard from {tail} and rejoined",
        timeout_s=120.0,
    )
    keys = wait_until(lambda: keys_served(cluster.url(head)), f"{head} serves as the tail")
    assert {f"k{i}" for i in range(PREFILL)} | {"after"} <= keys


def keys_served(url: str) -> set[str] | None:
    """The keys a consumer snapshot at ``url`` holds; None while the node refuses to serve one
    (a tail just rejoined serves once the commit point reaches it on its link)."""
    try:
        return {m["key"] for m in read_snapshot(url, QUEUE, "check").messages}
    except AssertionError:
        return None
