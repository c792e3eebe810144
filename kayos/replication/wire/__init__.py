"""The replication wire: every frame byte for byte, and the pure checks of link authentication.

``frames`` is the sans-IO codec (encode, ``FrameDecoder``) and the module the rest of the code
imports frames from; ``frame_table`` declares the frames and ``frame_fields`` their field types;
``auth`` holds the link handshake's MAC inputs and checks. Floor 1: imports only the ground
modules, the topology and the cluster identity; no I/O, no event loop.
"""

from __future__ import annotations
