"""One shard's replica on this node: ``replica.ShardReplica`` and the seams it is split along.

``replica`` (state and commit progress), ``head_writes`` (the head's write pipeline and the timed
store commits), ``catchup`` (rollbacks, resets, counted learners), ``persist`` (what it writes
down of its progress), ``visibility`` (what consumers may see, and waiting for it), ``recent``
(accepted batches kept for the links), ``local_meta`` (its own keys in the store's metadata),
``lostcommit`` (a head that lost committed entries steps down to repair) and ``snapshot`` (store
snapshots). Imports the pure ``logic/`` and ``wire/`` rooms, the store, and the stream layer of
``link/``; never the link sides, which import it.
"""

from __future__ import annotations
