"""The deterministic cluster simulator (docs/testing.md, "The simulator"): the real chain and
manager decisions over a simulated network, disk and clock, one seed per run."""

from chaos.sim.config import SimConfig
from chaos.sim.node import PLANTS
from chaos.sim.run import FAULT_KINDS, Report, Summary, run_seed, run_seeds, schedule

__all__ = [
    "FAULT_KINDS",
    "PLANTS",
    "Report",
    "SimConfig",
    "Summary",
    "run_seed",
    "run_seeds",
    "schedule",
]
