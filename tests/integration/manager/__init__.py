"""Real manager members beside real nodes: failover, healing, slow nodes, moves, leases, write
holds."""
