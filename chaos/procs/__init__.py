"""Fault campaigns against real ``kayos node`` processes on loopback (docs/testing.md)."""
