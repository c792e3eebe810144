"""Disks on real nodes: compaction, retention (and its soak), a full disk at the head and below
it."""
