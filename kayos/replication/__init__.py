"""Chain replication: the wire protocol between chain members and the client hot path.

``frames`` is the declared frame table and its sans-IO codec; ``docs/replication-protocol.md`` is
the protocol's normative description.
"""

from __future__ import annotations
