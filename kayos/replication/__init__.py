"""Chain replication: the wire protocol between chain members and the client hot path.

``frames`` is the sans-IO codec and the module every other one imports frames from (the declared
frame table is ``frame_table``, its field types ``frame_fields``); ``docs/replication-protocol.md``
is the protocol's normative description.
"""

from __future__ import annotations
