"""How soon a shard writes again after its head dies, in the simulator (docs/testing.md, "The
simulator"; docs/campaigns.md, "What the head lease cost"): a kill -9 is spliced out at once (the
manager's probe is refused), and the new head holds only for what is left of the dead head's lease,
since a refusal does not prove the process gone. Measured from the kill to the first acknowledgement
of a call made after it, as ``kayos bench failover`` measures ``writes_resume_s``."""

from __future__ import annotations

import statistics

import pytest

from chaos.history import Produce
from chaos.sim import SimConfig
from chaos.sim.run import Fault, Sim

pytestmark = pytest.mark.chaos

SEEDS = range(10)
KILL_MS = 1_000.0


def resume_ms(seed: int, plant: str | None, kind: str = "kill") -> float:
    """Milliseconds from striking shard 0's head to the first acknowledged call on shard 0 that
    the client made after the strike."""
    sim = Sim(seed, SimConfig(), plant)
    for node in sim.nodes.values():
        node.start()
    sim.client.start()
    sim.world.run_until(KILL_MS)
    head = sim.manager.view.shards[0].chain[0]
    after = sim.client.last_tick
    sim.inject(Fault(KILL_MS, kind, head, hold_ms=10_000, cut="reject"))
    sim.world.run_until(KILL_MS + 3_000)
    acks = [
        e.at_s * 1_000 - KILL_MS
        for e in sim.client.events
        if isinstance(e, Produce) and e.queue == "q0" and e.outcome == "ok" and e.invoked > after
    ]
    assert acks, f"seed {seed}: shard 0 never wrote again"
    return min(acks)


def test_a_killed_heads_shard_writes_again_once_its_lease_is_over() -> None:
    config = SimConfig()
    kept = [resume_ms(seed, None) for seed in SEEDS]
    voided = [resume_ms(seed, "refused_skips_hold") for seed in SEEDS]
    print(
        f"seeds {SEEDS.start}..{SEEDS.stop - 1}, kill -9 of the head, ms to the first ack:"
        f" hold kept median {statistics.median(kept):.0f} worst {max(kept):.0f};"
        f" lease voided median {statistics.median(voided):.0f} worst {max(voided):.0f}"
    )
    # The splice is at once; what remains is the lease's end (granted every tick) and a resend.
    assert max(kept) < config.lease_ms + config.tick_ms
    assert statistics.median(voided) < statistics.median(kept)
