"""Pure replication decisions, and the small records a replica keeps beside its store.

``chain`` (commit progress, divergence, the takeover table, a link's flow-control window),
``lease`` (a node's read lease from the manager), ``pacing`` (the copy pacer's rule), ``latency``
(delay windows to a neighbour), ``followers`` (counted catch-up followers), ``durablemark`` and
``timeindex`` (files beside the store, read and written whole). Each decides from its inputs:
times come in as arguments. Floor 1: imports only the ground modules, the topology and each
other; no event loop, no sockets. The manager's core and the simulator import ``chain``.
"""

from __future__ import annotations
