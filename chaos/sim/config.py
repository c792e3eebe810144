"""The simulator's knobs: one ``SimConfig`` per run (docs/testing.md, "The simulator")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimConfig:
    """The model's knobs (docs/testing.md, "The simulator"). Times are simulated milliseconds,
    scaled down from the real bounds (peer silence 3 s, detection 6 s) by ten, keeping their
    ratios, so a run covers many detections and rejoins in few events."""

    nodes: int = 3
    shards: int = 2
    fault_phase_ms: float = 4_000
    heal_ms: float = 8_000
    fault_gap_ms: tuple[float, float] = (80, 400)
    hold_ms: tuple[float, float] = (0, 1_500)
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
    peer_silence_ms: float = 300
    heartbeat_ms: float = 100
    tick_ms: float = 100
    detection_window_ms: int = 600
    suspect_after_ms: int = 300
    min_replicas: int = 2
    # The head lease (limits.head_lease_ms scaled like the rest: a third of the window).
    lease_ms: float = 200
    # Consumers learn a new chain this long after the manager publishes it (real clients learn
    # it from a wrong_role answer or their next refresh): a snapshot may go to a spliced tail.
    client_topology_lag_ms: float = 200
