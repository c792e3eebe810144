"""The pure decisions of replication: chain progress, pacing, followers, leases, learners, marks."""
