"""Bytes this process copied to replicas of its own, by how (docs/replication-protocol.md,
"Store snapshots": "Reported"): ``file`` counts the bytes of store files received by snapshot,
``log`` the payload bytes of entries a link applied below the target its ``SUBSCRIBED`` named
(catch-up: a learner's, a returning member's, a repairing head's). A node serves them as
``kayos_copy_bytes_total{mode}``; one node runs per process."""

from __future__ import annotations

import collections

COPY_MODES = ("file", "log")

copied_bytes: collections.Counter[str] = collections.Counter(dict.fromkeys(COPY_MODES, 0))
