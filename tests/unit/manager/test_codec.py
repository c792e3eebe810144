"""Log entries of the manager's Raft adapter (kayos/manager/member/codec.py): every event survives
its encoding; anything malformed is refused with InvalidRequest before it reaches decide."""

from __future__ import annotations

import json

import pytest

from kayos.errors import InvalidRequest
from kayos.manager import (
    AddNode,
    CatchUpDone,
    Drain,
    Event,
    HeadTookOver,
    Heartbeat,
    LatencyReport,
    ManagerLeaderChanged,
    MoveReplica,
    NodeGone,
    NodeReturned,
    Rebalance,
    RemoveNode,
    SetQueueShards,
    ShardReport,
    TimerTick,
)
from kayos.manager.member.codec import ENTRY_VERSION, decode_entry, encode_entry

pytestmark = pytest.mark.unit

EVENTS: list[Event] = [
    Heartbeat("a", 5),
    TimerTick(100, (("a", 90), ("b", 95))),
    TimerTick(100),
    LatencyReport("a", "b", 300, 6_000),
    HeadTookOver(0, "a", bytes(range(16)), 42),
    NodeReturned("b", 7, (ShardReport(0, 41, ((b"\x01" * 16, 3),)), ShardReport(1, 0, ()))),
    CatchUpDone("b", 2, 7),
    ManagerLeaderChanged(9),
    RemoveNode("c"),
    AddNode("d", "127.0.0.1", 7404, 7504),
    MoveReplica(0, "a", "d"),
    Drain("a"),
    Rebalance(),
    SetQueueShards("orders", 3),
    TimerTick(110, (("a", 105),), (("a", "00000000000000a2"),)),
    NodeGone("a", 120, "refused", "00000000000000a2"),
    NodeGone("b", 121, "exited", ""),
]


def test_a_tick_without_incarnations_keeps_its_encoding() -> None:
    """Entries logged before incarnations existed decode as they did, and a tick that names none
    is written as before (its ``inc`` key left out)."""
    body = json.loads(encode_entry([TimerTick(100, (("a", 90),))]))
    assert body["events"] == [["tick", {"now_ms": 100, "heard": [["a", 90]]}]]
    body = json.loads(encode_entry([NodeGone("a", 7, "stopped", "00000000000000a1")]))
    fields = {"node": "a", "at_ms": 7, "cause": "stopped", "incarnation": "00000000000000a1"}
    assert body["events"] == [["node_gone", fields]]


def test_every_event_survives_its_encoding_in_order() -> None:
    assert decode_entry(encode_entry(EVENTS)) == EVENTS


def test_an_entry_is_plain_json_with_a_version() -> None:
    body = json.loads(encode_entry([RemoveNode("c")]))
    assert body == {"v": ENTRY_VERSION, "events": [["remove_node", {"node": "c"}]]}


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        json.dumps({"v": ENTRY_VERSION + 1, "events": [["remove_node", {"node": "c"}]]}).encode(),
        json.dumps({"v": ENTRY_VERSION, "events": []}).encode(),
        json.dumps({"v": ENTRY_VERSION, "events": [["nonsense", {}]]}).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["node_gone", {"node": "a", "at_ms": 1}]]}
        ).encode(),
        json.dumps(
            {
                "v": ENTRY_VERSION,
                "events": [
                    ["node_gone", {"node": "a", "at_ms": 1, "cause": "x", "incarnation": ""}]
                ],
            }
        ).encode(),
        json.dumps(
            {
                "v": ENTRY_VERSION,
                "events": [["tick", {"now_ms": 1, "heard": [], "inc": [["a", "nothex"]]}]],
            }
        ).encode(),
        json.dumps({"v": ENTRY_VERSION, "events": [["remove_node", {}]]}).encode(),
        json.dumps({"v": ENTRY_VERSION, "events": [["remove_node", {"node": ""}]]}).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["heartbeat", {"node": "a", "at_ms": -1}]]}
        ).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["heartbeat", {"node": "a", "at_ms": 1.5}]]}
        ).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["heartbeat", {"node": "a", "at_ms": True}]]}
        ).encode(),
        json.dumps(
            {
                "v": ENTRY_VERSION,
                "events": [["took_over", {"shard": 0, "node": "a", "master_id": "zz", "seq": 1}]],
            }
        ).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["tick", {"now_ms": 1, "heard": [["a"]]}]]}
        ).encode(),
        json.dumps({"v": ENTRY_VERSION, "events": ["tick"]}).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["queue_shards", {"queue": "a/b", "shards": 2}]]}
        ).encode(),
        json.dumps(
            {"v": ENTRY_VERSION, "events": [["queue_shards", {"queue": "q", "shards": 0}]]}
        ).encode(),
    ],
)
def test_a_malformed_entry_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_entry(raw)


def test_a_malformed_event_cannot_be_encoded() -> None:
    with pytest.raises(InvalidRequest):
        encode_entry([Heartbeat("a", -1)])
    with pytest.raises(InvalidRequest):
        encode_entry([])
