"""A replica's life on real nodes: self-repair from peers, stores cut short, learners, store
snapshots, topology changes under load."""
