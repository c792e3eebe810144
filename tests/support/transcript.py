"""A small command language for manager transcripts (etcd raft's interaction tests are the model).

A transcript file opens with comment lines stating its intent, then blocks of::

    # optional comments
    command arg key=value ...
    ----
    expected output

separated by blank lines. Times are seconds (``t=4.0``); p99 is milliseconds. Every step also
checks the invariants: epochs never go back and rise by exactly one with any chain change or added
node, no chain is empty, and the view survives its canonical encoding with the same hash. With
``KAYOS_REWRITE=1`` the expected outputs are regenerated from what the code does.

Commands (one per line in a block):

- ``config min= detect= suspect= slow-p99= slow-window= [grace= rf=]`` (before the layout;
  ``grace``: ``replace_after_ms`` in seconds, ``rf``: the replication factor; shown when given)
- ``add-nodes a b c``; then ``shards N replicas R`` (rotated: shard i starts at node i) or
  ``chains a>b b>c>d`` (one chain per shard)
- ``heartbeat a b t=``; ``tick t= [heard=a@1.5,b@1.7] [inc=a:<16 hex>,b:<16 hex>]`` (the nodes'
  incarnations heard, shown in the view as ``a=up:<incarnation>``)
- ``gone NODE t= cause=refused|stopped|exited [inc=<16 hex>]`` (NodeGone: proof of death)
- ``latency reporter= node= p99= window=``
- ``takeover shard= node= id=<hex> seq=``
- ``return NODE t= [report=SHARD:LAST:ID@SEQ,ID@SEQ ...]``; ``catch-up-done NODE shard= [order=N]``
  (without ``order``: the order the node follows now)
- ``leader-change t=`` (the new leader starts from a copy of the view decoded from its encoding)
- ``remove-node NODE``, ``disk-full NODE`` (the node reports its disk full), ``hash``.
- ``add-node NODE [host= http= bin=]``, ``move shard= from= to=``, ``drain NODE``, ``rebalance``.
- ``queue-shards QUEUE shards=S`` (``kayos ctl queue create/alter``).
- ``restore-status`` (what ``kayos ctl status`` shows of rule 10: replacements and short shards).

Besides the invariants above, every step checks that no chain got shorter unless some node went
down, slow, full or removed in that step (``replica_count``): moves, drains and rebalances never
take a shard below the replica count it had.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kayos import limits
from kayos.manager import (
    Action,
    AddNode,
    Alert,
    CatchUpDone,
    ClearAlert,
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
    PublishTopology,
    Rebalance,
    RejoinAsTail,
    RemoveNode,
    SetQueueShards,
    ShardReport,
    ShardView,
    SpliceChain,
    StartCatchUp,
    TimerTick,
    decide,
    view_hash,
)
from kayos.manager.restore import restore_status
from kayos.manager.view import derive_alerts, replicas_of

SEPARATOR = "----"


@dataclass
class Block:
    comments: list[str]
    command: str
    expected: list[str]


@dataclass
class Transcript:
    intent: list[str]
    blocks: list[Block]

    def render(self, outputs: list[list[str]]) -> str:
        parts = ["\n".join(self.intent)]
        for block, output in zip(self.blocks, outputs, strict=True):
            parts.append("\n".join([*block.comments, block.command, SEPARATOR, *output]))
        return "\n\n".join(parts) + "\n"


def parse(text: str) -> Transcript:
    chunks = [chunk.strip("\n") for chunk in text.strip("\n").split("\n\n")]
    intent = chunks[0].splitlines()
    assert intent, "open with a statement of intent"
    assert all(line.startswith("#") for line in intent), "open with a statement of intent"
    blocks = []
    for chunk in chunks[1:]:
        lines = chunk.splitlines()
        comments = [line for line in lines if line.startswith("#")]
        rest = [line for line in lines if not line.startswith("#")]
        assert len(rest) >= 2, f"bad block: {chunk!r}"
        assert rest[1] == SEPARATOR, f"bad block: {chunk!r}"
        blocks.append(Block(comments, rest[0], rest[2:]))
    return Transcript(intent, blocks)


def _ms(seconds: str) -> int:
    return round(float(seconds) * 1000)


def _secs(ms: int) -> str:
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"


def _table(text: str) -> tuple[tuple[bytes, int], ...]:
    entries = []
    for item in text.split(",") if text else ():
        uuid, seq = item.split("@")
        entries.append((bytes.fromhex(uuid), int(seq)))
    return tuple(entries)


def format_action(action: Action) -> str:
    if isinstance(action, SpliceChain):
        return f"splice shard={action.shard} chain={'>'.join(action.chain)} epoch={action.epoch}"
    if isinstance(action, StartCatchUp):
        rollback = "none" if action.rollback_to is None else str(action.rollback_to)
        return (
            f"start-catch-up {action.node} shard={action.shard} upstream={action.upstream}"
            f" rollback-to={rollback} order={action.order}"
        )
    if isinstance(action, RejoinAsTail):
        return f"rejoin-as-tail {action.node} shard={action.shard} epoch={action.epoch}"
    if isinstance(action, Alert | ClearAlert):
        verb = "alert" if isinstance(action, Alert) else "clear-alert"
        node = f" node={action.node}" if action.node else ""
        return f"{verb} {action.kind} shard={action.shard}{node}"
    assert isinstance(action, PublishTopology)
    return f"publish-topology epoch={action.epoch}"


def format_view(view: ManagerView) -> list[str]:
    lines = [f"view epoch={view.epoch} now={_secs(view.now_ms)}"]
    lines.append(
        "  nodes: "
        + " ".join(
            f"{n.id}={n.state}" + (f":{n.incarnation}" if n.incarnation else "") for n in view.nodes
        )
    )
    for shard in view.shards:
        line = f"  shard {shard.id}: {'>'.join(shard.chain)} epoch={shard.epoch}"
        if shard.departed:
            line += f" departed={','.join(shard.departed)}"
        if shard.catching_up:
            line += f" catching-up={','.join(shard.catching_up)}"
        if shard.moves:
            line += " moving=" + ",".join(f"{src}->{dst}" for dst, src in shard.moves)
        if shard.orders:
            line += " orders=" + ",".join(f"{n}#{o}" for n, o in shard.orders)
        if shard.restoring:
            line += " restoring=" + ",".join(f"{n}@{_secs(at)}" for n, at in shard.restoring)
        if shard.takeover:
            line += " takeover=" + ",".join(f"{u.hex()}@{s}" for u, s in shard.takeover)
        lines.append(line)
    alerts = [
        f"{a.kind}(shard={a.shard}{',node=' + a.node if a.node else ''})" for a in view.alerts
    ]
    if view.draining:
        lines.append("  draining: " + " ".join(view.draining))
    if view.queues:
        lines.append("  queues: " + " ".join(f"{q}={count}" for q, count in view.queues))
    lines.append("  alerts: " + (" ".join(alerts) if alerts else "none"))
    return lines


@dataclass
class Interpreter:
    config: Config = field(default_factory=Config)
    node_ids: list[str] = field(default_factory=list)
    view: ManagerView | None = None

    def run(self, command: str) -> list[str]:
        words = command.split()
        name, args = words[0], words[1:]
        keys = dict(arg.split("=", 1) for arg in args if "=" in arg)
        positional = [arg for arg in args if "=" not in arg]
        reports = [arg.split("=", 1)[1] for arg in args if arg.startswith("report=")]
        if name == "config":
            assert self.view is None, "config comes before shards"
            self.config = Config(
                detection_window_ms=_ms(
                    keys.get("detect", str(self.config.detection_window_ms / 1000))
                ),
                suspect_after_ms=_ms(keys.get("suspect", str(self.config.suspect_after_ms / 1000))),
                slow_p99_ms=int(keys.get("slow-p99", self.config.slow_p99_ms)),
                slow_window_ms=_ms(keys.get("slow-window", str(self.config.slow_window_ms / 1000))),
                min_replicas=int(keys.get("min", self.config.min_replicas)),
                replace_after_ms=_ms(keys.get("grace", str(self.config.replace_after_ms / 1000))),
                replication_factor=int(keys.get("rf", self.config.replication_factor)),
            ).validate()
            c = self.config
            restore = ""
            if "grace" in keys or "rf" in keys:
                restore = f" grace={_secs(c.replace_after_ms)} rf={c.replication_factor}"
            return [
                f"config detect={_secs(c.detection_window_ms)} suspect={_secs(c.suspect_after_ms)}"
                f" slow-p99={c.slow_p99_ms}ms slow-window={_secs(c.slow_window_ms)}"
                f" min={c.min_replicas}{restore}"
            ]
        if name == "add-nodes":
            self.node_ids += positional
            return ["nodes " + " ".join(self.node_ids)]
        if name == "shards":
            count, replicas = int(positional[0]), int(keys.get("replicas", positional[-1]))
            if len(positional) == 3:  # `shards 3 replicas 3`
                replicas = int(positional[2])
            ids = self.node_ids
            chains = [tuple(ids[(i + k) % len(ids)] for k in range(replicas)) for i in range(count)]
            self.view = ManagerView.bootstrap(self.config, ids, chains)
            return format_view(self.view)
        if name == "chains":
            self.view = ManagerView.bootstrap(
                self.config, self.node_ids, [tuple(chain.split(">")) for chain in positional]
            )
            return format_view(self.view)
        if name == "hash":
            return [view_hash(self._view())]
        if name == "restore-status":
            status = restore_status(self._view())
            lines = [f"  restoring {json.dumps(r, sort_keys=True)}" for r in status["restoring"]]
            lines += [f"  short {json.dumps(r, sort_keys=True)}" for r in status["short"]]
            return ["restore:"] + (lines or ["  nothing short"])
        events: list[Event]
        if name == "heartbeat":
            events = [Heartbeat(node, _ms(keys["t"])) for node in positional]
        elif name == "tick":
            heard = tuple(
                (node, _ms(at))
                for node, at in (
                    item.split("@") for item in keys.get("heard", "").split(",") if item
                )
            )
            incarnations = tuple(
                (node, incarnation)
                for node, incarnation in (
                    item.split(":") for item in keys.get("inc", "").split(",") if item
                )
            )
            events = [TimerTick(_ms(keys["t"]), heard, incarnations)]
        elif name == "gone":
            events = [NodeGone(positional[0], _ms(keys["t"]), keys["cause"], keys.get("inc", ""))]
        elif name == "latency":
            events = [
                LatencyReport(keys["reporter"], keys["node"], int(keys["p99"]), _ms(keys["window"]))
            ]
        elif name == "takeover":
            events = [
                HeadTookOver(
                    int(keys["shard"]), keys["node"], bytes.fromhex(keys["id"]), int(keys["seq"])
                )
            ]
        elif name == "return":
            parsed = []
            for report in reports:
                shard, last, table = report.split(":")
                parsed.append(ShardReport(int(shard), int(last), _table(table)))
            events = [NodeReturned(positional[0], _ms(keys["t"]), tuple(parsed))]
        elif name == "catch-up-done":
            # Without order=: the order the node follows now (a report answering it).
            current = self._view().shard(int(keys["shard"]))
            order = current.order_of(positional[0]) if current is not None else None
            events = [
                CatchUpDone(positional[0], int(keys["shard"]), int(keys.get("order", order or 1)))
            ]
        elif name == "leader-change":
            # The new leader is a member that holds only the replicated view: start it from a
            # copy decoded from the canonical encoding.
            copy = ManagerView.from_data(json.loads(json.dumps(self._view().to_data())))
            assert copy == self._view()
            assert view_hash(copy) == view_hash(self._view())
            self.view = copy
            events = [ManagerLeaderChanged(_ms(keys["t"]))]
        elif name == "remove-node":
            events = [RemoveNode(node) for node in positional]
        elif name == "disk-full":
            events = [DiskFull(node) for node in positional]
        elif name == "add-node":
            events = [
                AddNode(
                    positional[0],
                    keys.get("host", "127.0.0.1"),
                    int(keys.get("http", "7000")),
                    int(keys.get("bin", "7001")),
                )
            ]
        elif name == "move":
            events = [MoveReplica(int(keys["shard"]), keys["from"], keys["to"])]
        elif name == "drain":
            events = [Drain(node) for node in positional]
        elif name == "rebalance":
            events = [Rebalance()]
        elif name == "queue-shards":
            events = [SetQueueShards(positional[0], int(keys["shards"]))]
        else:
            raise AssertionError(f"unknown command {name!r}")
        actions: list[Action] = []
        for event in events:
            actions += self._step(event)
        out = ["actions:"] + [f"  {format_action(a)}" for a in actions]
        if not actions:
            out = ["actions: none"]
        return out + format_view(self._view())

    def _view(self) -> ManagerView:
        assert self.view is not None, "`shards` first"
        return self.view

    def _step(self, event: Event) -> list[Action]:
        before = self._view()
        after, actions = decide(before, event)
        check_invariants(before, after)
        again, same = decide(before, event)
        assert (again, same) == (after, actions), "decide is not a function of (view, event)"
        self.view = after
        return actions


def replica_count(shard: ShardView) -> int:
    """The shard's replica count: its chain's length, less the one extra member a move holds
    between its target joining and its source leaving."""
    extra = any(t in shard.chain and s in shard.chain for t, s in shard.moves)
    return len(shard.chain) - int(extra)


def check_invariants(before: ManagerView, after: ManagerView) -> None:
    changed = [a.chain != b.chain for a, b in zip(after.shards, before.shards, strict=True)]
    if any(changed) or after.added != before.added or after.queues != before.queues:
        assert after.epoch == before.epoch + 1, "a chain, added node or queue change: new epoch"
    else:
        assert after.epoch == before.epoch, "no chain or queue change, no new epoch"
    counts = dict(before.queues)
    for queue, count in after.queues:
        assert count >= counts.get(queue, 1), f"queue {queue}: shard count went down"
        assert 1 <= count <= len(after.shards), f"queue {queue}: {count} shards"
    was = {node.id: node.state for node in before.nodes}
    lost = [
        n.id
        for n in after.nodes
        if n.state in ("down", "slow", "full", "removed") and was.get(n.id) != n.state
    ]
    now = {node.id: node.state for node in after.nodes}
    for shard, old in zip(after.shards, before.shards, strict=True):
        # A full member may leave when its shard's head stops being full (rule 9), a step in
        # which its own state does not change.
        full_left = [n for n in old.chain if n not in shard.chain and now.get(n) == "full"]
        if not lost and not full_left:
            assert replica_count(shard) >= replica_count(old), f"shrank: {old} -> {shard}"
        assert shard.chain, f"shard {shard.id} lost its last member"
        assert shard.epoch >= old.epoch
        assert len(set(shard.chain)) == len(shard.chain)
        states = {node.id: node.state for node in after.nodes}
        if len(shard.chain) > 1:
            # Rule 9: a full node stays only as head, or below a full head (which refuses writes).
            below = ("up", "suspect", "slow", "full") if states[shard.chain[0]] == "full" else ()
            assert all(states[n] in ("up", "suspect", "slow", *below) for n in shard.chain[1:])
            assert states[shard.chain[0]] in ("up", "suspect", "slow", "full"), shard
        targets = {target for target, _ in (*shard.moves, *shard.restoring)}
        assert len(shard.restoring) <= 1, shard
        assert set(shard.catching_up) <= set(shard.departed) | targets, shard
        assert len(shard.moves) <= 1, shard
        assert all(states[n] == "up" for n in shard.catching_up), shard
        assert not set(shard.departed) & set(shard.chain), shard
        # Every catching-up node (returned or a move target) follows exactly one numbered order.
        assert sorted(n for n, _ in shard.orders) == sorted(shard.catching_up), shard
        assert all(0 < o <= after.orders_issued for _, o in shard.orders), shard
    assert after.orders_issued >= before.orders_issued
    # Rule 10: at most manager_restores_max replacements run at once, each to a node that held
    # no replica of its shard, and no shard grows past the replication factor.
    assert sum(1 for s in after.shards if s.restoring) <= limits.manager_restores_max
    for shard, old in zip(after.shards, before.shards, strict=True):
        for target, _ in shard.restoring:
            assert target not in shard.chain, shard
            assert target not in old.chain, shard
        assert replicas_of(shard) <= max(replicas_of(old), after.config.replication_factor), shard
    assert after.alerts == derive_alerts(after)
    decoded = ManagerView.from_data(json.loads(json.dumps(after.to_data())))
    assert decoded == after
    assert view_hash(decoded) == view_hash(after)


def run_file(path: Path) -> tuple[str, str]:
    """(expected text, actual text) of one transcript file."""
    text = path.read_text()
    transcript = parse(text)
    interpreter = Interpreter()
    outputs = [interpreter.run(block.command) for block in transcript.blocks]
    return text, transcript.render(outputs)


__all__ = ["Interpreter", "check_invariants", "parse", "run_file"]
