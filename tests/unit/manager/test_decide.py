"""The manager core beyond the transcripts: its Config checks, the view's canonical encoding and
hash (golden), and seeded random event sequences that check the invariants at every step and that
members applying the same log agree (see tests/support/transcript.py for the transcripts)."""

from __future__ import annotations

import json
import os
import random

import pytest

from kayos.errors import InvalidRequest
from kayos.manager import (
    AddNode,
    CatchUpDone,
    Config,
    DiskFull,
    Drain,
    Event,
    HeadTookOver,
    Heartbeat,
    LatencyReport,
    ManagerLeaderChanged,
    ManagerView,
    MoveReplica,
    NodeGone,
    NodeReturned,
    Rebalance,
    RemoveNode,
    SetQueueShards,
    ShardReport,
    TimerTick,
    check_event,
    decide,
    view_hash,
)
from tests.support.transcript import check_invariants

pytestmark = pytest.mark.unit

NODES = ["a", "b", "c", "d"]
CHAINS = [("a", "b", "c"), ("b", "c", "d"), ("c", "d", "a"), ("d", "a", "b")]


def fresh() -> ManagerView:
    return ManagerView.bootstrap(Config(), NODES, CHAINS)


@pytest.mark.parametrize(
    "bad",
    [
        Config(detection_window_ms=0),
        Config(suspect_after_ms=0),
        Config(detection_window_ms=3_000, suspect_after_ms=3_000),
        Config(slow_p99_ms=0),
        Config(slow_window_ms=0),
        Config(slow_p99_ms=6_000, slow_window_ms=5_000),
        Config(min_replicas=0),
        Config(replace_after_ms=-1),
        Config(replication_factor=-1),
    ],
)
def test_config_rejects_bounds_that_cannot_work_together(bad: Config) -> None:
    with pytest.raises(InvalidRequest):
        bad.validate()
    with pytest.raises(InvalidRequest):
        ManagerView.bootstrap(bad, NODES, CHAINS)


def test_the_default_config_is_valid() -> None:
    assert Config().validate() == Config()


@pytest.mark.parametrize(
    ("nodes", "chains"),
    [
        ([], [("a",)]),
        (["a"], []),
        (["a", "a"], [("a",)]),
        (["a", "b"], [()]),
        (["a", "b"], [("a", "a")]),
        (["a", "b"], [("a", "z")]),
        (["a", ""], [("a",)]),
    ],
)
def test_bootstrap_rejects_a_bad_layout(nodes: list[str], chains: list[tuple[str, ...]]) -> None:
    with pytest.raises(InvalidRequest):
        ManagerView.bootstrap(Config(), nodes, chains)


# The hash of ``fresh()`` after the events below. It changes only if the view's encoding (or the
# decisions) change: then raise VIEW_FORMAT in kayos/manager/view.py and update this value, since
# members of different versions must not believe they agree.
HEAL_EVENTS: list[Event] = [
    HeadTookOver(0, "a", bytes.fromhex("aa"), 0),
    Heartbeat("b", 6_000),
    Heartbeat("c", 6_000),
    Heartbeat("d", 6_000),
    TimerTick(6_000),
]
GOLDEN_EVENTS: list[Event] = [
    *HEAL_EVENTS,
    AddNode("e", "127.0.0.1", 7105, 7205),
    MoveReplica(1, "b", "e"),
    Drain("c"),
    SetQueueShards("orders", 2),
    DiskFull("d"),
    TimerTick(6_100, (("b", 6_100),), (("b", "0123456789abcdef"),)),
    NodeGone("d", 6_200, "refused", ""),
]
# view format 7, the default Config (window 0.7 s, slow window 1.5 s, grace 300 s)
GOLDEN_HASH = "5ce66c0d6e0ad3e83466ba349f6a078efb608a0e7ff461dc8c7a6338186b357c"


def run(view: ManagerView, events: list[Event]) -> ManagerView:
    for event in events:
        view, _ = decide(view, event)
    return view


def test_view_hash_is_stable_golden() -> None:
    view = run(fresh(), GOLDEN_EVENTS)
    assert view_hash(view) == GOLDEN_HASH


def test_equal_views_hash_equal_and_different_views_do_not() -> None:
    one = run(fresh(), [Heartbeat("a", 1_000), Heartbeat("b", 2_000)])
    two = run(fresh(), [Heartbeat("b", 2_000), Heartbeat("a", 1_000)])
    assert one == two
    assert one is not two
    assert view_hash(one) == view_hash(two)
    three = run(fresh(), [Heartbeat("a", 1_000), Heartbeat("b", 2_001)])
    assert view_hash(three) != view_hash(one)
    assert view_hash(fresh()) != view_hash(
        ManagerView.bootstrap(Config(min_replicas=3), NODES, CHAINS)
    )


def test_the_view_round_trips_through_its_encoding() -> None:
    view = run(fresh(), GOLDEN_EVENTS)
    data = json.loads(json.dumps(view.to_data()))
    assert ManagerView.from_data(data) == view


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.update(format=8),
        lambda d: d["shards"][0].pop("restoring"),  # format 7 holds each shard's replacement
        lambda d: d.update(format=4, nodes=[["a", "full", 0]]),  # format 5 added "full"
        lambda d: d["nodes"].append(["e", "up", 0]),  # format 6 names each incarnation
        lambda d: d["nodes"][0].__setitem__(3, "not-hex-at-all!!"),
        lambda d: d.update(format=0),
        lambda d: d.pop("orders_issued"),  # format 3 holds every field
        lambda d: d.pop("draining"),
        lambda d: d["shards"][0].pop("moves"),
        lambda d: d["shards"][0].pop("orders"),
        lambda d: d.pop("queues"),  # format 4 holds every field
        lambda d: d.pop("shards"),
        lambda d: d["nodes"].append(["e", "sleepy", 0, ""]),
        lambda d: d["shards"][0].update(takeover=[["zz", 0]]),
        lambda d: d["config"].update(min_replicas=0),
    ],
)
def test_a_bad_encoding_is_refused(breakage: object) -> None:
    data = json.loads(json.dumps(fresh().to_data()))
    breakage(data)  # type: ignore[operator]
    with pytest.raises(InvalidRequest):
        ManagerView.from_data(data)


def random_event(rng: random.Random, now_ms: int, view: ManagerView) -> Event:
    node = rng.choice([*NODES, "zz"])
    other = rng.choice(NODES)
    kind = rng.randrange(10)
    if kind <= 2:
        return Heartbeat(node, now_ms - rng.randrange(0, 2_000))
    if kind == 3:
        heard = tuple((n, now_ms - rng.randrange(0, 500)) for n in NODES if rng.random() < 0.7)
        # Now and then a node heard under a new incarnation (one of two per node).
        incarnations = tuple(
            (n, f"{rng.randrange(2):016x}") for n, _ in heard if rng.random() < 0.1
        )
        return TimerTick(now_ms, heard, incarnations)
    if kind == 4:
        return LatencyReport(other, node, rng.choice([50, 300, 900]), rng.choice([1_000, 10_000]))
    if kind == 5:
        table = ((b"\xaa", 0),) + (((b"\xbb", rng.randrange(100)),) if rng.random() < 0.5 else ())
        return NodeReturned(
            node, now_ms, (ShardReport(rng.randrange(4), rng.randrange(200), table),)
        )
    if kind == 6:
        # Half the reports answer an order the view holds (a returned node or a move target).
        pending = [(s.id, n, o) for s in view.shards for n, o in s.orders]
        if pending and rng.random() < 0.5:
            shard, target, order = rng.choice(pending)
            return CatchUpDone(target, shard, order)
        return CatchUpDone(node, rng.randrange(5), rng.randrange(1, 6))
    if kind == 7:
        return HeadTookOver(rng.randrange(4), node, bytes([rng.randrange(256)]), rng.randrange(200))
    if kind == 9:
        # Operator events: moves between the file's nodes, rebalances, rarely a drain.
        pick = rng.random()
        if pick < 0.6:
            return MoveReplica(rng.randrange(5), other, rng.choice(NODES))
        if pick < 0.9:
            return Rebalance()
        return Drain(node)
    pick = rng.random()
    if pick < 0.1:
        return RemoveNode(node)
    if pick < 0.3:
        return DiskFull(node)
    if pick < 0.6:
        # Proof of death, naming the incarnation heard, another (stale) or none.
        incarnation = rng.choice(["", f"{0:016x}", f"{1:016x}"])
        return NodeGone(node, now_ms, rng.choice(["refused", "stopped", "exited"]), incarnation)
    return ManagerLeaderChanged(now_ms)


def seed() -> int:
    value = int(os.environ.get("KAYOS_MANAGER_SEED", random.randrange(2**32)))
    print(f"KAYOS_MANAGER_SEED={value}")
    return value


@pytest.mark.parametrize("run_index", range(5))
def test_random_logs_keep_the_invariants_and_members_agree(run_index: int) -> None:
    """Three members apply the same log; one of them restarts from a snapshot (the encoded view)
    every so often. After every entry all three hold the same view and made the same decisions,
    and the invariants hold (epochs only rise, by one per change; no chain empties)."""
    random_log(random.Random(seed() + run_index), fresh())


@pytest.mark.parametrize("run_index", range(4))
def test_random_logs_with_a_short_grace_restore_and_keep_the_invariants(run_index: int) -> None:
    """As above with a 3 s grace, so shards short past it are copied to new members (rule 10)
    all through the log: at most ``manager_restores_max`` at once, no chain past the factor."""
    first = ManagerView.bootstrap(Config(replace_after_ms=3_000), NODES, CHAINS)
    random_log(random.Random(seed() + 1_000 + run_index), first)


def random_log(rng: random.Random, first: ManagerView) -> None:
    """Three members apply the same 400 random events from ``first``; see the test above."""
    members = [first, first, first]
    now = 0
    for _ in range(400):
        now += rng.randrange(0, 1_500)
        event = random_event(rng, now, members[0])
        if rng.random() < 0.05:
            members[2] = ManagerView.from_data(json.loads(json.dumps(members[2].to_data())))
        results = [decide(member, event) for member in members]
        check_invariants(members[0], results[0][0])
        assert all(result == results[0] for result in results), event
        members = [view for view, _ in results]
        assert len({view_hash(view) for view in members}) == 1


@pytest.mark.parametrize(
    "bad",
    [
        Heartbeat("a", -1),
        Heartbeat("", 0),
        TimerTick(-5),
        TimerTick(5, (("a", -1),)),
        TimerTick(5, (("a\n", 1),)),
        LatencyReport("a", "b", -1, 10_000),
        LatencyReport("a", "b", 100, 0),
        HeadTookOver(0, "a", b"", 0),
        HeadTookOver(0, "a", bytes(17), 0),
        HeadTookOver(0, "a", b"\xaa", -1),
        NodeReturned("a", 0, (ShardReport(0, -1, ()),)),
        NodeReturned("a", 0, (ShardReport(0, 1, ((b"\xaa", -3),)),)),
        NodeReturned("a", 0, (ShardReport(0, 1, ((b"\xaa", 0),) * 65),)),
        ManagerLeaderChanged(-1),
        RemoveNode("x" * 200),
        NodeGone("a", -1, "refused", ""),
        NodeGone("a", 0, "vanished", ""),
        NodeGone("a", 0, "refused", "ABCDEF0123456789"),
        NodeGone("a", 0, "refused", "0123"),
        TimerTick(5, (("a", 1),), (("a", "zz"),)),
    ],
)
def test_check_event_refuses_malformed_events(bad: Event) -> None:
    with pytest.raises(InvalidRequest):
        check_event(bad)


def test_check_event_passes_well_formed_ones_and_decide_ignores_unknown_names() -> None:
    """Unknown nodes and shards are stale, not malformed: the view and its hash do not move."""
    for event in GOLDEN_EVENTS:
        assert check_event(event) is event
    view = fresh()
    for stale in [Heartbeat("zz", 1), CatchUpDone("a", 99, 1), HeadTookOver(7, "a", b"\x01", 0)]:
        assert decide(view, check_event(stale)) == (view, [])


def _older(view: ManagerView, fmt: int) -> dict[str, object]:
    """``view`` dumped as a member of view format ``fmt`` wrote it: format 2 (catch-up order
    numbers) lacks moves, draining and added nodes; format 1 lacks the order numbers too; format 3
    lacks only the queues' shard counts."""
    data = json.loads(json.dumps(view.to_data()))
    data["format"] = fmt
    data["nodes"] = [node[:3] for node in data["nodes"]]
    if fmt == 5:
        return data  # type: ignore[no-any-return]
    del data["queues"]
    if fmt == 3:
        return data  # type: ignore[no-any-return]
    for shard in data["shards"]:
        del shard["moves"]
        if fmt == 1:
            del shard["orders"]
    del data["draining"], data["added"]
    if fmt == 1:
        del data["orders_issued"]
    return data  # type: ignore[no-any-return]


def test_format_1_2_and_3_snapshots_still_read() -> None:
    """A member upgraded to view format 4 starts from a format-1, 2 or 3 dump and holds the same
    view: no moves, no draining nodes, no added addresses (1, 2), no queue shard counts."""
    assert ManagerView.from_data(_older(fresh(), 1)) == fresh()
    assert ManagerView.from_data(_older(fresh(), 2)) == fresh()
    returned = run(fresh(), [*HEAL_EVENTS, NodeReturned("a", 7_000, ())])
    assert returned.orders_issued > 0
    assert ManagerView.from_data(_older(returned, 2)) == returned
    assert ManagerView.from_data(_older(returned, 3)) == returned, "format 3: no queues"


def test_a_format_5_snapshot_reads_with_no_incarnations() -> None:
    heard = run(fresh(), [TimerTick(100, (("a", 100),), (("a", "00000000000000a1"),))])
    assert [n.incarnation for n in heard.nodes] == ["00000000000000a1", "", "", ""]
    read = ManagerView.from_data(_older(heard, 5))
    assert [n.incarnation for n in read.nodes] == ["", "", "", ""]
    assert read == run(fresh(), [TimerTick(100, (("a", 100),))])


def test_a_format_1_snapshot_numbers_its_catching_up_nodes() -> None:
    """Format 1 had no order numbers: each catching-up node is numbered on reading, shard by
    shard, so its CatchUpDone (which must name an order) can still rejoin it."""
    returned = run(fresh(), [*HEAL_EVENTS, NodeReturned("a", 7_000, ())])
    read = ManagerView.from_data(_older(returned, 1))
    catching = [(s.id, n) for s in read.shards for n in s.catching_up]
    assert catching, "the returned node catches up somewhere"
    numbers = [read.shards[shard].order_of(node) for shard, node in catching]
    assert numbers == list(range(1, len(catching) + 1))
    assert read.orders_issued == len(catching)
    shard, node = catching[0]
    after, actions = decide(read, CatchUpDone(node, shard, 1))
    assert node in after.shards[shard].chain
    assert any(type(a).__name__ == "RejoinAsTail" for a in actions)
