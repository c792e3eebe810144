"""The unit tier: pure and in-process tests, no process started (in-process nodes on loopback
sockets are fine). `make test-fast` runs it; sub-packages by component."""
