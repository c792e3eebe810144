"""Operator commands and benchmarks as their own processes: `kayos ctl ...`, `kayos bench ...`."""
