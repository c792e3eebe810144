"""Kestrel keeps every time in milliseconds: ``now_ms`` reads them from an injected ``Clock``."""

from __future__ import annotations

from kayos.clock import Clock


def now_ms(clock: Clock) -> int:
    """The clock's current Unix time in whole milliseconds."""
    return int(clock.now_s() * 1000)
