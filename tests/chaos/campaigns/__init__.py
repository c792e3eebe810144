"""Real-process campaigns (chaos/procs/): short seeded campaigns that must end with no violation,
and the network tools they use against real traffic (the fault proxy with toxiproxy-python,
network namespaces, root only). Slow: `pytest tests/chaos --ignore=tests/chaos/campaigns` leaves
them out."""
