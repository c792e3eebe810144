"""Chains of in-process nodes on loopback: forwarding, forward-then-persist, catch-up, a full
disk at the head, chains of one."""
