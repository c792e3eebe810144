"""Replication links: liveness, the handshake against hostile peers, a learner's first report."""
