"""The cluster manager's pure decision core (docs/manager.md).

``decide(view, event) -> (view, actions)`` is the whole of the manager's logic: the view is the
only state, so any member that applied the same events holds the same view (equal ``view_hash``)
and makes the same decisions. Nothing here does I/O, reads a clock or draws randomness; the
replicated log (pysyncobj, next) and the drivers that carry actions to nodes are separate.
Not wired to any running process yet.
"""

from __future__ import annotations

from kayos.manager.decide import decide
from kayos.manager.events import (
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
    NodeReturned,
    OperatorEvent,
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
from kayos.manager.placement import plan_rebalance
from kayos.manager.view import (
    AlertKey,
    Config,
    ManagerView,
    NodeAddress,
    NodeView,
    ShardView,
    view_hash,
)

__all__ = [
    "Action",
    "AddNode",
    "Alert",
    "AlertKey",
    "CatchUpDone",
    "ClearAlert",
    "Config",
    "DiskFull",
    "Drain",
    "Event",
    "HeadTookOver",
    "Heartbeat",
    "LatencyReport",
    "ManagerLeaderChanged",
    "ManagerView",
    "MoveReplica",
    "NodeAddress",
    "NodeReturned",
    "NodeView",
    "OperatorEvent",
    "PublishTopology",
    "Rebalance",
    "RejoinAsTail",
    "RemoveNode",
    "SetQueueShards",
    "ShardReport",
    "ShardView",
    "SpliceChain",
    "StartCatchUp",
    "TimerTick",
    "check_event",
    "decide",
    "plan_rebalance",
    "view_hash",
]
