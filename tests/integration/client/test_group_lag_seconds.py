"""A group's lag in seconds on real nodes (docs/node-api.md, "Lag"): the age of the oldest unread
message grows while it stays unread, agrees across the members within the sampling interval,
survives a member's restart, is unknown (null) on a member that lost its time index file, and
drops to 0 once the group commits past it."""

from __future__ import annotations

import signal
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from kayos import limits
from kayos.client import Client
from kayos.local.cluster import LocalCluster
from kayos.local.http import http_json
from kayos.replication.logic.timeindex import TIME_INDEX_FILE
from tests.support.cluster import commit_group, produce_ok, wait_until

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    from collections.abc import Callable

QUEUE = "aging"
GROUP = "slow"
# Members sample on their own clocks when each takes the batch in: their answers differ by at
# most one sampling interval plus the replication delay and the time between the requests.
MEMBER_SPREAD_S = limits.time_index_interval_ms / 1000 + 1.0


def group_infos(cluster: LocalCluster, queue: str = QUEUE) -> dict[str, dict[str, Any]]:
    infos = {}
    for node in cluster.topology.chain_for(queue).members:
        status, info = http_json(f"{cluster.url(node)}/v1/queues/{queue}/groups/{GROUP}")
        assert status == 200, info
        infos[node] = info
    return infos


def test_lag_seconds_grows_while_unread_agrees_on_members_and_drops_after_commit(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    head = cluster.url(cluster.head_of(QUEUE))
    assert {info["lag_seconds"] for info in group_infos(cluster).values()} == {0}

    produced_at = time.time()
    _, last = produce_ok(head, QUEUE, [("a", "1"), ("b", "2")])
    cluster.wait_replicated()
    first = wait_until(
        lambda: (
            (infos := group_infos(cluster)) and all(i["lag"] == 2 for i in infos.values()) and infos
        ),
        "lag 2 on every member",
    )
    # Known on every member, and never younger than the message is (floor of the sample).
    assert all(i["lag_seconds"] is not None for i in first.values()), first
    assert all(
        i["lag_seconds"] <= time.time() - produced_at + MEMBER_SPREAD_S for i in first.values()
    )

    # It grows while the messages stay unread: wait (by polling) until every member says > 1.5 s.
    grown = wait_until(
        lambda: (
            (infos := group_infos(cluster))
            and all(i["lag_seconds"] is not None and i["lag_seconds"] > 1.5 for i in infos.values())
            and infos
        ),
        "lag_seconds past 1.5 s on every member",
    )
    ages = [i["lag_seconds"] for i in grown.values()]
    print(f"lag_seconds by member: {grown and {n: i['lag_seconds'] for n, i in grown.items()}}")
    assert max(ages) - min(ages) <= MEMBER_SPREAD_S, grown
    true_age = time.time() - produced_at
    assert all(age <= true_age + limits.time_index_interval_ms / 1000 + 0.5 for age in ages)
    assert all(age >= 1.5 for age in ages)

    # The typed clients carry it too.
    with Client(head) as client:
        info = client.group(QUEUE, GROUP)
    assert info.lag == 2
    assert info.lag_seconds is not None
    assert info.lag_seconds >= min(ages)

    commit_group(head, QUEUE, GROUP, last)
    wait_until(
        lambda: all(i["lag"] == 0 and i["lag_seconds"] == 0 for i in group_infos(cluster).values()),
        "lag_seconds 0 on every member after the commit",
    )

    # The Prometheus gauge (a group with a mark; cheap, so it takes the age of the first seq
    # past the mark, here the commit's own seq): well below the old messages' age now, growing
    # once a message waits again.
    after_commit = gauge(head)
    assert after_commit is not None
    assert after_commit < min(ages), (after_commit, ages)
    produce_ok(head, QUEUE, [("c", "3")])
    wait_until(lambda: (gauge(head) or 0.0) > 0.5, "the lag_seconds gauge past 0.5 s")


def gauge(url: str) -> float | None:
    """``kayos_group_lag_seconds`` of the test's group from the node's /metrics page."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("kayos_group_lag_seconds{") and f'group="{GROUP}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_lag_seconds_survives_a_restart_and_a_lost_file_reads_as_unknown(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    head_node = cluster.head_of(QUEUE)
    head = cluster.url(head_node)
    produce_ok(head, QUEUE, [("a", "1")])
    cluster.wait_replicated()
    before = wait_until(
        lambda: (
            (infos := group_infos(cluster))
            and all(i["lag"] == 1 and i["lag_seconds"] is not None for i in infos.values())
            and infos
        ),
        "lag_seconds known on every member",
    )
    tail_node = cluster.tails_of(QUEUE)[0]
    members = cluster.topology.chain_for(QUEUE).members
    middle_node = next(n for n in members if n not in (head_node, tail_node))
    shard = str(cluster.topology.chain_for(QUEUE).id)

    # A clean restart writes the file at stop and reads it back: the age is still known (a
    # restart keeps the entries: nothing is caught up on again).
    for node in (head_node, tail_node):
        cluster.kill(node, sig=signal.SIGTERM)
        cluster.start(node)
    # A member whose file is gone knows the data but not when it came: null, never an error.
    cluster.kill(middle_node, sig=signal.SIGTERM)
    (cluster.data_dir(middle_node) / "shards" / shard / TIME_INDEX_FILE).unlink()
    cluster.start(middle_node)
    cluster.wait_replicated()

    after = wait_until(
        lambda: (
            (infos := group_infos(cluster)) and all(i["lag"] == 1 for i in infos.values()) and infos
        ),
        "lag 1 on every member after the restarts",
    )
    print({n: i["lag_seconds"] for n, i in after.items()})
    assert after[middle_node]["lag_seconds"] is None, after
    for node in (head_node, tail_node):
        assert after[node]["lag_seconds"] is not None, after
        assert after[node]["lag_seconds"] >= before[node]["lag_seconds"], (before, after)
    spread = abs(after[tail_node]["lag_seconds"] - after[head_node]["lag_seconds"])
    assert spread <= MEMBER_SPREAD_S, after
