"""The campaigns' fault kinds, their deterministic parts (chaos/procs/): the seeded schedule, what
each kind draws and judges from canned views and status replies, the network kinds, the fault
proxy's stop. Fast; no cluster is started (one drain test stands in a sleeping child for a node)."""
