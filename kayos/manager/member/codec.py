"""The encoding of Raft log entries and of actions: plain JSON, never pickled objects of ours.

A log entry is a batch of events (one poll round's, or one operator request), encoded as
``{"v": 1, "events": [[kind, {fields}], ...]}``. Decoding checks every field's type and every
event with ``check_event``; anything else is an ``InvalidRequest``. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kayos import limits
from kayos.errors import InvalidRequest
from kayos.manager import (
    Action,
    AddNode,
    Alert,
    CatchUpDone,
    ClearAlert,
    DiskFull,
    Drain,
    Event,
    HeadTookOver,
    Heartbeat,
    LatencyReport,
    ManagerLeaderChanged,
    MoveReplica,
    NodeGone,
    NodeReturned,
    PublishTopology,
    Rebalance,
    RejoinAsTail,
    RemoveNode,
    SetQueueShards,
    ShardReport,
    SpliceChain,
    StartCatchUp,
    TimerTick,
    check_event,
)

ENTRY_VERSION = 2  # 2: caught_up names its catch-up order
ENTRY_EVENTS_MAX = limits.manager_entry_events_max


def _int(value: Any) -> int:
    if type(value) is not int:
        raise InvalidRequest(f"expected an integer, got {value!r:.40}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"expected a string, got {value!r:.40}")
    return value


def _takeover(value: Any) -> tuple[tuple[bytes, int], ...]:
    try:
        return tuple((bytes.fromhex(_str(m)), _int(s)) for m, s in value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"bad takeover table: {exc}") from exc


def event_to_data(event: Event) -> list[Any]:
    if isinstance(event, Heartbeat):
        return ["heartbeat", {"node": event.node, "at_ms": event.at_ms}]
    if isinstance(event, TimerTick):
        tick: dict[str, Any] = {"now_ms": event.now_ms, "heard": [list(h) for h in event.heard]}
        if event.incarnations:  # only when some: a tick without keeps the bytes it had
            tick["inc"] = [list(pair) for pair in event.incarnations]
        return ["tick", tick]
    if isinstance(event, NodeGone):
        fields = {"node": event.node, "at_ms": event.at_ms, "cause": event.cause}
        return ["node_gone", {**fields, "incarnation": event.incarnation}]
    if isinstance(event, LatencyReport):
        fields = {"reporter": event.reporter, "node": event.node}
        return ["latency", {**fields, "p99_ms": event.p99_ms, "window_ms": event.window_ms}]
    if isinstance(event, HeadTookOver):
        return [
            "took_over",
            {
                "shard": event.shard,
                "node": event.node,
                "master_id": event.master_id.hex(),
                "seq": event.seq,
            },
        ]
    if isinstance(event, NodeReturned):
        reports = [
            {
                "shard": r.shard,
                "last_seq": r.last_seq,
                "takeover": [[m.hex(), s] for m, s in r.takeover],
            }
            for r in event.reports
        ]
        return ["returned", {"node": event.node, "at_ms": event.at_ms, "reports": reports}]
    if isinstance(event, DiskFull):
        return ["disk_full", {"node": event.node}]
    if isinstance(event, CatchUpDone):
        return ["caught_up", {"node": event.node, "shard": event.shard, "order": event.order}]
    if isinstance(event, ManagerLeaderChanged):
        return ["leader_changed", {"at_ms": event.at_ms}]
    if isinstance(event, AddNode):
        address = {"host": event.host, "http_port": event.http_port, "bin_port": event.bin_port}
        return ["add_node", {"node": event.node, **address}]
    if isinstance(event, MoveReplica):
        return ["move", {"shard": event.shard, "source": event.source, "target": event.target}]
    if isinstance(event, Drain):
        return ["drain", {"node": event.node}]
    if isinstance(event, Rebalance):
        return ["rebalance", {}]
    if isinstance(event, SetQueueShards):
        return ["queue_shards", {"queue": event.queue, "shards": event.shards}]
    return ["remove_node", {"node": event.node}]


def event_from_data(data: Any) -> Event:
    try:
        kind, f = data
        if not isinstance(f, dict):
            raise InvalidRequest("an event's fields are an object")
        event: Event
        if kind == "heartbeat":
            event = Heartbeat(_str(f["node"]), _int(f["at_ms"]))
        elif kind == "tick":
            heard = tuple((_str(n), _int(a)) for n, a in f["heard"])
            incarnations = tuple((_str(n), _str(i)) for n, i in f.get("inc", ()))
            event = TimerTick(_int(f["now_ms"]), heard, incarnations)
        elif kind == "node_gone":
            event = NodeGone(
                _str(f["node"]), _int(f["at_ms"]), _str(f["cause"]), _str(f["incarnation"])
            )
        elif kind == "latency":
            event = LatencyReport(
                _str(f["reporter"]), _str(f["node"]), _int(f["p99_ms"]), _int(f["window_ms"])
            )
        elif kind == "took_over":
            master = bytes.fromhex(_str(f["master_id"]))
            event = HeadTookOver(_int(f["shard"]), _str(f["node"]), master, _int(f["seq"]))
        elif kind == "returned":
            reports = tuple(
                ShardReport(_int(r["shard"]), _int(r["last_seq"]), _takeover(r["takeover"]))
                for r in f["reports"]
            )
            event = NodeReturned(_str(f["node"]), _int(f["at_ms"]), reports)
        elif kind == "disk_full":
            event = DiskFull(_str(f["node"]))
        elif kind == "caught_up":
            event = CatchUpDone(_str(f["node"]), _int(f["shard"]), _int(f["order"]))
        elif kind == "leader_changed":
            event = ManagerLeaderChanged(_int(f["at_ms"]))
        elif kind == "remove_node":
            event = RemoveNode(_str(f["node"]))
        elif kind == "add_node":
            event = AddNode(
                _str(f["node"]), _str(f["host"]), _int(f["http_port"]), _int(f["bin_port"])
            )
        elif kind == "move":
            event = MoveReplica(_int(f["shard"]), _str(f["source"]), _str(f["target"]))
        elif kind == "drain":
            event = Drain(_str(f["node"]))
        elif kind == "rebalance":
            event = Rebalance()
        elif kind == "queue_shards":
            event = SetQueueShards(_str(f["queue"]), _int(f["shards"]))
        else:
            raise InvalidRequest(f"unknown event kind {kind!r:.40}")
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"bad event: {exc!r:.200}") from exc
    return check_event(event)


def encode_entry(events: Sequence[Event]) -> bytes:
    """One log entry: checked events, in order."""
    if not 0 < len(events) <= ENTRY_EVENTS_MAX:
        raise InvalidRequest(f"an entry holds 1 to {ENTRY_EVENTS_MAX} events")
    body = {"v": ENTRY_VERSION, "events": [event_to_data(check_event(e)) for e in events]}
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_entry(raw: bytes) -> list[Event]:
    try:
        body = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"undecodable log entry: {exc}") from exc
    if not isinstance(body, dict) or body.get("v") != ENTRY_VERSION:
        raise InvalidRequest("log entry of an unknown version")
    events = body.get("events")
    if not isinstance(events, list) or not 0 < len(events) <= ENTRY_EVENTS_MAX:
        raise InvalidRequest(f"an entry holds 1 to {ENTRY_EVENTS_MAX} events")
    return [event_from_data(e) for e in events]


def action_to_data(action: Action) -> dict[str, Any]:
    """An action as plain data, for logs and the driver's record."""
    if isinstance(action, SpliceChain):
        return {
            "kind": "splice",
            "shard": action.shard,
            "chain": list(action.chain),
            "epoch": action.epoch,
        }
    if isinstance(action, StartCatchUp):
        return {
            "kind": "catch_up",
            "node": action.node,
            "shard": action.shard,
            "upstream": action.upstream,
            "rollback_to": action.rollback_to,
            "order": action.order,
        }
    if isinstance(action, RejoinAsTail):
        return {"kind": "rejoin", "node": action.node, "shard": action.shard, "epoch": action.epoch}
    if isinstance(action, Alert | ClearAlert):
        kind = "alert" if isinstance(action, Alert) else "clear_alert"
        return {"kind": kind, "alert": action.kind, "shard": action.shard, "node": action.node}
    assert isinstance(action, PublishTopology)
    return {"kind": "publish", "epoch": action.epoch}
