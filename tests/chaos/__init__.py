"""The chaos tier: the checker, the deterministic simulator, and the campaigns' fault kinds, from
their pure parts to short real-process campaigns."""
