"""The cluster manager (docs/manager.md): its pure decision core here, its Raft member beside.

``decide(view, event) -> (view, actions)`` is the whole of the manager's logic: the view is the
only state, so any member that applied the same events holds the same view (equal ``view_hash``)
and makes the same decisions. The modules here (``decide``, ``events``, ``placement``,
``view``) do no I/O, read no clock and draw no randomness (tests/unit/house/test_layering.py
holds them to it).

``member/`` runs the core: the replicated log (pysyncobj), the leader's driver that carries
actions to nodes, and the members' HTTP face, wired into the ``kayos manager`` process. Importing
this package imports the core, which it re-exports below; it imports nothing of ``member/``.
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
    NodeGone,
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
    check_incarnation,
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
    "NodeGone",
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
    "check_incarnation",
    "decide",
    "plan_rebalance",
    "view_hash",
]
