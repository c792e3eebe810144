"""The simulator's knobs: one ``SimConfig`` per run (docs/testing.md, "The simulator")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimConfig:
    """The model's knobs (docs/testing.md, "The simulator"). Times are simulated milliseconds,
    the failover bounds the real ones (docs/manager.md, "Bounds"): a 700 ms detection window, a
    350 ms lease, a 100 ms poll, a 500 ms link silence bound."""

    nodes: int = 3
    shards: int = 2
    fault_phase_ms: float = 4_000
    heal_ms: float = 8_000
    fault_gap_ms: tuple[float, float] = (80, 400)
    hold_ms: tuple[float, float] = (0, 1_500)
    # The share of partitions of kind ``reject`` (a firewall's resets); the rest are ``drop``.
    reject_share: float = 0.5
    produce_gap_ms: tuple[float, float] = (8, 40)
    consume_gap_ms: tuple[float, float] = (20, 120)
    client_timeout_ms: float = 400
    keys_per_queue: int = 6
    txn_share: float = 0.2
    delete_share: float = 0.05
    groups: tuple[str, ...] = ("g1", "g2")
    delay_ms: tuple[float, float] = (0.1, 2.0)
    slow_delay_ms: float = 20.0
    slow_share: float = 0.005
    datagram_loss: float = 0.01
    sync_ms: tuple[float, float] = (0.3, 6.0)
    slow_sync_ms: tuple[float, float] = (20.0, 200.0)
    peer_silence_ms: float = 500
    heartbeat_ms: float = 100
    tick_ms: float = 100
    detection_window_ms: int = 700
    suspect_after_ms: int = 350
    min_replicas: int = 2
    # The head lease (limits.head_lease_ms: half the window).
    lease_ms: float = 350
    # The manager's evidence (chaos/sim/evidence.py): a beat on each watch this often (a reject
    # partition resets the watch within one), a node probed at most once per interval, a probe
    # unanswered this long (a paused node, a drop partition) proving nothing.
    watch_beat_ms: float = 100
    probe_interval_ms_min: float = 50
    probe_timeout_ms: float = 300
    # Consumers learn a new chain this long after the manager publishes it (real clients learn
    # it from a wrong_role answer or their next refresh): a snapshot may go to a spliced tail.
    client_topology_lag_ms: float = 200
    # The idempotent producers (chaos/sim/client.py): how many, each one call at a time; a
    # request that heard nothing this long is given up and re-sent; a refused one is re-sent
    # after a pause in this range; a call unanswered this long after it began is unknown.
    producers: int = 3
    client_silence_ms: float = 700
    retry_ms: tuple[float, float] = (10, 50)
    produce_budget_ms: float = 2_000
    # The head's producer window (chaos/sim/producers.py): entries per producer per shard.
    producer_window_entries: int = 64
