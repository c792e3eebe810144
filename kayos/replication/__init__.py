"""Chain replication: the wire protocol between chain members, and one node's shard replicas.

Four rooms, lowest first (``docs/replication-protocol.md`` is the protocol's normative text):

- ``wire/``: the frames byte for byte (``frames`` is the sans-IO codec every other module imports
  frames from; ``frame_table`` declares them, ``frame_fields`` their field types) and the pure
  checks of link authentication (``auth``). No I/O.
- ``logic/``: the pure decisions a replica is driven by (the chain's commit progress and takeover
  table, leases, the copy pacer, latency windows) and the small records it keeps beside its store
  (durable mark, time index). No event loop, no sockets.
- ``shard/``: one shard's replica on this node (``ShardReplica``): its store, progress, head
  writes, catch-up and store snapshots.
- ``link/``: the asyncio links between nodes: frames over a stream, the handshake, liveness, and
  both sides of a replication link and of a snapshot link.

``wire/`` and ``logic/`` import nothing from ``shard/`` or ``link/``. ``shard/`` builds on the
stream layer of ``link/`` (``stream``, ``liveness``, ``pacer``); the link sides (``upstream``,
``downstream``, ``sender``, ``snapshot_link``) drive a ``ShardReplica``.
"""

from __future__ import annotations
