"""Helpers for the tests of client credentials and roles (docs/security.md)."""
