"""The pure parts of topology changes at a node (kayos/node/replicas/reconfigure.py): which shards
change and how, signed messages, DATA/topology.json, the newest verified topology; the latency
window (kayos/replication/logic/latency.py) and the client's choice of topology
(kayos/client/policy.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kayos import limits
from kayos.client.policy import newest_topology
from kayos.errors import InvalidRequest, Unauthenticated, UnavailableError
from kayos.identity import ClusterIdentity
from kayos.node.replicas.reconfigure import (
    TOPOLOGY_FILE,
    check_message,
    load_message,
    newest,
    plan_changes,
    save_message,
)
from kayos.replication.logic.latency import LatencyWindow, p99, summary
from kayos.signing import sign
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

IDENTITY = ClusterIdentity("00000000-0000-4000-8000-000000000001", bytes(range(1, 33)))
NODES = {n: NodeAddr(n, "127.0.0.1", 9000 + i, 9100 + i) for i, n in enumerate("abcd")}


def topo(epoch: int, *chains: tuple[str, ...], fanout: tuple[str, ...] = ()) -> Topology:
    shards = {i: ShardChain(i, chain, fanout if i == 0 else ()) for i, chain in enumerate(chains)}
    return Topology(epoch, NODES, shards, IDENTITY)


def signed(topology: Topology, identity: ClusterIdentity = IDENTITY) -> dict[str, Any]:
    body = topology.to_json()
    return {"body": body, "mac": sign(identity, "topology", body)}


# --- plan_changes --------------------------------------------------------------------------------


def test_splicing_out_the_middle_remakes_its_neighbours_only() -> None:
    old, new = topo(1, ("a", "b", "c")), topo(2, ("a", "c"))
    assert plan_changes("a", old, new) == {0: "remake"}  # downstream b -> c
    assert plan_changes("c", old, new) == {0: "remake"}  # upstream b -> a
    assert plan_changes("b", old, new) == {0: "close"}
    assert plan_changes("d", old, new) == {}


def test_splicing_out_the_head_remakes_the_new_head_and_keeps_the_tail() -> None:
    old, new = topo(1, ("a", "b", "c")), topo(2, ("b", "c"))
    assert plan_changes("b", old, new) == {0: "remake"}  # middle -> head
    assert plan_changes("c", old, new) == {0: "keep"}  # still the tail below b


def test_splicing_out_the_tail_keeps_the_head() -> None:
    old, new = topo(1, ("a", "b", "c")), topo(2, ("a", "b"))
    assert plan_changes("a", old, new) == {0: "keep"}
    assert plan_changes("b", old, new) == {0: "remake"}  # middle -> tail


def test_joining_and_other_shards() -> None:
    old = topo(1, ("a", "b"), ("b", "c"))
    new = topo(2, ("a", "b", "d"), ("b", "c"))
    assert plan_changes("d", old, new) == {0: "open"}
    assert plan_changes("b", old, new) == {0: "remake", 1: "keep"}
    assert plan_changes("c", old, new) == {1: "keep"}


def test_a_fanout_change_remakes_the_feeding_node() -> None:
    old = topo(1, ("a", "b"), fanout=("c", "d"))
    new = topo(2, ("a", "b"), fanout=("c",))
    assert plan_changes("b", old, new) == {0: "remake"}
    assert plan_changes("c", old, new) == {0: "keep"}
    assert plan_changes("d", old, new) == {0: "close"}


# --- signed messages and DATA/topology.json -------------------------------------------------------


def test_a_signed_message_is_checked() -> None:
    own = topo(1, ("a", "b", "c"))
    new = topo(2, ("a", "c"))
    got = check_message(signed(new), IDENTITY, "a", own)
    assert got == new
    assert got.identity == IDENTITY
    other = ClusterIdentity("00000000-0000-4000-8000-000000000002", bytes(range(2, 34)))
    with pytest.raises(Unauthenticated):
        check_message(signed(new, other), IDENTITY, "a", own)
    with pytest.raises(Unauthenticated):
        check_message({"body": new.to_json()}, IDENTITY, "a", own)
    tampered = signed(new)
    tampered["body"]["epoch"] = 3
    with pytest.raises(Unauthenticated):
        check_message(tampered, IDENTITY, "a", own)
    with pytest.raises(Unauthenticated):
        check_message(signed(new), None, "a", own)
    for malformed in (None, [], new.to_json(), {"body": "x", "mac": "00"}):
        with pytest.raises(InvalidRequest):
            check_message(malformed, IDENTITY, "a", own)


def test_a_message_must_name_the_node_at_its_address() -> None:
    own = topo(1, ("a", "b", "c"))
    without = Topology(2, {n: NODES[n] for n in "bc"}, {0: ShardChain(0, ("b", "c"))}, IDENTITY)
    with pytest.raises(InvalidRequest, match="does not name a"):
        check_message(signed(without), IDENTITY, "a", own)
    moved = dict(NODES)
    moved["a"] = NodeAddr("a", "127.0.0.1", 1, 2)
    with pytest.raises(InvalidRequest, match="moves a"):
        check_message(signed(Topology(2, moved, own.shards, IDENTITY)), IDENTITY, "a", own)


def test_the_saved_message_round_trips_and_a_damaged_one_is_ignored(tmp_path: Path) -> None:
    assert load_message(str(tmp_path)) is None
    message = signed(topo(2, ("a", "c")))
    save_message(str(tmp_path), message)
    assert load_message(str(tmp_path)) == message
    assert not (tmp_path / (TOPOLOGY_FILE + ".tmp")).exists()
    (tmp_path / TOPOLOGY_FILE).write_bytes(json.dumps(message).encode()[:-5])
    assert load_message(str(tmp_path)) is None
    (tmp_path / TOPOLOGY_FILE).write_bytes(b" " * (limits.topology_bytes_max + 1))
    assert load_message(str(tmp_path)) is None


def test_the_newest_verified_message_wins() -> None:
    own = topo(1, ("a", "b", "c"))
    two, three = signed(topo(2, ("a", "c"))), signed(topo(3, ("c", "a")))
    forged = signed(topo(9, ("c",)))
    forged["mac"] = "11" * 32
    best = newest([two, forged, three, None, "junk"], IDENTITY, "a", own)
    assert best is not None
    assert best[0].epoch == 3
    assert best[1] is three
    assert newest([forged], IDENTITY, "a", own) is None


# --- latency --------------------------------------------------------------------------------------


def test_latency_p99_over_a_sliding_window() -> None:
    assert p99([]) == 0.0
    assert p99([5.0]) == 5.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([float(i) for i in range(1, 201)]) == 198.0
    window = LatencyWindow()
    window.add(0.0, 500.0)  # old: leaves the window
    for i in range(100):
        window.add(limits.latency_window_ms / 1000 + i / 100, 1.0)
    now = limits.latency_window_ms / 1000 + 1.0
    assert window.current(now) == [1.0] * 100
    other = LatencyWindow()
    other.add(now, 300.0)
    found = summary([window, other], now)
    assert {k: found[k] for k in ("p99_ms", "window_ms", "samples")} == {
        "p99_ms": 1.0,
        "window_ms": limits.latency_window_ms,
        "samples": 101,
    }
    assert summary([window], now + limits.latency_window_ms)["samples"] == 0


def test_latency_window_is_bounded() -> None:
    window = LatencyWindow()
    for i in range(limits.latency_samples_max + 10):
        window.add(1.0, float(i))
    assert len(window.current(1.0)) == limits.latency_samples_max
    assert min(window.current(1.0)) == 10.0


BUCKET_S = limits.latency_bucket_ms / 1000


def test_recent_buckets_show_a_node_turned_slow_whatever_came_before() -> None:
    """Thousands of fast ACKs followed by a few slow ones: the whole window's p99 stays fast,
    the buckets after the turn show it at once (the slow rule reads them, docs/manager.md)."""
    window = LatencyWindow()
    start = 100 * BUCKET_S
    for i in range(4000):  # 4 buckets of fast samples
        window.add(start + i * 4 * BUCKET_S / 4000, 2.0)
    turned = start + 4 * BUCKET_S
    for b in range(4):  # then each bucket a few answers that waited on a pause
        for k in range(3):
            window.add(turned + b * BUCKET_S + k * 0.01, 400.0 + k)
    now = turned + 4 * BUCKET_S + 0.001  # just into the next bucket
    found = summary([window], now)
    assert found["p99_ms"] < 250
    assert found["bucket_ms"] == limits.latency_bucket_ms
    recent = found["recent_p99_ms"]
    assert len(recent) == limits.latency_buckets
    assert recent[-4:] == [402.0] * 4
    assert recent[-8:-4] == [2.0] * 4
    assert recent[:-8] == [None] * (limits.latency_buckets - 8)


def test_bucket_p99_is_exact_up_to_its_bound_and_merges_shards() -> None:
    a, b = LatencyWindow(), LatencyWindow()
    for i in range(150):  # one bucket: 300 samples over two shards' links, 1..300
        a.add(0.0, float(2 * i + 1))
        b.add(0.0, float(2 * i + 2))
    recent = summary([a, b], BUCKET_S)["recent_p99_ms"]
    assert recent[-1] == 297.0  # nearest rank: the 297th of 300
    assert recent[-1] == p99([float(x) for x in range(1, 301)])
    big = LatencyWindow()
    count = 100 * limits.latency_bucket_top_max + 500
    for i in range(count):
        big.add(0.0, float(i))
    # Past 100 times the kept samples, the smallest kept one: at or over the true p99.
    kept_min = float(count - limits.latency_bucket_top_max)
    assert summary([big], BUCKET_S)["recent_p99_ms"][-1] == kept_min
    assert kept_min >= p99([float(i) for i in range(count)])


def test_buckets_past_the_reported_span_are_dropped() -> None:
    window = LatencyWindow()
    window.add(0.0, 5.0)
    window.add((limits.latency_buckets + 3) * BUCKET_S, 7.0)
    assert len(window.buckets) == 1
    later = summary([window], (limits.latency_buckets + 4) * BUCKET_S)["recent_p99_ms"]
    assert later[-1] == 7.0
    assert later.count(None) == limits.latency_buckets - 1


# --- the client's choice ------------------------------------------------------------------------


def test_the_client_keeps_the_highest_epoch() -> None:
    one, two = topo(1, ("a", "b", "c")), topo(2, ("a", "c"))
    urls = ["u1", "u2", "u3"]
    best, failures = newest_topology(urls, [one, UnavailableError("down"), two], 0)
    assert best is two
    assert failures == ["u2: down"]
    best, failures = newest_topology(urls[:1], [one], 2)
    assert best is None
    assert failures == ["u1: epoch 1 < 2"]
