"""Kayos: a fault-tolerant, durable, de-duplicating message queue cluster."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
