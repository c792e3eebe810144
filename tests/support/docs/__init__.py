"""Helpers for tests that read or run the project's documentation pages."""
