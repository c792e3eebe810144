"""The asyncio links between nodes.

The stream layer: ``stream`` (frames over an asyncio stream pair, wake-ups, error frames),
``handshake`` (both halves of link authentication), ``liveness`` (pings and link health) and
``pacer`` (paces a copy's work against live traffic). The link sides, which drive a
``kayos.replication.shard.replica.ShardReplica``: ``upstream`` (``UpstreamLink``, following an
upstream), ``downstream`` (``serve_downstream``, feeding a downstream) with its ``sender``, and
``snapshot_link`` (a learner fetching a store snapshot).
"""

from __future__ import annotations
